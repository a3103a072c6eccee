// The sidebar's adapter list, as /v1/models has it (updated while the page is open: adapters added
// with `lora-share add`, POST /v1/adapters or this form, and removed with DELETE), with a button to
// remove each and a form to serve one more.

import { sendJson } from "./api.js";
import { el, paintAdapter } from "./dom.js";
import { refreshModels } from "./state.js";

const $ = (id) => document.getElementById(id);

export function renderAdapters(models) {
  const adapters = models.filter((m) => m !== "base");
  $("adapter-count").textContent = String(adapters.length);
  $("adapter-list").replaceChildren(
    ...models.map((name) =>
      paintAdapter(
        el(
          "li",
          { class: "adapter", dataset: { adapter: name } },
          el("span", { class: "swatch" }),
          el("span", { class: "adapter-name" }, name),
          name === "base"
            ? el("span", { class: "adapter-note" }, "the foundation alone")
            : el(
                "button",
                {
                  type: "button",
                  class: "icon-button",
                  title: `Stop serving ${name} (DELETE /v1/adapters/${name})`,
                  "aria-label": `Remove ${name}`,
                  onclick: () => removeAdapter(name),
                },
                "×",
              ),
        ),
        name,
      ),
    ),
  );
}

function showAddError(message) {
  $("add-error").hidden = !message;
  $("add-error").textContent = message ?? "";
}

async function removeAdapter(name) {
  if (!confirm(`Stop serving ${name}? Requests running on it finish first. POST its .pte to serve it again.`)) return;
  try {
    await sendJson("DELETE", `/v1/adapters/${encodeURIComponent(name)}`);
    showAddError(null);
  } catch (error) {
    showAddError(error.message);
  }
  await refreshModels().catch(() => {});
}

export function initAdapters() {
  $("add-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const path = $("add-path").value.trim();
    if (!path) return showAddError("Name the adapter's .pte file.");
    const button = $("add-form").querySelector("button");
    button.disabled = true;
    try {
      await sendJson("POST", "/v1/adapters", { path });
      $("add-path").value = "";
      showAddError(null);
      await refreshModels();
    } catch (error) {
      showAddError(error.message);
    } finally {
      button.disabled = false;
    }
  });
}
