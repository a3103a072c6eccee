"""The C library (cpp_runner/include/lora_share.h) driven directly: from Python through ctypes
(lora_share/inference/c_library.py) and from C (examples/c_app, built with CMake against the installed package).

The reference is build/runner, an independent client of the same runtime over the command line: greedy
and seeded tokens must be equal. Every error path must come back as its ls_status and a message, with
the process alive and the runtime still serving.
"""

from __future__ import annotations

import ctypes
import re
import subprocess
from pathlib import Path

import pytest
from conftest import REPO, TINY_FOUNDATION

from lora_share.inference import c_abi
from lora_share.inference import c_library as native
from lora_share.inference.c_options import TokenInfo

PROMPT = [1, 17, 42]
LONG_PROMPT = list(range(1, 13))  # longer than the tiny build's prefill chunk (8): fed in two calls
NEW = 8
TIMEOUT = 300


@pytest.fixture(scope="module")
def library(runner_bin) -> Path:
    """build/liblora_share.so and its installed package, built by `make runner` when missing."""
    lib = REPO / "build" / "liblora_share.so"
    if not lib.exists() or not (REPO / "build/install/lib/cmake/lora_share/lora_shareConfig.cmake").exists():
        subprocess.run(["make", "-C", str(REPO), "runner"], check=True, capture_output=True)
    return lib


def runner_tokens(runner_bin, build, name, prompt, new=NEW, extra=()) -> list[int]:
    args = [str(runner_bin), "--ptd", str(build.ptd)]
    for pte in build.ptes.values():
        args += ["--pte", str(pte)]
    args += ["--adapter", name, "--tokens", ",".join(map(str, prompt)), "--max-new-tokens", str(new), *extra]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    return [int(t) for t in proc.stdout.split()]


@pytest.fixture(scope="module")
def runtime(library, tiny_build):
    """ls_open on the tiny foundation with every tiny adapter loaded."""
    rt = native.open(tiny_build.ptd, library=library)
    for pte in tiny_build.ptes.values():
        rt.load_adapter(pte)
    yield rt
    rt.close()


@pytest.mark.parametrize("prompt", [PROMPT, LONG_PROMPT], ids=["short", "chunked"])
def test_tokens_equal_the_runners(runtime, runner_bin, tiny_build, prompt):
    for name in tiny_build.ptes:
        assert runtime.generate(name, prompt, NEW) == runner_tokens(runner_bin, tiny_build, name, prompt), name


def test_sampled_tokens_equal_the_runners(runtime, runner_bin, tiny_build):
    name = next(iter(tiny_build.ptes))
    expected = runner_tokens(runner_bin, tiny_build, name, PROMPT, extra=["--temperature", "0.8", "--seed", "5"])
    assert runtime.generate(name, PROMPT, NEW, temperature=0.8, seed=5) == expected


def test_open_dir_serves_every_adapter_of_the_manifest(library, runner_bin, tiny_build):
    with native.open_dir(tiny_build.out_dir, library=library) as rt:
        assert rt.stats()["adapters_known"] == len(tiny_build.ptes)
        assert rt.stats()["adapters_resident"] == 0  # nothing is loaded before its first request
        for name in tiny_build.ptes:
            handle = rt.adapter(name)
            assert handle.name == name and not handle.resident
            assert rt.generate(handle, PROMPT, NEW) == runner_tokens(runner_bin, tiny_build, name, PROMPT)
            assert handle.resident
        assert rt.stats()["loads"] == len(tiny_build.ptes)


def test_callback_stops_generation(runtime, tiny_build):
    name = next(iter(tiny_build.ptes))
    full = runtime.generate(name, PROMPT, NEW)
    assert runtime.generate(name, PROMPT, NEW, stop_after=3) == full[:3]


def test_loading_a_known_path_again_returns_its_handle(runtime, tiny_build):
    pte = next(iter(tiny_build.ptes.values()))
    assert runtime.load_adapter(pte).handle == runtime.load_adapter(pte).handle


# --- errors: each a status and a message; the runtime keeps serving --------------------------------


def expect(status: str, fn, *args, contains: str = "", **kwargs) -> str:
    with pytest.raises(native.NativeError) as info:
        fn(*args, **kwargs)
    assert info.value.status == status, info.value
    assert contains in info.value.message, info.value.message
    assert info.value.message and "\n" not in info.value.message
    assert not re.search(r"(^| )--[a-z]", info.value.message), "name the library's parameters, not runner flags"
    return info.value.message


