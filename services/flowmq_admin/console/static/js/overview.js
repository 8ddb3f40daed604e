// Overview: nodes, connections, message rates (from /metrics) and storage of the namespace.

import { call, metricsText } from "./api.js";
import { count, el, fmtBytes, fmtNum, fmtRate, fmtTime, table } from "./dom.js";
import { parsePrometheus, RateMeter } from "./metrics.js";

function card(id, title) {
  const value = el("div", { class: "value", id: `${id}-value` }, "–");
  const detail = el("div", { class: "detail", id: `${id}-detail` });
  return { node: el("section", { class: "card", id }, el("h3", {}, title), value, detail), value, detail };
}

const NODE_COLUMNS = [
  { title: "Node", cell: (n) => (n.self ? `${n.node_id} (this one)` : n.node_id) },
  { title: "Status", cell: (n) => el("span", { class: `state ${n.status}` }, n.status) },
  { title: "Gossip", cell: (n) => n.gossip ?? "–" },
  { title: "Host", cell: (n) => n.host ?? "–" },
  { title: "Roles", cell: (n) => (n.roles || []).join(", ") },
  { title: "Version", cell: (n) => n.version ?? "–" },
  { title: "Started", cell: (n) => fmtTime(n.started_at_ms) },
];

export const overview = {
  id: "overview",
  title: "Overview",
  mount(view, ctx) {
    const cards = {
      nodes: card("nodes", "Nodes up"),
      connections: card("connections", "Connections"),
      rateIn: card("rate-in", "Messages in /s"),
      rateOut: card("rate-out", "Messages out /s"),
      storage: card("storage", "Stream storage"),
      queued: card("queued", "Queued messages"),
    };
    const nodes = el("div", { id: "nodes-table" });
    const ready = el("div", { id: "ready" });
    view.append(
      el("h2", {}, "Overview"),
      el("div", { class: "cards" }, Object.values(cards).map((c) => c.node)),
      el("p", { class: "hint" }, "Rates and connections are this broker's; storage and queued "
        + `messages are the cluster's, for namespace ${ctx.namespace()}.`),
      el("h3", {}, "Readiness"),
      ready,
      el("h3", {}, "Nodes"),
      nodes,
    );
    const meter = new RateMeter();

    const total = (list, field) => list.reduce((acc, d) => acc + (d[field] || 0), 0);

    function showNodes(list) {
      const up = list.filter((n) => n.status === "up").length;
      cards.nodes.value.textContent = `${up} / ${list.length}`;
      nodes.replaceChildren(table(NODE_COLUMNS, list, { key: (n) => n.node_id }));
    }

    function showConnections(clients) {
      const byProtocol = {};
      for (const c of clients) byProtocol[c.protocol] = (byProtocol[c.protocol] || 0) + 1;
      cards.connections.value.textContent = fmtNum(clients.length);
      cards.connections.detail.textContent = Object.entries(byProtocol)
        .map(([p, n]) => `${p} ${n}`)
        .join(", ") || "none";
    }

    function showRates(text) {
      const rates = meter.sample(parsePrometheus(text));
      cards.rateIn.value.textContent = fmtRate(rates.inRate);
      cards.rateIn.detail.textContent = `${fmtNum(rates.inTotal)} since start`;
      cards.rateOut.value.textContent = fmtRate(rates.outRate);
      cards.rateOut.detail.textContent = `${fmtNum(rates.outTotal)} since start`;
    }

    function showStorage([streams, queues]) {
      cards.storage.value.textContent = fmtBytes(total(streams, "bytes"));
      cards.storage.detail.textContent = `${count(total(streams, "messages"), "message")} in `
        + `${count(streams.length, "stream")}, ${count(total(streams, "segments"), "segment")}`;
      cards.queued.value.textContent = fmtNum(total(queues, "ready"));
      cards.queued.detail.textContent = `${fmtNum(total(queues, "unacked"))} unacked in `
        + `${count(queues.length, "queue")}, ${fmtBytes(total(queues, "bytes"))}`;
    }

    function showReady(readiness) {
      ready.replaceChildren(el("ul", { class: "checks" },
        Object.entries(readiness.checks).map(([name, check]) => el("li", {},
          el("span", { class: `state ${check.ok ? "up" : "down"}` }, check.ok ? "ok" : "failed"),
          ` ${name}`, check.ms !== undefined ? ` (${Number(check.ms).toFixed(1)} ms)` : "",
          check.error ? ` ${check.error}` : ""))));
    }

    // Each part from its own call: one refused (a 404 on an older broker, a token not
    // allowed there) leaves the others shown, and its error goes to the banner.
    async function refresh() {
      const ns = { namespace: ctx.namespace() };
      const parts = [
        [call("GET", "/cluster/nodes"), showNodes],
        [call("GET", "/clients"), showConnections],
        [metricsText(), showRates],
        [Promise.all([call("GET", "/streams", { query: ns }), call("GET", "/queues", { query: ns })]),
          showStorage],
      ];
      const notReady = (err) => ready.replaceChildren(el("p", { class: "state down" },
        `not ready: ${err.describe ? err.describe() : err}`));
      // A 503 from /ready is an answer (not ready), shown in its place, not an error.
      const readiness = call("GET", "/ready").then(showReady, notReady);
      const results = await Promise.allSettled(parts.map(([answer]) => answer));
      await readiness;
      let failure = null;
      results.forEach((result, i) => {
        if (result.status === "fulfilled") parts[i][1](result.value);
        else failure = failure || result.reason;
      });
      if (failure) throw failure;
    }
    return { refresh };
  },
};
