// The console's shell: sign-in with the admin token, the page tabs (a hash route per page),
// the namespace picker and the refresh of the shown page's live counts every few seconds.

import { call, token, whenUnauthorized } from "./api.js";
import { groupDetail, groups, clients, publish } from "./operations.js";
import { queuePeek, queues, streamBrowser, streams } from "./destinations.js";
import { acls, hasAcls, users } from "./security.js";
import { el, notify, report, setBanner } from "./dom.js";
import { overview } from "./overview.js";

const TABS = [overview, streams, queues, groups, clients, publish, users, acls];
// #/<tab>/<name>: the page of one stream, queue or group.
const DETAILS = { streams: streamBrowser, queues: queuePeek, groups: groupDetail };
const REFRESH_MS = 3000;
const NAMESPACE_KEY = "flowmq.namespace";

const $ = (id) => document.getElementById(id);
const shown = { page: null, refresh: null, busy: false, failed: false, hidden: new Set(["acls"]) };

const ctx = {
  namespace: () => sessionStorage.getItem(NAMESPACE_KEY) || "default",
  go: (hash) => {
    window.location.hash = hash;
  },
};

function parseHash() {
  const [id, ...rest] = window.location.hash.replace(/^#\/?/, "").split("/");
  const name = rest.length ? decodeURIComponent(rest.join("/")) : null;
  const tab = TABS.find((t) => t.id === id && !shown.hidden.has(t.id)) || overview;
  return { page: name !== null && DETAILS[tab.id] ? DETAILS[tab.id] : tab, name };
}

async function refreshShown() {
  if (!shown.refresh || shown.busy) return;
  const page = shown.page;
  shown.busy = true;
  try {
    await shown.refresh();
    if (shown.failed && page === shown.page) notify("");
    shown.failed = false;
  } catch (err) {
    if (page === shown.page) {
      report(err);
      shown.failed = true;
    }
  } finally {
    shown.busy = false;
  }
}

function mount() {
  const { page, name } = parseHash();
  const view = $("page");
  view.replaceChildren();
  notify("");
  for (const link of $("nav").children) {
    link.classList.toggle("active", link.dataset.page === page.id);
  }
  document.title = `${name ?? page.title} · FlowMQ console`;
  shown.page = page;
  shown.busy = false;
  shown.failed = false;
  shown.refresh = page.mount(view, ctx, name).refresh || null;
  refreshShown();
}

function buildNav() {
  $("nav").replaceChildren(...TABS.filter((t) => !shown.hidden.has(t.id)).map((t) =>
    el("a", { href: `#/${t.id}`, dataset: { page: t.id }, id: `tab-${t.id}` }, t.title)));
}

async function loadNamespaces() {
  const select = $("namespace");
  const names = (await call("GET", "/namespaces")).map((n) => n.name);
  if (!names.includes(ctx.namespace())) sessionStorage.setItem(NAMESPACE_KEY, names[0] || "default");
  select.replaceChildren(...names.map((n) => el("option", { value: n }, n)));
  select.value = ctx.namespace();
}

async function start() {
  $("signin").hidden = true;
  $("app").hidden = false;
  // Each on its own: one failing leaves the others (and the pages) working.
  const [namespaces, health, withAcls] = await Promise.allSettled([
    loadNamespaces(),
    call("GET", "/health"),
    hasAcls(),
  ]);
  if (namespaces.status === "rejected") report(namespaces.reason);
  if (health.status === "fulfilled") {
    $("node").textContent = `${health.value.node_id} · ${health.value.version}`;
  }
  if (withAcls.status === "fulfilled" && withAcls.value) shown.hidden.delete("acls");
  buildNav();
  mount();
}

function showSignIn(message) {
  $("app").hidden = true;
  $("signin").hidden = false;
  const error = $("signin-error");
  error.textContent = message || "";
  error.hidden = !message;
  $("token").focus();
}

function signOut(message) {
  token.clear();
  shown.page = null;
  shown.refresh = null;
  $("page").replaceChildren();
  showSignIn(message);
}

document.addEventListener("DOMContentLoaded", () => {
  setBanner($("banner"));
  whenUnauthorized((err) => signOut(`${err.describe()} Sign in again.`));
  $("signin-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const value = $("token").value.trim();
    const submit = $("signin-button");
    submit.disabled = true;
    try {
      await call("GET", "/namespaces", { tokenValue: value });
      token.set(value);
      $("token").value = "";
      await start();
    } catch (err) {
      showSignIn(err.describe ? err.describe() : String(err));
    } finally {
      submit.disabled = false;
    }
  });
  $("signout").addEventListener("click", () => signOut(""));
  $("namespace").addEventListener("change", (event) => {
    sessionStorage.setItem(NAMESPACE_KEY, event.target.value);
    mount();
  });
  window.addEventListener("hashchange", () => {
    if (token.get()) mount();
  });
  setInterval(() => {
    if (token.get() && document.visibilityState === "visible") refreshShown();
  }, REFRESH_MS);
  if (token.get()) start();
  else showSignIn("");
});
