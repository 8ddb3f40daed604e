// Building the page. Text from the broker (names, payloads, error messages) only ever goes in
// through text nodes and attribute values, never parsed as HTML.

import { ApiError } from "./api.js";

// el("td", {class: "num", dataset: {name}}, "text", childNode, [more], null)
export function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "dataset") Object.assign(node.dataset, value);
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key in node && typeof value !== "string") node[key] = value;
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  append(node, children);
  return node;
}

function append(node, children) {
  for (const child of children) {
    if (child === undefined || child === null || child === false) continue;
    if (Array.isArray(child)) append(node, child);
    else node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

export const link = (href, text) => el("a", { href }, text);

// columns: [{title, cell: (row) => text or node, class}]; key(row) names the row (data-name).
export function table(columns, rows, { empty = "None yet.", key } = {}) {
  if (!rows.length) return el("p", { class: "empty" }, empty);
  return el(
    "table",
    {},
    el("thead", {}, el("tr", {}, columns.map((c) => el("th", { class: c.class }, c.title)))),
    el(
      "tbody",
      {},
      rows.map((row) =>
        el(
          "tr",
          { dataset: key ? { name: key(row) } : undefined },
          columns.map((c) => el("td", { class: c.class }, c.cell(row))),
        ),
      ),
    ),
  );
}

// fields: [{name, label, type ("text", "number", "password", "checkbox", "textarea",
// "select"), options: [[value, text]], value, placeholder, required, class}].
// onSubmit(values) gets strings (checkboxes: booleans); the button is disabled while it runs.
export function form(id, fields, submitLabel, onSubmit) {
  const controls = {};
  const button = el("button", { type: "submit" }, submitLabel);
  const rows = fields.map((f) => {
    let control;
    if (f.type === "select") {
      control = el(
        "select",
        { name: f.name },
        (f.options || []).map(([value, text]) => el("option", { value }, text)),
      );
      if (f.value !== undefined) control.value = f.value;
    } else if (f.type === "textarea") {
      control = el("textarea", { name: f.name, rows: 4, placeholder: f.placeholder });
      control.value = f.value ?? "";
    } else {
      control = el("input", {
        name: f.name,
        type: f.type || "text",
        placeholder: f.placeholder,
        required: f.required,
        min: f.min,
        autocomplete: "off",
      });
      if (f.type === "checkbox") control.checked = Boolean(f.value);
      else if (f.value !== undefined) control.value = f.value;
    }
    controls[f.name] = control;
    return el("label", { class: f.type === "checkbox" ? "check" : f.class }, f.label, control);
  });
  const node = el("form", { id, class: "inline" }, rows, button);
  node.addEventListener("submit", async (event) => {
    event.preventDefault();
    const values = {};
    for (const [name, control] of Object.entries(controls)) {
      values[name] = control.type === "checkbox" ? control.checked : control.value.trim();
    }
    button.disabled = true;
    try {
      await onSubmit(values, controls);
    } finally {
      button.disabled = false;
    }
  });
  return node;
}

// The banner under the header: API errors (the envelope's code and message) and notices.
let bannerNode = null;
export function setBanner(node) {
  bannerNode = node;
}

export function notify(message, kind = "ok") {
  if (!bannerNode) return;
  bannerNode.textContent = message;
  bannerNode.className = `banner ${kind}`;
  bannerNode.hidden = !message;
}

export function report(err) {
  notify(err instanceof ApiError ? err.describe() : String(err), "error");
}

// Runs an action; its error goes to the banner instead of being thrown.
export async function attempt(action) {
  try {
    return await action();
  } catch (err) {
    report(err);
    return undefined;
  }
}

export function button(text, onClick, kind = "") {
  return el("button", { type: "button", class: kind, onclick: onClick }, text);
}

export function fmtBytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = n;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return unit === 0 ? `${value} B` : `${value.toFixed(1)} ${units[unit]}`;
}

export function fmtTime(ms) {
  if (ms === null || ms === undefined) return "–";
  return new Date(ms).toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

export const fmtNum = (n) => (n === null || n === undefined ? "–" : Number(n).toLocaleString("en"));

// count(1, "message") -> "1 message"; count(2, "message") -> "2 messages".
export const count = (n, word) => `${fmtNum(n)} ${word}${n === 1 ? "" : "s"}`;

export const fmtRate = (r) => (r === null || r === undefined ? "–" : r.toFixed(1));

// A value as the API gives it: UTF-8 text as is, anything else base64 (so marked).
export function encoded(value, encoding) {
  if (value === null || value === undefined) return el("span", { class: "muted" }, "null");
  if (encoding === "base64") return el("span", { class: "b64", title: "base64" }, value);
  return el("span", { class: "payload" }, value);
}
