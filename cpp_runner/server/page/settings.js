// The settings every request shares (system message, temperature, max tokens), kept in the browser's
// storage for this server so a reload keeps them.

const STORE = "lora-share.settings";
const $ = (id) => document.getElementById(id);

export function initSettings() {
  const saved = JSON.parse(localStorage.getItem(STORE) ?? "{}");
  if (typeof saved.system === "string") $("system").value = saved.system;
  if (saved.temperature !== undefined) $("temperature").value = saved.temperature;
  if (saved.maxTokens !== undefined) $("max-tokens").value = saved.maxTokens;
  for (const id of ["system", "temperature", "max-tokens"]) {
    $(id).addEventListener("input", () => {
      const [system, temperature, maxTokens] = [$("system").value, $("temperature").value, $("max-tokens").value];
      localStorage.setItem(STORE, JSON.stringify({ system, temperature, maxTokens }));
      requestFields();
    });
  }
}

// The fields of a chat request besides model and messages, checked as the server would (so a typo
// is said here, before anything is sent), or null with the problem shown under the settings.
// Structured output's response_format joins these fields here, once the server accepts it.
export function requestFields() {
  const temperature = Number($("temperature").value);
  const maxTokens = Number($("max-tokens").value);
  let problem = null;
  if ($("temperature").value.trim() === "" || !(temperature >= 0 && temperature <= 2)) {
    problem = "Temperature must be a number from 0 to 2.";
  } else if (!Number.isInteger(maxTokens) || maxTokens < 1) {
    problem = "Max tokens must be a whole number of at least 1.";
  }
  $("settings-error").hidden = problem === null;
  $("settings-error").textContent = problem ?? "";
  return problem === null ? { temperature, max_tokens: maxTokens } : null;
}

// The conversation as the server gets it: the system message first, when there is one.
export function withSystem(messages) {
  const system = $("system").value;
  return system.trim() ? [{ role: "system", content: system }, ...messages] : messages;
}