def test_request_errors(runtime, tiny_build):
    vocab, max_len = TINY_FOUNDATION["vocab_size"], 32  # tiny_build's vocabulary and context
    name = next(iter(tiny_build.ptes))
    expect("LS_ERR_REQUEST", runtime.generate, name, PROMPT, 0, contains="max_new_tokens must be at least 1")
    expect("LS_ERR_REQUEST", runtime.generate, name, PROMPT, 2**62, contains="context (max_seq_len)")
    expect("LS_ERR_REQUEST", runtime.generate, name, list(range(1, max_len + 2)), 1, contains="context (max_seq_len)")
    expect("LS_ERR_REQUEST", runtime.generate, name, [1, vocab], 1, contains="outside the vocabulary")
    expect("LS_ERR_REQUEST", runtime.generate, name, [-1], 1, contains="outside the vocabulary")
    expect("LS_ERR_REQUEST", runtime.generate, name, [], 1, contains="empty")
    expect("LS_ERR_ARGUMENT", runtime.generate, name, PROMPT, 1, temperature=-1.0)
    expect("LS_ERR_NOT_FOUND", runtime.generate, "no_such_adapter", PROMPT, 1, contains="tiny_a")
    expect("LS_ERR_NOT_FOUND", runtime.adapter, "no_such_adapter")
    # The longest request that fits still runs: the bound above is exact.
    assert len(runtime.generate(name, [1, 2, 3], max_len - 2)) == max_len - 2


def test_null_arguments(library, runtime):
    lib, err = runtime.lib, native._Error()
    e = ctypes.byref(err)
    assert lib.ls_open(None, None, e) is None and c_abi.STATUS_NAMES[err.code] == "LS_ERR_ARGUMENT"
    assert "ptd" in err.message.decode()
    assert lib.ls_open_dir(None, None, e) is None and err.code == 1
    assert lib.ls_load_adapter(None, b"x.pte", e) is None and err.code == 1
    assert lib.ls_load_adapter(runtime.handle, None, e) is None and err.code == 1
    assert lib.ls_adapter_by_name(runtime.handle, None, e) is None and err.code == 1
    ids = (ctypes.c_int64 * 1)(1)
    cb = native.TOKEN_CALLBACK(lambda t, u: 0)
    assert lib.ls_generate(None, None, ids, 1, None, cb, None, e) == 1
    adapter = runtime.adapter("tiny_a")
    assert lib.ls_generate(runtime.handle, adapter.handle, None, 3, None, cb, None, e) == 1
    assert lib.ls_generate_named(runtime.handle, None, ids, 1, None, cb, None, e) == 1
    assert lib.ls_stats(runtime.handle, None, e) == 1 and lib.ls_stats(None, None, e) == 1
    # A NULL error pointer is allowed: the status alone comes back.
    assert lib.ls_open(None, None, None) is None
    assert lib.ls_generate(None, None, ids, 1, None, cb, None, None) == 1
    # NULL options and a NULL callback mean defaults and "don't tell me each token".
    assert lib.ls_generate(runtime.handle, adapter.handle, ids, 1, None, native.TOKEN_CALLBACK(), None, e) == 0
    lib.ls_close(None)
    assert lib.ls_adapter_name(None) == b""


def test_calling_the_runtime_from_its_own_callback_is_refused(runtime):
    lib = runtime.lib
    seen = []

    def reenter(token, _user):
        stats, err = native._Stats(), native._Error()
        seen.append((lib.ls_stats(runtime.handle, ctypes.byref(stats), ctypes.byref(err)), err.message.decode()))
        return 1

    err = native._Error()
    ids = (ctypes.c_int64 * 3)(*PROMPT)
    assert (
        lib.ls_generate_named(
            runtime.handle, b"tiny_a", ids, 3, None, native.TOKEN_CALLBACK(reenter), None, ctypes.byref(err)
        )
        == 0
    )
    assert seen and seen[0][0] == c_abi.STATUS_NAMES.index("LS_ERR_BUSY") and "callback" in seen[0][1]


