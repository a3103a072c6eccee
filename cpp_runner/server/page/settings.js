// The settings every request shares (system message, temperature, max tokens, a JSON schema for the
// answer), kept in the browser's storage for this server so a reload keeps them.

const STORE = "lora-share.settings";
const $ = (id) => document.getElementById(id);

export function initSettings() {
  const saved = JSON.parse(localStorage.getItem(STORE) ?? "{}");
  if (typeof saved.system === "string") $("system").value = saved.system;
  if (saved.temperature !== undefined) $("temperature").value = saved.temperature;
  if (saved.maxTokens !== undefined) $("max-tokens").value = saved.maxTokens;
  if (typeof saved.schema === "string") $("json-schema").value = saved.schema;
  for (const id of ["system", "temperature", "max-tokens", "json-schema"]) {
    $(id).addEventListener("input", () => {
      const [system, temperature, maxTokens] = [$("system").value, $("temperature").value, $("max-tokens").value];
      const schema = $("json-schema").value;
      localStorage.setItem(STORE, JSON.stringify({ system, temperature, maxTokens, schema }));
      requestFields();
    });
  }
}

// The fields of a chat request besides model and messages, checked as the server would (so a typo
// is said here, before anything is sent), or null with the problem shown under the settings. A schema
// in the box becomes a strict json_schema response_format: the server constrains every row to it, and
// a schema the server cannot compile is its 400, shown in the answer's place.
export function requestFields() {
  const temperature = Number($("temperature").value);
  const maxTokens = Number($("max-tokens").value);
  const schemaText = $("json-schema").value.trim();
  let problem = null;
  let schema = null;
  if ($("temperature").value.trim() === "" || !(temperature >= 0 && temperature <= 2)) {
    problem = "Temperature must be a number from 0 to 2.";
  } else if (!Number.isInteger(maxTokens) || maxTokens < 1) {
    problem = "Max tokens must be a whole number of at least 1.";
  } else if (schemaText) {
    try {
      schema = JSON.parse(schemaText);
    } catch (error) {
      problem = `The JSON schema is not JSON: ${error.message}`;
    }
    if (problem === null && (schema === null || typeof schema !== "object" || Array.isArray(schema))) {
      problem = "The JSON schema must be a JSON object, such as {\"type\": \"object\"}.";
    }
  }
  $("settings-error").hidden = problem === null;
  $("settings-error").textContent = problem ?? "";
  if (problem !== null) return null;
  const fields = { temperature, max_tokens: maxTokens };
  if (schema !== null) {
    fields.response_format = { type: "json_schema", json_schema: { name: "answer", schema, strict: true } };
  }
  return fields;
}

// The conversation as the server gets it: the system message first, when there is one.
export function withSystem(messages) {
  const system = $("system").value;
  return system.trim() ? [{ role: "system", content: system }, ...messages] : messages;
}
