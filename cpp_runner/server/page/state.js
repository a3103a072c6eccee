// What the server serves and how it is doing: /v1/models and /v1/stats, polled one request at a time
// (a browser opens at most six connections to a server, and Compare's streams need the others).
// Listeners get the adapter list when it changes and the stats on every poll.

import { getJson } from "./api.js";

const POLL_MS = 1000;
const listeners = { models: [], stats: [], connection: [] };
let models = [];
let online = null;

export const onModels = (fn) => listeners.models.push(fn);
export const onStats = (fn) => listeners.stats.push(fn);
export const onConnection = (fn) => listeners.connection.push(fn);
export const currentModels = () => models;

function setOnline(value, detail) {
  if (value === online && value) return;
  online = value;
  for (const fn of listeners.connection) fn(value, detail);
}

function setModels(list) {
  const names = list.data.map((m) => m.id);
  if (names.join("\n") === models.join("\n")) return;
  models = names;
  for (const fn of listeners.models) fn(models);
}

// Polls now, and then every POLL_MS after the last answer (never two polls at once).
export async function poll() {
  try {
    setModels(await getJson("/v1/models"));
    const stats = await getJson("/v1/stats");
    for (const fn of listeners.stats) fn(stats);
    setOnline(true);
  } catch (error) {
    setOnline(false, error.message);
  }
  setTimeout(poll, POLL_MS);
}

// Polls at once, outside the schedule (after the page adds or removes an adapter).
export async function refreshModels() {
  setModels(await getJson("/v1/models"));
}