def test_threads_share_a_runtime_and_run_runtimes_side_by_side(library, runtime, tiny_build):
    """lora_share.h, THREADS: one runtime's calls are serialised by its lock (ctypes releases the GIL, so
    these calls really overlap), and two runtimes run at once; every answer is the sequential one."""
    from concurrent.futures import ThreadPoolExecutor

    names = list(tiny_build.ptes)
    expected = {name: runtime.generate(name, LONG_PROMPT, NEW) for name in names}
    with native.open(tiny_build.ptd, library=library) as second:
        for pte in tiny_build.ptes.values():
            second.load_adapter(pte)
        jobs = [(rt, name) for rt in (runtime, second) for name in names] * 3
        with ThreadPoolExecutor(max_workers=4) as pool:
            answers = list(pool.map(lambda job: job[0].generate(job[1], LONG_PROMPT, NEW), jobs))
    assert answers == [expected[name] for _, name in jobs]


def test_struct_layouts_match_the_library(library, tiny_build):
    """The ctypes mirrors have the C structs' sizes (ls_diag_sizeof, the compiler's sizeof), and the
    fields at their ends read what the library wrote there: ls_options_init's parallel = 1, ls_stats'
    parallel the slots asked for (a mirror shorter or shifted would read other bytes)."""
    lib = ctypes.CDLL(str(library))
    lib.ls_diag_sizeof.restype, lib.ls_diag_sizeof.argtypes = ctypes.c_size_t, [ctypes.c_char_p]
    for name, mirror in [
        ("ls_options", native._Options),
        ("ls_generate_options", c_abi.LsGenerateOptions),
        ("ls_runtime_stats", native._Stats),
        ("ls_error", native._Error),
        ("ls_token_info", TokenInfo),
    ]:
        assert lib.ls_diag_sizeof(name.encode()) == ctypes.sizeof(mirror), name
    assert lib.ls_diag_sizeof(b"ls_nothing") == 0
    opts = native._Options()
    native.load_library(library).ls_options_init(ctypes.byref(opts))
    assert opts.parallel == 1
    gen = c_abi.LsGenerateOptions()
    native.load_library(library).ls_generate_options_init(ctypes.byref(gen))
    assert (gen.cache_prompt, gen.n, gen.top_logprobs) == (1, 1, 0)
    with native.open_dir(tiny_build.out_dir, library=library) as rt:
        s = rt.stats()
    assert s["parallel"] == 1 and len(s["batch_size_counts"]) == c_abi.MAX_PARALLEL


@pytest.mark.parametrize(
    "field, value", [("parallel", 0), ("parallel", c_abi.MAX_PARALLEL + 1), ("speculation", -1), ("speculation", 3)]
)
def test_options_out_of_range_are_refused(library, tiny_build, field, value):
    expect(
        "LS_ERR_ARGUMENT",
        native.open_dir,
        tiny_build.out_dir,
        **{field: value},
        library=library,
        contains=f"ls_options.{field}",
    )


def test_a_speculation_mode_misspelt_is_refused(library, tiny_build):
    with pytest.raises(ValueError, match="every_draft"):
        native.open_dir(tiny_build.out_dir, speculation="every", library=library)


def test_an_adapter_of_another_runtime_is_refused(library, runtime, tiny_build):
    with native.open(tiny_build.ptd, library=library) as other:
        handle = other.load_adapter(tiny_build.ptes["tiny_a"])
        expect("LS_ERR_ARGUMENT", runtime.generate, handle, PROMPT, 1, contains="another runtime")


