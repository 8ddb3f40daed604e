// Users (/api/v1/users) and, on brokers that have them, ACL rules (/api/v1/acls).

import { ApiError, call, segment } from "./api.js";
import { el, fmtTime } from "./dom.js";
import { changeForm, confirmButton, listPage } from "./pages.js";

export const users = listPage({
  id: "users",
  title: "Users",
  empty: "No users: only anonymous clients can connect.",
  key: (u) => u.username,
}, (ctx, refresh) => ({
  intro: [
    el("p", { class: "hint" }, "Users log in over MQTT, AMQP and Kafka (SASL PLAIN and SCRAM). "
      + "Passwords are never shown."),
    changeForm("user-create", [
      { name: "username", label: "User name", required: true },
      { name: "password", label: "Password", type: "password", required: true },
      { name: "namespace", label: "Namespace", value: ctx.namespace() },
    ], "Create user", async (v, controls) => {
      const body = { username: v.username, password: controls.password.value };
      if (v.namespace) body.namespace = v.namespace;
      const created = await call("POST", "/users", { body });
      controls.password.value = "";
      return `Created user ${created.username} in namespace ${created.namespace}.`;
    }, refresh),
  ],
  load: () => call("GET", "/users"),
  columns: [
    { title: "User name", cell: (u) => u.username, class: "name" },
    { title: "Namespace", cell: (u) => u.namespace },
    { title: "Created", cell: (u) => fmtTime(u.created_at_ms) },
    { title: "", cell: (u) => confirmButton("Delete", `Delete user ${u.username}?`, async () => {
      await call("DELETE", `/users/${segment(u.username)}`);
      return `Deleted user ${u.username}.`;
    }, refresh), class: "actions" },
  ],
}));

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

export const acls = listPage({
  id: "acls", title: "ACLs", heading: "ACL rules", empty: "No ACL rules.", key: (r) => r.id,
}, (ctx, refresh) => ({
  intro: [changeForm("acl-create", [
    { name: "principal", label: "Principal", required: true, placeholder: "user, group:name or *" },
    { name: "namespace", label: "Namespace", value: ctx.namespace(), class: "short" },
    { name: "resource", label: "Resource", required: true, placeholder: "sensors/#, stream:orders" },
    { name: "action", label: "Action", type: "select", options: ACTIONS.map((a) => [a, a]) },
    { name: "effect", label: "Effect", type: "select", options: [["allow", "allow"], ["deny", "deny"]] },
  ], "Add rule", async (v) => {
    const created = await call("POST", "/acls", { body: v });
    return `Added rule ${created.id ?? ""}.`;
  }, refresh)],
  load: () => call("GET", "/acls"),
  columns: [
    { title: "Principal", cell: (r) => r.principal, class: "name" },
    { title: "Namespace", cell: (r) => r.namespace },
    { title: "Resource", cell: (r) => r.resource },
    { title: "Action", cell: (r) => r.action },
    { title: "Effect", cell: (r) => el("span", { class: `effect ${r.effect}` }, r.effect) },
    { title: "Id", cell: (r) => r.id, class: "muted" },
    { title: "", cell: (r) => confirmButton(
      "Delete", `Delete the rule ${r.effect} ${r.action} on ${r.resource}?`, async () => {
        await call("DELETE", `/acls/${segment(r.id)}`);
        return "Deleted the rule.";
      }, refresh,
    ), class: "actions" },
  ],
}));
