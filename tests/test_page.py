"""The server's own page (GET /), in a real browser: headless Chromium driven by selenium.

The references are independent of the page: its files as written in cpp_runner/server/page/ (what the
binary serves, byte for byte), /v1/models (what it must list), the API's own answer to the same
request (what Compare and Chat must show), /v1/stats (that Compare's requests ran in the same decode
steps, that a second turn continued in its slot). The browser's console log must hold no error, and
its performance log no request to another host.

The deployment is text_build's output folder plus two PEFT adapters of other ranks and targets (as
tests/test_adapter_mix.py's), whose mix fits the envelope's max rank: three adapters and base, served
with --parallel 4 so every column of Compare has a slot. The two have a large alpha: the tiny tied
foundation's greedy answer repeats the prompt's last token whatever a mild adapter adds (text_build's
own adapter and base answer the same), and the columns are to hold different answers.
"""

from __future__ import annotations

import http.client
import json
import shutil
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from conftest import REPO, TEXT_ADAPTER, run_cli
from hf_files import hf_config, write_peft_lora
from test_server import Server, server_bin  # noqa: F401 (a fixture)

PAGE = REPO / "cpp_runner" / "server" / "page"
CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
WAIT = 60  # seconds for anything the page shows
QUESTION = "Why is the sky blue?"
MAX_TOKENS = 24  # the tiny build's context is 64 tokens: the prompt and the answer fit in it
MIX = [("terse", 0.5), ("lively", 1.1)]  # ranks 3 + 1 on v_proj: the envelope's max rank, 4

