// The server-state strip: slots in use, requests, decode steps by batch size, prefix hits, adapters
// resident and the process's memory, from each /v1/stats poll.

import { el, formatBytes, formatCount } from "./dom.js";

const $ = (id) => document.getElementById(id);

// Bars of decode steps by rows per step: counts[b - 1] steps ran b rows.
export function renderBatchBars(container, counts) {
  const top = Math.max(1, ...counts);
  container.replaceChildren(
    ...counts.map((count, i) => {
      const fill = el("div", { class: "bar-fill" });
      fill.style.height = `${count === 0 ? 0 : Math.max(4, (100 * count) / top)}%`;
      return el(
        "div",
        { class: "bar", dataset: { count }, title: `${formatCount(count)} steps of ${i + 1} row${i ? "s" : ""}` },
        el("div", { class: "bar-count" }, count ? formatCount(count) : ""),
        el("div", { class: "bar-track" }, fill),
        el("div", { class: "bar-label" }, String(i + 1)),
      );
    }),
  );
}

export function renderStats(s) {
  $("stat-slots").textContent = `${s.slots_in_use} / ${s.parallel}`;
  $("stat-slot-boxes").replaceChildren(
    ...Array.from({ length: s.parallel }, (_, i) => el("span", { class: i < s.slots_in_use ? "slot busy" : "slot" })),
  );
  $("stat-requests").textContent = formatCount(s.requests);
  renderBatchBars($("stat-batches"), s.batch_size_counts);
  $("stat-prefix").textContent = formatCount(s.prefix_hits);
  $("stat-prefix-tokens").textContent = `${formatCount(s.prefix_tokens)} tokens spared`;
  $("stat-adapters").textContent = `${s.adapters_resident} / ${s.adapters_known}`;
  $("stat-loads").textContent = `${formatCount(s.loads)} loads, ${formatCount(s.evictions)} evictions`;
  $("stat-pss").textContent = formatBytes(s.process_pss_bytes);
  $("stat-budget").textContent = s.budget_bytes ? `budget ${formatBytes(s.budget_bytes)}` : "no memory budget";
}

export function renderConnection(online, detail) {
  const box = $("connection");
  box.dataset.state = online ? "online" : "offline";
  $("connection-text").textContent = online ? `serving on ${location.host}` : `server unreachable: ${detail}`;
}
