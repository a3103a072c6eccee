// The page's entry: wires the views to the server's state and starts polling it.

import { initAdapters, renderAdapters } from "./adapters.js";
import { initChat, renderTargets } from "./chat.js";
import { initCompare, renderChoices } from "./compare.js";
import { initSettings } from "./settings.js";
import { onConnection, onModels, onStats, poll } from "./state.js";
import { renderConnection, renderStats } from "./status.js";

const TABS = ["compare", "chat"];

function showTab(name) {
  for (const tab of TABS) {
    const selected = tab === name;
    document.getElementById(`tab-${tab}`).setAttribute("aria-selected", String(selected));
    document.getElementById(`panel-${tab}`).hidden = !selected;
  }
  document.getElementById(`${name === "chat" ? "chat-input" : "compare-question"}`).focus();
}

function initTabs() {
  for (const tab of TABS) {
    document.getElementById(`tab-${tab}`).addEventListener("click", () => {
      history.replaceState(null, "", `#${tab}`);
      showTab(tab);
    });
  }
  showTab(TABS.includes(location.hash.slice(1)) ? location.hash.slice(1) : "compare");
}

initSettings();
initAdapters();
initCompare();
initChat();
initTabs();
onModels((models) => {
  renderAdapters(models);
  renderChoices(models);
  renderTargets(models);
});
onStats(renderStats);
onConnection(renderConnection);
poll();