# A browser to start and pages to wait on (about 3 minutes): make test runs it, make test-fast does not
# (and so does not need Chromium installed).
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def deployment(text_build, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("page") / "out"
    shutil.copytree(text_build.build.out_dir, out)
    cfg = hf_config(vocab=400)
    terse = write_peft_lora(out.parent / "terse", cfg, r=3, alpha=96, targets=["q_proj", "v_proj"], seed=11)
    lively = write_peft_lora(out.parent / "lively", cfg, r=1, alpha=64, targets=["v_proj", "down_proj"], seed=12)
    r = run_cli("add", "--to", out, f"terse={terse}", f"lively={lively}")
    assert r.returncode == 0, r.stderr
    return out


@pytest.fixture(scope="module")
def server(server_bin, deployment):  # noqa: F811 (server_bin is the imported fixture)
    s = Server(server_bin, deployment, "--parallel", 4)
    yield s
    s.stop()
    assert s.proc.returncode == 0


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """Headless Chromium (Debian's, installed by `make browser-deps`) with its console and network logged."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    assert CHROMIUM.exists() and CHROMEDRIVER.exists(), (
        "no Chromium: `make browser-deps` installs Debian's chromium and chromium-driver"
    )
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1400,900",
        f"--user-data-dir={tmp_path_factory.mktemp('chromium')}",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER)))
    driver.set_script_timeout(WAIT)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def page(browser, server):
    """The page open on the server, its adapter list shown."""
    browser.get(f"http://{server.address}/")
    wait_for(browser, lambda: listed(browser) == models(server), "the adapter list")
    return browser


def wait_for(driver, condition, what: str, timeout: float = WAIT):
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.1).until(lambda _: condition())
    except Exception as error:
        raise AssertionError(f"the page did not show {what} within {timeout} s") from error


def models(server: Server) -> list[str]:
    return [m["id"] for m in server.request("GET", "/v1/models")[1]["data"]]


def listed(driver) -> list[str]:
    """The adapters the page's sidebar lists, in its order."""
    return driver.execute_script(
        "return [...document.querySelectorAll('#adapter-list [data-adapter]')].map(e => e.dataset.adapter)"
    )


def raw_get(server: Server, path: str) -> tuple[int, dict, bytes]:
    """GET `path` sent as it is (no normalisation by a client library)."""
    conn = http.client.HTTPConnection(server.host, server.port, timeout=WAIT)
    conn.request("GET", path)
    resp = conn.getresponse()
    out = resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    conn.close()
    return out


def set_value(driver, element_id: str, value: str):
    """Types `value` into a field as a person does: cleared, then typed, so its input events fire."""
    field = driver.find_element("id", element_id)
    field.clear()
    field.send_keys(value)


def api_answer(server: Server, body: dict) -> str:
    status, out = server.request("POST", "/v1/chat/completions", body)
    assert status == 200, out
    return out["choices"][0]["message"]["content"]


def text_of(element) -> str:
    return element.get_attribute("textContent")


def console_errors(driver) -> list[dict]:
    return [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def requested_urls(driver) -> list[str]:
    """Every URL the browser requested since the last call (its performance log)."""
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def page_files() -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in PAGE.iterdir() if p.suffix in (".html", ".css", ".js", ".svg")}


def test_every_page_file_is_served_as_written(server):
    files = page_files()
    assert "index.html" in files and "main.js" in files
    status, headers, body = raw_get(server, "/")
    assert status == 200 and body == files["index.html"]
    assert headers["content-type"].startswith("text/html")
    policy = headers["content-security-policy"]
    assert "default-src 'none'" in policy and "script-src 'self'" in policy and "connect-src 'self'" in policy
    types = {".html": "text/html", ".css": "text/css", ".js": "text/javascript", ".svg": "image/svg+xml"}
    for name, content in files.items():
        status, headers, body = raw_get(server, f"/page/{name}")
        assert status == 200 and body == content, name
        assert headers["content-type"].startswith(types[Path(name).suffix]), (name, headers["content-type"])
        assert headers["x-content-type-options"] == "nosniff"


@pytest.mark.parametrize(
    "path",
    [
        "/page/../CMakeLists.txt",
        "/page/..%2fCMakeLists.txt",
        "/page/%2e%2e/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
        "/page/embed.cmake",  # beside the page's files, not one of them
        "/page/sub/main.js",
        "/page/",
        "/page/main.js/",
        "/index.html",
        "/../../etc/passwd",
    ],
)
def test_only_the_pages_own_files_are_served(server, path):
    status, headers, body = raw_get(server, path)
    assert status in (400, 404), (path, status, body[:200])
    assert headers["content-type"].startswith("application/json")
    assert json.loads(body)["error"]["message"]
    assert b"cmake_minimum_required" not in body and b"root:" not in body
    assert server.proc.poll() is None


def test_the_page_lists_every_adapter_and_follows_adds_and_removals(page, server, deployment):
    assert listed(page) == models(server) == [TEXT_ADAPTER, "terse", "lively", "base"]
    chips = page.execute_script(
        "return [...document.querySelectorAll('#compare-chips input')].map(e => [e.dataset.adapter, e.checked])"
    )
    assert chips == [[name, True] for name in models(server)]

    assert server.request("DELETE", "/v1/adapters/lively")[0] == 200
    wait_for(page, lambda: listed(page) == [TEXT_ADAPTER, "terse", "base"], "lively removed")
    status, _ = server.request("POST", "/v1/adapters", {"path": "lively.pte"})
    assert status == 201
    wait_for(page, lambda: listed(page) == models(server) == [TEXT_ADAPTER, "terse", "lively", "base"], "lively back")
    targets = page.execute_script("return [...document.querySelectorAll('#chat-target option')].map(e => e.value)")
    assert targets[:-1] == models(server)  # then the mix


def test_compare_shows_each_adapters_answer_from_one_batch(page, server):
    """Compare with the default temperature (0) and MAX_TOKENS: every adapter's column holds the API's
    answer to the same request, with its tokens/s, and the server ran them as rows of the same steps."""
    assert page.find_element("id", "temperature").get_attribute("value") == "0"
    assert page.find_element("id", "max-tokens").get_attribute("value") == "128"
    set_value(page, "max-tokens", str(MAX_TOKENS))
    set_value(page, "compare-question", QUESTION)
    page.get_log("browser")
    _, before = server.request("GET", "/v1/stats")
    button = page.find_element("id", "compare-button")
    assert button.text == "Compare"
    button.click()

    names = models(server)
    columns = lambda: page.find_elements("css selector", "#compare-columns .column")  # noqa: E731
    wait_for(
        page,
        lambda: len(columns()) == len(names) and all(c.get_attribute("data-state") == "done" for c in columns()),
        "every answer",
    )
    _, after = server.request("GET", "/v1/stats")

    shown = {c.get_attribute("data-adapter"): text_of(c.find_element("class name", "answer")) for c in columns()}
    tokens = {c.get_attribute("data-adapter"): int(c.get_attribute("data-tokens")) for c in columns()}
    assert list(shown) == names
    for name in names:
        body = {"model": name, "messages": [{"role": "user", "content": QUESTION}], "temperature": 0}
        status, out = server.request("POST", "/v1/chat/completions", {**body, "max_tokens": MAX_TOKENS})
        assert status == 200, out
        assert shown[name] == out["choices"][0]["message"]["content"] and shown[name], name
        assert tokens[name] == out["usage"]["completion_tokens"], name
    # Each column is its own adapter's: the strong adapters answer unlike each other and unlike base.
    assert len({shown["terse"], shown["lively"], shown["base"]}) == 3
    for column in columns():
        assert float(column.get_attribute("data-tokens-per-second")) > 0
        assert "tok/s" in text_of(column.find_element("class name", "meta"))

    steps = [a - b for a, b in zip(after["batch_size_counts"], before["batch_size_counts"])]
    assert after["parallel"] >= len(names)
    assert sum(steps[1:]) > 0, steps  # decode steps of more than one row
    # The page shows the same steps: its own /v1/stats before and after, with nothing else running.
    assert page.find_element("id", "compare-summary").is_displayed()
    bars = page.find_elements("css selector", "#compare-batches .bar")
    assert [int(bar.get_attribute("data-count")) for bar in bars] == steps
    assert console_errors(page) == []


def open_chat(page, target: str | None = None, index: int | None = None):
    from selenium.webdriver.support.ui import Select

    page.find_element("id", "tab-chat").click()
    page.find_element("id", "chat-new").click()
    select = Select(page.find_element("id", "chat-target"))
    if target is not None:
        select.select_by_value(target)
    else:
        select.select_by_index(index)


def chat_turn(page, text: str, turn: int) -> str:
    """Sends `text` from the page's message box; returns the answer shown once it is done."""
    set_value(page, "chat-input", text)
    page.find_element("id", "chat-send").click()
    answers = lambda: page.find_elements("css selector", "#chat-log .msg.assistant")  # noqa: E731
    wait_for(
        page, lambda: len(answers()) == turn + 1 and answers()[-1].get_attribute("data-state") == "done", "the answer"
    )
    return text_of(answers()[-1].find_element("class name", "bubble"))


def test_chat_continues_a_conversation_in_its_slot(page, server):
    """Two turns with one adapter: each answer is the API's to the whole conversation so far, and the
    second turn's prompt continued from the slot that held the first (a prefix hit of at least the first
    turn's prompt)."""
    open_chat(page, target="terse")
    set_value(page, "max-tokens", "4")  # both turns within the tiny build's context of 64
    conversation, first_prompt = [], 0
    for turn, question in enumerate(["Hi", "Go"]):
        _, before = server.request("GET", "/v1/stats")
        shown = chat_turn(page, question, turn)
        _, after = server.request("GET", "/v1/stats")
        conversation.append({"role": "user", "content": question})
        status, out = server.request(
            "POST",
            "/v1/chat/completions",
            {"model": "terse", "messages": conversation, "temperature": 0, "max_tokens": 4},
        )
        assert status == 200 and shown == out["choices"][0]["message"]["content"], turn
        conversation.append({"role": "assistant", "content": shown})
        if turn == 0:
            first_prompt = out["usage"]["prompt_tokens"]
        else:
            assert after["prefix_hits"] > before["prefix_hits"], (before, after)
            assert after["prefix_tokens"] - before["prefix_tokens"] >= first_prompt, (before, after)
    assert console_errors(page) == []


def test_chat_with_a_mix_and_a_system_message(page, server):
    """A mix built with the sliders' number boxes, under a system message: the answer is the API's for
    model "base" with the same "lora" terms and the system message first, which differs from base's."""
    open_chat(page, index=len(models(server)))  # the mix: listed after the adapters
    assert page.find_element("id", "mix").is_displayed()
    for name, scale in MIX:
        box = page.find_element("css selector", f'.mix-row[data-adapter="{name}"] input[type="number"]')
        box.clear()
        box.send_keys(str(scale), "\t")
    set_value(page, "max-tokens", "8")
    set_value(page, "system", "Be kind.")
    shown = chat_turn(page, "Hi!", 0)
    messages = [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Hi!"}]
    body = {"model": "base", "messages": messages, "temperature": 0, "max_tokens": 8}
    mixed = api_answer(server, {**body, "lora": [{"name": n, "scale": s} for n, s in MIX]})
    assert shown == mixed != api_answer(server, body)
    page.find_element("id", "system").clear()
    assert console_errors(page) == []


# Short enough for the tiny build's MAX_TOKENS (its tokens are about a character each).
SCHEMA = {"type": "object", "properties": {"m": {"enum": ["a", "b"]}}, "required": ["m"], "additionalProperties": False}


def test_a_json_schema_in_the_settings_shapes_every_compared_answer(page, server):
    """The settings' JSON-schema box: every Compare column holds JSON valid for the schema (judged by
    the jsonschema library), equal to the API's answer to the same strict json_schema request. Text
    that is not a JSON object is said under the settings, and nothing is sent."""
    import jsonschema

    set_value(page, "max-tokens", str(MAX_TOKENS))
    set_value(page, "json-schema", "{not json")
    assert "not JSON" in text_of(page.find_element("id", "settings-error"))
    set_value(page, "json-schema", json.dumps(SCHEMA))
    assert not page.find_element("id", "settings-error").is_displayed()
    page.find_element("id", "tab-compare").click()
    set_value(page, "compare-question", QUESTION)
    page.get_log("browser")
    page.find_element("id", "compare-button").click()
    names = models(server)
    columns = lambda: page.find_elements("css selector", "#compare-columns .column")  # noqa: E731
    wait_for(
        page,
        lambda: len(columns()) == len(names) and all(c.get_attribute("data-state") == "done" for c in columns()),
        "every answer",
    )
    response_format = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True}}
    for column in columns():
        name, shown = column.get_attribute("data-adapter"), text_of(column.find_element("class name", "answer"))
        jsonschema.validate(json.loads(shown), SCHEMA)
        body = {"model": name, "messages": [{"role": "user", "content": QUESTION}], "temperature": 0}
        assert shown == api_answer(server, {**body, "max_tokens": MAX_TOKENS, "response_format": response_format})
    set_value(page, "json-schema", " ")  # blank again (stored so), for the tests after this one
    assert console_errors(page) == []


def test_nothing_is_loaded_from_another_host(browser, server):
    browser.get_log("performance")
    browser.get(f"http://{server.address}/")
    wait_for(browser, lambda: listed(browser) == models(server), "the adapter list")
    time.sleep(1.5)  # a poll of /v1/models and /v1/stats after the first
    # Over the network (chrome:// pages of the browser's own start come from its binary).
    urls = [u for u in requested_urls(browser) if urlsplit(u).scheme in ("http", "https", "ws", "wss")]
    assert {urlsplit(u).netloc for u in urls} == {server.address}, urls
    paths = {urlsplit(u).path for u in urls}
    assert {"/", "/page/main.js", "/page/style.css", "/v1/models", "/v1/stats"} <= paths
    resources = browser.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    assert resources and all(urlsplit(u).netloc == server.address for u in resources), resources
    assert console_errors(browser) == []