@pytest.mark.parametrize(
    "case", ["missing-pte", "ptd-as-pte", "truncated-pte", "garbage-pte", "other-foundation", "same-stem"]
)
def test_adapter_load_errors(runtime, tiny_build, text_build, tmp_path, case):
    pte = tiny_build.ptes["tiny_a"]
    contains = ""
    if case == "missing-pte":
        path, contains = tmp_path / "nope.pte", "nope.pte"
    elif case == "ptd-as-pte":
        path = tmp_path / "f.pte"
        path.write_bytes(tiny_build.ptd.read_bytes())
    elif case == "truncated-pte":
        path = tmp_path / "t.pte"
        path.write_bytes(pte.read_bytes()[: pte.stat().st_size // 2])
    elif case == "garbage-pte":
        path = tmp_path / "g.pte"
        path.write_bytes(b"\x00not a program" * 100)
    elif case == "other-foundation":
        # text_build's adapter: another foundation (a Hugging Face llama), a shared build of the session
        path, contains = text_build.pte, "ls_options.verify = 0 skips this check"
    else:  # a different file whose stem is taken
        path = tmp_path / "tiny_a.pte"
        path.write_bytes(pte.read_bytes())
        contains = "already loaded"
    expect("LS_ERR_LOAD", runtime.load_adapter, path, contains=contains)
    assert runtime.generate("tiny_a", PROMPT, 2)  # still serving


@pytest.mark.parametrize(
    "case", ["missing-ptd", "pte-as-ptd", "truncated-ptd", "no-manifest", "bad-manifest", "manifest-without-adapters"]
)
def test_open_errors(library, tiny_build, tmp_path, case):
    if case.startswith(("missing", "pte-as", "truncated")):
        ptd = {"missing-ptd": tmp_path / "nope.ptd", "pte-as-ptd": tiny_build.ptes["tiny_a"]}.get(case)
        if case == "truncated-ptd":
            ptd = tmp_path / "f.ptd"
            ptd.write_bytes(tiny_build.ptd.read_bytes()[:4096])
        expect("LS_ERR_LOAD", native.open, ptd, library=library, contains=str(ptd))
        return
    folder = tmp_path / "deploy"
    folder.mkdir()
    (folder / "foundation.ptd").write_bytes(tiny_build.ptd.read_bytes())
    if case == "bad-manifest":
        (folder / "manifest.json").write_text('{"foundation": {"file": "foundation.ptd"}, "adapters": [')
    elif case == "manifest-without-adapters":
        (folder / "manifest.json").write_text('{"foundation": {"file": "foundation.ptd"}, "adapters": []}')
    msg = expect("LS_ERR_LOAD", native.open_dir, folder, library=library)
    assert "manifest.json" in msg


@pytest.mark.parametrize("case", ["other-shapes", "without-named-weights", "without-xnnpack-weights", "empty"])
def test_a_damaged_foundation_is_a_load_error(library, tiny_build, tmp_path, case):
    """Foundations that pass ls_open's file checks and cannot serve the adapter (test_cpp_runner's variants):
    ls_load_adapter says why, the process lives on."""
    from test_cpp_runner import is_content_hash, rewrite_ptd

    keep = {
        "other-shapes": lambda k: True,
        "empty": lambda k: False,
        "without-named-weights": lambda k: is_content_hash(k) or k == "lora_share.foundation",
        "without-xnnpack-weights": lambda k: not is_content_hash(k),
    }[case]
    ptd = rewrite_ptd(tiny_build.ptd, tmp_path / "f.ptd", keep=keep, shrink=case == "other-shapes")
    with native.open(ptd, library=library) as rt:
        expect("LS_ERR_LOAD", rt.load_adapter, tiny_build.ptes["tiny_a"], contains=str(ptd))


def test_budget_below_one_adapter_is_refused(library, tiny_build):
    with native.open_dir(tiny_build.out_dir, library=library) as rt:
        s = rt.stats()
    too_small = s["foundation_bytes"] + s["program_bytes"] + s["arena_bytes"] + s["largest_adapter_bytes"] - 1
    expect(
        "LS_ERR_BUDGET",
        native.open_dir,
        tiny_build.out_dir,
        budget_bytes=too_small,
        library=library,
        contains="raise the budget",
    )
    with native.open(tiny_build.ptd, budget_bytes=s["foundation_bytes"] + 1, library=library) as rt:
        expect("LS_ERR_BUDGET", rt.load_adapter, tiny_build.ptes["tiny_a"], contains="raise the budget")


# --- the example application, from C ----------------------------------------------------------------


@pytest.fixture(scope="module")
def c_app(library, tmp_path_factory) -> Path:
    """examples/c_app configured with find_package(lora_share) against build/install and built."""
    build = tmp_path_factory.mktemp("c_app")
    for cmd in (
        [
            "cmake",
            "-S",
            str(REPO / "examples/c_app"),
            "-B",
            str(build),
            f"-DCMAKE_PREFIX_PATH={REPO / 'build/install'}",
        ],
        ["cmake", "--build", str(build)],
    ):
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return build / "c_app"


def test_c_app_tokens_equal_the_runners(c_app, runner_bin, tiny_build):
    for name, pte in tiny_build.ptes.items():
        proc = subprocess.run(
            [str(c_app), str(tiny_build.ptd), str(pte), "1,17,42", str(NEW)],
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
        assert proc.returncode == 0, proc.stderr
        assert [int(t) for t in proc.stdout.split()] == runner_tokens(runner_bin, tiny_build, name, PROMPT)
    # The folder form: the manifest's adapter by name.
    proc = subprocess.run(
        [str(c_app), "--dir", str(tiny_build.out_dir), "tiny_b", "1,17,42", str(NEW)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert proc.returncode == 0, proc.stderr
    assert [int(t) for t in proc.stdout.split()] == runner_tokens(runner_bin, tiny_build, "tiny_b", PROMPT)


def test_c_app_reports_errors_with_their_status(c_app, tiny_build, tmp_path):
    cases = [
        ([str(tiny_build.ptd), str(tmp_path / "nope.pte"), "1", "2"], "LS_ERR_LOAD"),
        ([str(tiny_build.ptd), str(tiny_build.ptes["tiny_a"]), "1", "0"], "LS_ERR_REQUEST"),
        (["--dir", str(tiny_build.out_dir), "nobody", "1", "2"], "LS_ERR_NOT_FOUND"),
    ]
    for args, status in cases:
        proc = subprocess.run([str(c_app), *args], capture_output=True, text=True, timeout=TIMEOUT)
        assert proc.returncode == 1, proc.stderr
        assert proc.stderr.startswith(f"error: {status}: "), proc.stderr


def test_removing_an_adapter_waits_for_its_request_in_flight(library, runner_bin, tiny_build):
    """ls_remove_adapter while a generation on that adapter runs (its callback pausing, so the removal is
    surely called mid-request): that generation finishes with every token of the runner's answer before the
    removal returns; afterwards the name and the handle are LS_ERR_NOT_FOUND, the others serve as before,
    and the name can be loaded again."""
    import threading
    import time

    names = list(tiny_build.ptes)
    name, other = names[0], names[1]
    expected = runner_tokens(runner_bin, tiny_build, name, PROMPT)
    with native.open(tiny_build.ptd, library=library) as rt:
        for pte in tiny_build.ptes.values():
            rt.load_adapter(pte)
        handle = rt.adapter(name)
        started, removed = threading.Event(), threading.Event()
        tokens, removed_during = [], []

        def on_token(token, _user):
            tokens.append(token)
            started.set()
            time.sleep(0.05)
            removed_during.append(removed.is_set())
            return 0

        def remove():
            started.wait(timeout=TIMEOUT)
            rt.remove_adapter(name)
            removed.set()

        remover = threading.Thread(target=remove)
        remover.start()
        err, ids = native._Error(), (ctypes.c_int64 * len(PROMPT))(*PROMPT)
        opts = native._generate_options(rt.lib, NEW, 0.0, 0, False)
        status = rt.lib.ls_generate(
            rt.handle,
            handle.handle,
            ids,
            len(PROMPT),
            ctypes.byref(opts),
            native.TOKEN_CALLBACK(on_token),
            None,
            ctypes.byref(err),
        )
        remover.join(timeout=TIMEOUT)
        assert status == 0, err.message
        assert tokens == expected and not any(removed_during) and removed.is_set()

        expect("LS_ERR_NOT_FOUND", rt.generate, name, PROMPT, 1, contains=other)
        expect("LS_ERR_NOT_FOUND", rt.generate, handle, PROMPT, 1, contains="removed")
        expect("LS_ERR_NOT_FOUND", rt.remove_adapter, name)
        assert not handle.resident and handle.name == name
        assert rt.stats()["adapters_known"] == len(names) - 1
        err = native._Error()
        listed = [
            native.Adapter(rt, rt.lib.ls_adapter_at(rt.handle, i, ctypes.byref(err))).name
            for i in range(len(names) - 1)
        ]
        assert listed == [n for n in names if n != name]
        assert rt.generate(other, PROMPT, NEW) == runner_tokens(runner_bin, tiny_build, other, PROMPT)
        again = rt.load_adapter(tiny_build.ptes[name])
        assert again.handle != handle.handle and rt.generate(again, PROMPT, NEW) == expected
