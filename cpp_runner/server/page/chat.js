// Chat: a conversation with one adapter, the foundation alone, or a mix of adapters (the request's
// "lora" scales, on "base"). Every turn sends the whole conversation; the server continues it in the
// KV slot that holds its start, so a long conversation is not read again at each turn.

import { finishLabel, formatRate, streamChat, tokensPerSecond } from "./api.js";
import { el, formatCount, paintAdapter } from "./dom.js";
import { requestFields, withSystem } from "./settings.js";
import { currentModels } from "./state.js";

const $ = (id) => document.getElementById(id);
const MIX = "\u0000mix"; // the select's value for a mix: no adapter can be called this
const scales = new Map(); // the mix's scale per adapter (0: left out)
let history = []; // {role, content}: what the next request sends after the system message
let controller = null;

export function renderTargets(models) {
  const select = $("chat-target");
  const previous = select.value;
  select.replaceChildren(
    ...models.map((name) => el("option", { value: name }, name === "base" ? "base (the foundation alone)" : name)),
    el("option", { value: MIX }, "a mix of adapters…"),
  );
  // Keep the choice while its adapter is served; otherwise the first adapter.
  select.value = previous && [...models, MIX].includes(previous) ? previous : (models[0] ?? MIX);
  $("mix").hidden = select.value !== MIX;
  renderMix(models.filter((name) => name !== "base"));
}

function renderMix(adapters) {
  for (const name of [...scales.keys()]) if (!adapters.includes(name)) scales.delete(name);
  $("mix-sliders").replaceChildren(
    ...adapters.map((name) => {
      const value = scales.get(name) ?? 0;
      const slider = el("input", { type: "range", min: "-1", max: "2", step: "0.05", value: String(value) });
      const number = el("input", { type: "number", step: "0.05", value: String(value), "aria-label": `${name} scale` });
      const set = (v) => {
        scales.set(name, v);
        slider.value = String(v);
        number.value = String(v);
        renderMixSummary();
      };
      slider.addEventListener("input", () => set(Number(slider.value)));
      number.addEventListener("change", () => set(Number.isFinite(Number(number.value)) ? Number(number.value) : 0));
      return paintAdapter(
        el(
          "div",
          { class: "mix-row", dataset: { adapter: name } },
          el("span", { class: "swatch" }),
          el("span", { class: "mix-name" }, name),
          slider,
          number,
        ),
        name,
      );
    }),
  );
  renderMixSummary();
}

// The mix's terms in the adapter list's order, those at 0 left out.
function mixTerms() {
  return currentModels()
    .filter((name) => (scales.get(name) ?? 0) !== 0)
    .map((name) => ({ name, scale: scales.get(name) }));
}

function mixLabel(terms) {
  return terms.length === 0 ? "base (all scales 0)" : terms.map((t) => `${t.name} × ${t.scale}`).join(" + ");
}

function renderMixSummary() {
  const terms = mixTerms();
  $("mix-summary").textContent = terms.length
    ? `Sends model "base" with lora: ${mixLabel(terms)}.`
    : 'Every scale is 0: sends model "base" alone.';
}

// What the request names: {model, lora?} and a label for the answer.
function target() {
  const value = $("chat-target").value;
  if (value !== MIX) return { fields: { model: value }, label: value, name: value };
  const terms = mixTerms();
  const fields = terms.length ? { model: "base", lora: terms } : { model: "base" };
  return { fields, label: mixLabel(terms), name: "base" };
}

function scrollToEnd() {
  const log = $("chat-log");
  log.scrollTop = log.scrollHeight;
}

function addMessage(role, text, label, name) {
  $("chat-empty").hidden = true;
  const bubble = el("div", { class: "bubble" }, text);
  const meta = el("div", { class: "meta" });
  const head = role === "assistant" ? el("div", { class: "msg-head" }, el("span", { class: "swatch" }), label) : null;
  const state = role === "assistant" ? "waiting" : "done";
  const node = el("div", { class: `msg ${role}`, dataset: { state } }, head, bubble, meta);
  if (role === "assistant") paintAdapter(node, name);
  $("chat-log").append(node);
  scrollToEnd();
  return { node, bubble, meta };
}

function describe(progress) {
  const rate = tokensPerSecond(progress);
  return [
    `${formatCount(progress.tokens)} tokens`,
    rate === null ? null : `${formatRate(rate)} tok/s`,
    progress.promptTokens === null ? null : `prompt ${formatCount(progress.promptTokens)} tokens`,
  ]
    .filter(Boolean)
    .join(" · ");
}

function busy(on) {
  $("chat-send").disabled = on;
  $("chat-stop").hidden = !on;
}

async function send(event) {
  event.preventDefault();
  if (controller) return;
  const text = $("chat-input").value;
  const fields = requestFields();
  if (!text.trim() || !fields) return;
  const who = target();
  history.push({ role: "user", content: text });
  const question = addMessage("user", text);
  $("chat-input").value = "";
  const answer = addMessage("assistant", "", who.label, who.name);
  controller = new AbortController();
  busy(true);
  try {
    const result = await streamChat(
      { ...who.fields, messages: withSystem(history), ...fields },
      (_, progress) => {
        answer.node.dataset.state = "streaming";
        answer.bubble.textContent = progress.text;
        answer.meta.textContent = describe(progress);
        scrollToEnd();
      },
      controller.signal,
    );
    answer.bubble.textContent = result.text;
    answer.meta.textContent = `${describe(result)} · ${finishLabel(result.finish)}`;
    answer.node.dataset.state = "done";
    history.push({ role: "assistant", content: result.text });
  } catch (error) {
    if (controller.signal.aborted) {
      // What was shown stays in the conversation, as the server's slot holds it.
      answer.node.dataset.state = "stopped";
      answer.meta.textContent = "stopped";
      if (answer.bubble.textContent) history.push({ role: "assistant", content: answer.bubble.textContent });
      else {
        history.pop();
        question.node.dataset.state = "unsent";
      }
    } else {
      // The turn did not happen: the message goes back into the box to try again.
      history.pop();
      question.node.dataset.state = "unsent";
      answer.node.dataset.state = "error";
      answer.bubble.replaceChildren(el("span", { class: "error-text" }, error.message));
      if (!$("chat-input").value) $("chat-input").value = text;
    }
  } finally {
    controller = null;
    busy(false);
  }
}

export function initChat() {
  $("chat-form").addEventListener("submit", send);
  $("chat-input").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      $("chat-form").requestSubmit();
    }
  });
  $("chat-stop").addEventListener("click", () => controller?.abort());
  $("chat-target").addEventListener("change", () => {
    $("mix").hidden = $("chat-target").value !== MIX;
  });
  $("mix-reset").addEventListener("click", () => {
    scales.clear();
    renderMix(currentModels().filter((name) => name !== "base"));
  });
  $("chat-new").addEventListener("click", () => {
    controller?.abort();
    history = [];
    $("chat-log").replaceChildren($("chat-empty"));
    $("chat-empty").hidden = false;
  });
}
