// Small helpers for building the page's DOM: text always goes in as text, never as HTML.

// el("div", { class: "x", dataset: { adapter: "a" } }, "text", child, ...)
export function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (key === "class") node.className = value;
    else if (key === "dataset") Object.assign(node.dataset, value);
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (value === true) node.setAttribute(key, "");
    else if (value !== false && value !== null && value !== undefined) node.setAttribute(key, value);
  }
  node.append(...children.filter((c) => c !== null && c !== undefined));
  return node;
}

// One colour per adapter, the same on every view while the page is open: the next unused hue of
// HUES in the order the adapters were first listed (so the first twelve never share one).
const HUES = [245, 200, 335, 150, 28, 280, 175, 5, 218, 95, 310, 48];
const hues = new Map();
export function adapterHue(name) {
  if (name === "base") return null;
  if (!hues.has(name)) hues.set(name, HUES[hues.size % HUES.length]);
  return hues.get(name);
}

// Sets --hue on `node` for the CSS to colour it by, or marks it as the foundation alone.
export function paintAdapter(node, name) {
  const hue = adapterHue(name);
  if (hue === null) node.classList.add("is-base");
  else node.style.setProperty("--hue", String(hue));
  return node;
}

export function formatBytes(bytes) {
  if (!(bytes >= 0)) return "–";
  const units = ["B", "KiB", "MiB", "GiB"];
  let i = 0;
  while (bytes >= 1024 && i < units.length - 1) {
    bytes /= 1024;
    i += 1;
  }
  return `${bytes.toFixed(i >= 2 ? 0 : 1)} ${units[i]}`;
}

export function formatCount(n) {
  return Number(n).toLocaleString("en-US");
}
