// Consumer groups (lag, offset reset), client connections (disconnect) and publishing a test
// message.

import { call, segment } from "./api.js";
import { attempt, button, el, fmtNum, fmtTime, form, link, notify, table } from "./dom.js";
import { changeForm, confirmButton, detailPage, listPage, ns } from "./pages.js";

export const groups = listPage({
  id: "groups",
  title: "Groups",
  heading: "Consumer groups",
  empty: "No consumer groups in this namespace.",
  key: (g) => g.group,
}, (ctx) => ({
  intro: [el("p", { class: "hint" }, "Kafka consumer groups with committed offsets or live "
    + "members. Members and state show on the broker that coordinates the group.")],
  load: () => call("GET", "/groups", { query: ns(ctx) }),
  columns: [
    { title: "Group", cell: (g) => link(`#/groups/${segment(g.group)}`, g.group), class: "name" },
    { title: "Coordinator", cell: (g) => g.coordinator ?? "–" },
    { title: "State", cell: (g) => g.state ?? "–" },
    { title: "Members", cell: (g) => fmtNum(g.members), class: "num" },
  ],
}));

// #/groups/<group>: members, committed offsets and lag; reset while it has no members.
export const groupDetail = detailPage("groups", "Group", (ctx, group, summary) => {
  const members = el("div", { id: "group-members" });
  const offsets = el("div", { id: "group-offsets" });
  const reset = changeForm("group-reset", [
    { name: "stream", label: "Stream", required: true },
    { name: "to", label: "To", placeholder: "earliest, latest or an offset", value: "earliest" },
    { name: "partition", label: "Partition", type: "number", min: 0, placeholder: "all", class: "short" },
  ], "Reset offsets", async (v) => {
    const to = /^\d+$/.test(v.to) ? Number.parseInt(v.to, 10) : v.to;
    const body = { stream: v.stream, to };
    if (v.partition !== "") body.partition = Number.parseInt(v.partition, 10);
    const done = await call("POST", `/groups/${segment(group)}/reset-offsets`, {
      query: ns(ctx), body,
    });
    return `Reset ${group} on ${done.stream}: `
      + done.offsets.map((o) => `${o.partition}→${o.offset}`).join(", ");
  }, refresh);
  async function refresh() {
    const g = await call("GET", `/groups/${segment(group)}`, { query: ns(ctx) });
    summary.textContent = `coordinator ${g.coordinator ?? "–"}, state ${g.state ?? "–"}, `
      + `total lag ${fmtNum(g.lag)}`;
    members.replaceChildren(g.members === null
      ? el("p", { class: "muted" }, "Another broker coordinates this group.")
      : table([
        { title: "Member", cell: (m) => m.member_id },
        { title: "Instance", cell: (m) => m.group_instance_id ?? "–" },
        { title: "Client", cell: (m) => m.client_id ?? "–" },
        { title: "Host", cell: (m) => m.client_host ?? "–" },
      ], g.members, { empty: "No live members." }));
    offsets.replaceChildren(table([
      { title: "Stream", cell: (o) => o.stream },
      { title: "Partition", cell: (o) => o.partition, class: "num" },
      { title: "Committed", cell: (o) => fmtNum(o.committed_offset), class: "num" },
      { title: "End", cell: (o) => fmtNum(o.end_offset), class: "num" },
      { title: "Lag", cell: (o) => fmtNum(o.lag), class: "num" },
      { title: "Committed at", cell: (o) => fmtTime(o.commit_timestamp_ms) },
    ], g.offsets, { empty: "No committed offsets." }));
    if (!reset.elements.stream.value && g.offsets.length) {
      reset.elements.stream.value = g.offsets[0].stream;
    }
  }
  return {
    nodes: [
      el("h3", {}, "Members"), members, el("h3", {}, "Offsets"), offsets,
      el("h3", {}, "Reset offsets"),
      el("p", { class: "hint" }, "Refused while the group has live members."), reset,
    ],
    refresh,
  };
});

export const clients = listPage({
  id: "clients", title: "Clients", empty: "No client connections.", key: (c) => c.id,
}, (ctx, refresh) => {
  const filter = el("select", { id: "client-protocol", onchange: () => refresh() },
    [["", "all protocols"], ["mqtt", "MQTT"], ["amqp", "AMQP"], ["kafka", "Kafka"]]
      .map(([value, text]) => el("option", { value }, text)));
  return {
    intro: [el("p", { class: "hint" }, "Connections on this broker. ", el("label", {}, "Show ", filter))],
    load: () => call("GET", "/clients", { query: { protocol: filter.value } }),
    columns: [
      { title: "Connection", cell: (c) => c.id, class: "name" },
      { title: "Protocol", cell: (c) => `${c.protocol} ${c.protocol_version ?? ""}` },
      { title: "Client id", cell: (c) => c.client_id ?? "–" },
      { title: "User", cell: (c) => c.user ?? "–" },
      { title: "Namespace", cell: (c) => c.namespace ?? "–" },
      { title: "Connected", cell: (c) => (c.connected === false ? "handshake" : "yes") },
      { title: "Subscriptions", cell: (c) => c.subscriptions.join(", ") },
      { title: "In flight", cell: (c) => fmtNum(c.inflight), class: "num" },
      { title: "", cell: (c) => confirmButton("Disconnect", `Disconnect ${c.id}?`, async () => {
        const done = await call("DELETE", `/clients/${segment(c.id)}`);
        return `Disconnected ${done.disconnected.join(", ")}.`;
      }, refresh), class: "actions" },
    ],
  };
});

export const publish = {
  id: "publish",
  title: "Publish",
  mount(view, ctx) {
    const result = el("div", { id: "publish-result" });
    const send = form("publish-form", [
      { name: "topic", label: "Topic", required: true, placeholder: "orders/eu" },
      { name: "payload", label: "Payload", type: "textarea", class: "wide" },
      { name: "key", label: "Key", placeholder: "none" },
      { name: "content_type", label: "Content type", placeholder: "none" },
      { name: "qos", label: "QoS", type: "select", options: [["0", "0"], ["1", "1"], ["2", "2"]], value: "1" },
      { name: "retain", label: "Retain", type: "checkbox" },
    ], "Publish", (v) => attempt(async () => {
      const body = { payload: v.payload, qos: Number(v.qos), retain: v.retain };
      if (v.key) body.key = v.key;
      if (v.content_type) body.content_type = v.content_type;
      const done = await call("POST", `/topics/${segment(v.topic)}/messages`, {
        query: ns(ctx), body,
      });
      notify(`Published to ${done.topic}: ${done.destinations.length} destination(s).`);
      showDestinations(done);
    }));
    const route = button("Which destinations?", () => attempt(async () => {
      const topic = send.elements.topic.value.trim();
      showDestinations(await call("GET", "/routes", { query: { ...ns(ctx), topic } }));
    }), "quiet");
    view.append(
      el("h2", {}, "Publish a test message"),
      el("p", { class: "hint" }, "Sent as an HTTP publish: it reaches every stream, queue and "
        + "subscriber whose filter matches the topic."),
      send, route, result,
    );
    function showDestinations(answer) {
      result.replaceChildren(el("h3", {}, `Destinations of ${answer.topic}`), table([
        { title: "Type", cell: (d) => d.type },
        { title: "Name", cell: (d) => d.name },
        { title: "Filters", cell: (d) => (d.topic_filters || []).join(", ") },
      ], answer.destinations, { empty: "No stream or queue matches this topic." }));
    }
    return {};
  },
};
