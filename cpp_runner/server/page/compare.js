// Compare: one question to every chosen adapter at once. Each answer streams into its own column with
// its speed; the server runs them as rows of the same decode steps, and the summary shows how many
// steps of each batch size ran meanwhile (the difference of /v1/stats before and after).

import { finishLabel, formatRate, getJson, streamChat, tokensPerSecond } from "./api.js";
import { el, formatCount, paintAdapter } from "./dom.js";
import { requestFields, withSystem } from "./settings.js";
import { currentModels } from "./state.js";
import { renderBatchBars } from "./status.js";

const $ = (id) => document.getElementById(id);
const excluded = new Set(); // unticked names: an adapter added while the page is open starts ticked
let controller = null;

function chosen() {
  return currentModels().filter((name) => !excluded.has(name));
}

export function renderChoices(models) {
  $("compare-chips").replaceChildren(
    ...models.map((name) => {
      const box = el("input", { type: "checkbox", checked: !excluded.has(name), dataset: { adapter: name } });
      box.addEventListener("change", () => (box.checked ? excluded.delete(name) : excluded.add(name)));
      return paintAdapter(el("label", { class: "chip" }, box, name), name);
    }),
  );
}

function column(name) {
  const answer = el("div", { class: "answer" });
  const meta = el("footer", { class: "meta" }, "waiting for a slot…");
  const pill = el("span", { class: "pill" }, "waiting");
  const node = paintAdapter(
    el(
      "article",
      { class: "column", dataset: { adapter: name, state: "waiting" } },
      el("header", {}, el("span", { class: "swatch" }), el("span", { class: "column-name" }, name), pill),
      answer,
      meta,
    ),
    name,
  );
  const setState = (state, label = state) => {
    node.dataset.state = state;
    pill.textContent = label;
  };
  return { node, answer, meta, setState };
}

// The column's footer: its speed first, then its tokens and the wait for the first one.
function describe(meta, progress) {
  const rate = tokensPerSecond(progress);
  const rest = [`${formatCount(progress.tokens)} tokens`];
  if (progress.firstAt !== null) {
    rest.push(`first after ${((progress.firstAt - progress.startAt) / 1000).toFixed(2)} s`);
  }
  if (progress.finish && !progress.text.trim()) rest.push("whitespace only");
  const speed = rate === null ? "– tok/s" : `${formatRate(rate)} tok/s`;
  meta.replaceChildren(el("strong", {}, speed), ` · ${rest.join(" · ")}`);
}

async function ask(name, messages, fields, col, signal) {
  try {
    const result = await streamChat(
      { model: name, messages, ...fields },
      (_, progress) => {
        if (col.node.dataset.state === "waiting") col.setState("streaming");
        col.answer.textContent = progress.text;
        describe(col.meta, progress);
      },
      signal,
    );
    col.answer.textContent = result.text;
    describe(col.meta, result);
    col.node.dataset.tokens = String(result.tokens);
    col.node.dataset.tokensPerSecond = String(tokensPerSecond(result) ?? "");
    col.setState("done", finishLabel(result.finish));
    return result;
  } catch (error) {
    if (signal.aborted) col.setState("stopped");
    else {
      col.setState("error");
      col.answer.replaceChildren(el("span", { class: "error-text" }, error.message));
    }
    return null;
  }
}

function summarize(results, seconds, before, after) {
  const done = results.filter(Boolean);
  const tokens = done.reduce((sum, r) => sum + r.tokens, 0);
  const figure = (value, label) => el("div", { class: "figure" }, el("div", { class: "figure-value" }, value), label);
  const text = el(
    "div",
    { class: "summary-figures" },
    figure(`${done.length} of ${results.length}`, "answers"),
    figure(`${seconds.toFixed(seconds < 10 ? 2 : 1)} s`, "for all of them"),
    figure(formatCount(tokens), "tokens"),
    figure(formatRate(tokens / seconds), "tok/s together"),
  );
  const parts = [text];
  if (before && after) {
    const counts = after.batch_size_counts.map((n, i) => n - (before.batch_size_counts[i] ?? 0));
    const widest = counts.reduce((top, n, i) => (n > 0 ? i + 1 : top), 0);
    text.append(figure(String(widest), "rows in one step, at most"));
    const bars = el("div", { class: "bars small", id: "compare-batches" });
    renderBatchBars(bars, counts);
    parts.push(
      el(
        "div",
        { class: "summary-batches" },
        el("div", { class: "summary-label" }, "Decode steps during this Compare, by rows per step"),
        bars,
      ),
    );
  }
  $("compare-summary").replaceChildren(...parts);
  $("compare-summary").hidden = false;
}

async function compare(event) {
  event.preventDefault();
  if (controller) return;
  const question = $("compare-question").value;
  const fields = requestFields();
  const names = chosen();
  if (!question.trim() || !fields) return;
  if (names.length === 0) {
    $("compare-columns").replaceChildren();
    $("compare-summary").hidden = true;
    $("compare-empty").textContent = "Tick at least one adapter to ask.";
    $("compare-empty").hidden = false;
    return;
  }
  controller = new AbortController();
  $("compare-button").disabled = true;
  $("compare-stop").hidden = false;
  $("compare-empty").hidden = true;
  $("compare-summary").hidden = true;
  const columns = names.map(column);
  $("compare-columns").replaceChildren(...columns.map((c) => c.node));
  const before = await getJson("/v1/stats").catch(() => null);
  const started = performance.now();
  const messages = withSystem([{ role: "user", content: question }]);
  const results = await Promise.all(names.map((name, i) => ask(name, messages, fields, columns[i], controller.signal)));
  const seconds = (performance.now() - started) / 1000;
  const after = await getJson("/v1/stats").catch(() => null);
  summarize(results, seconds, before, after);
  controller = null;
  $("compare-button").disabled = false;
  $("compare-stop").hidden = true;
}

export function initCompare() {
  $("compare-form").addEventListener("submit", compare);
  $("compare-question").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      $("compare-form").requestSubmit();
    }
  });
  $("compare-stop").addEventListener("click", () => controller?.abort());
  $("compare-all").addEventListener("click", () => {
    excluded.clear();
    renderChoices(currentModels());
  });
  $("compare-none").addEventListener("click", () => {
    for (const name of currentModels()) excluded.add(name);
    renderChoices(currentModels());
  });
}
