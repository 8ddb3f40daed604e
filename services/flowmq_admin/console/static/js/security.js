// Users (/api/v1/users) and, on brokers that have them, ACL rules (/api/v1/acls).

import { ApiError, call, segment } from "./api.js";
import { attempt, button, el, fmtTime, form, notify, table } from "./dom.js";

export const users = {
  id: "users",
  title: "Users",
  mount(view, ctx) {
    const list = el("div", { id: "users-list" });
    const create = form("user-create", [
      { name: "username", label: "User name", required: true },
      { name: "password", label: "Password", type: "password", required: true },
      { name: "namespace", label: "Namespace", value: ctx.namespace() },
    ], "Create user", (v, controls) => attempt(async () => {
      const body = { username: v.username, password: controls.password.value };
      if (v.namespace) body.namespace = v.namespace;
      const created = await call("POST", "/users", { body });
      controls.password.value = "";
      notify(`Created user ${created.username} in namespace ${created.namespace}.`);
      await refresh();
    }));
    view.append(
      el("h2", {}, "Users"),
      el("p", { class: "hint" }, "Users log in over MQTT, AMQP and Kafka (SASL PLAIN and SCRAM). "
        + "Passwords are never shown."),
      create, list,
    );
    async function refresh() {
      const rows = await call("GET", "/users");
      list.replaceChildren(table([
        { title: "User name", cell: (u) => u.username, class: "name" },
        { title: "Namespace", cell: (u) => u.namespace },
        { title: "Created", cell: (u) => fmtTime(u.created_at_ms) },
        { title: "", cell: (u) => button("Delete", () => attempt(async () => {
          if (!window.confirm(`Delete user ${u.username}?`)) return;
          await call("DELETE", `/users/${segment(u.username)}`);
          notify(`Deleted user ${u.username}.`);
          await refresh();
        }), "danger"), class: "actions" },
      ], rows, { empty: "No users: only anonymous clients can connect.", key: (u) => u.username }));
    }
    return { refresh };
  },
};

// Whether this broker serves /acls: a 404 means it has no ACLs (the tab stays hidden).
export async function hasAcls() {
  try {
    await call("GET", "/acls");
    return true;
  } catch (err) {
    if (err instanceof ApiError && err.status === 404) return false;
    throw err;
  }
}

const ACTIONS = [
  "publish", "subscribe", "produce", "consume", "create", "delete", "describe", "admin", "all",
];

export const acls = {
  id: "acls",
  title: "ACLs",
  mount(view, ctx) {
    const list = el("div", { id: "acls-list" });
    const create = form("acl-create", [
      { name: "principal", label: "Principal", required: true, placeholder: "user, group:name or *" },
      { name: "namespace", label: "Namespace", value: ctx.namespace(), class: "short" },
      { name: "resource", label: "Resource", required: true, placeholder: "sensors/#, stream:orders" },
      { name: "action", label: "Action", type: "select", options: ACTIONS.map((a) => [a, a]) },
      { name: "effect", label: "Effect", type: "select", options: [["allow", "allow"], ["deny", "deny"]] },
    ], "Add rule", (v) => attempt(async () => {
      const created = await call("POST", "/acls", { body: v });
      notify(`Added rule ${created.id ?? ""}.`);
      await refresh();
    }));
    view.append(el("h2", {}, "ACL rules"), create, list);
    async function refresh() {
      const rows = await call("GET", "/acls");
      list.replaceChildren(table([
        { title: "Principal", cell: (r) => r.principal, class: "name" },
        { title: "Namespace", cell: (r) => r.namespace },
        { title: "Resource", cell: (r) => r.resource },
        { title: "Action", cell: (r) => r.action },
        { title: "Effect", cell: (r) => el("span", { class: `effect ${r.effect}` }, r.effect) },
        { title: "Id", cell: (r) => r.id, class: "muted" },
        { title: "", cell: (r) => button("Delete", () => attempt(async () => {
          if (!window.confirm(`Delete the rule ${r.effect} ${r.action} on ${r.resource}?`)) return;
          await call("DELETE", `/acls/${segment(r.id)}`);
          notify("Deleted the rule.");
          await refresh();
        }), "danger"), class: "actions" },
      ], rows, { empty: "No ACL rules.", key: (r) => r.id }));
    }
    return { refresh };
  },
};
