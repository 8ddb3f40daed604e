// Streams and queues: lists with live counts, create and delete; the message browser (a
// stream read from an offset) and the queue peek.

import { call, segment } from "./api.js";
import {
  attempt, button, count, el, encoded, fmtBytes, fmtNum, fmtTime, form, link, table,
} from "./dom.js";
import { changeForm, confirmButton, detailPage, listPage, ns } from "./pages.js";

const optionalInt = (text) => (text === "" ? undefined : Number.parseInt(text, 10));

function confirmDelete(kind, name, ctx, after) {
  return confirmButton("Delete", `Delete ${kind} ${name}? Its messages are lost.`, async () => {
    await call("DELETE", `/${kind}s/${segment(name)}`, { query: ns(ctx) });
    return `Deleted ${kind} ${name}.`;
  }, after);
}

function offsets(stream) {
  const starts = stream.start_offsets || [];
  const ends = stream.end_offsets || [];
  return ends.map((end, p) => `${p}: ${starts[p] ?? 0}–${end}`).join(", ");
}

function retention(ms) {
  if (ms === -1) return "forever";
  if (ms === undefined) return "–";
  if (ms % 86400000 === 0) return `${ms / 86400000} d`;
  return ms % 3600000 === 0 ? `${ms / 3600000} h` : `${ms} ms`;
}

// The Streams and Queues tabs: one shape for the two destination types, as in the API. The
// create form asks for the name (`example` its placeholder) and `settings` (body(values) makes
// the API's fields of them); the table shows the name, `columns` and the actions: open the
// destination's page (`open`), `actions(d, ctx, refresh)`, delete.
function destinationList(kind, example, { settings, body, filters, columns, open, actions }) {
  const plural = `${kind}s`;
  return listPage({
    id: plural,
    title: `${kind[0].toUpperCase()}${kind.slice(1)}s`,
    empty: `No ${plural} in this namespace.`,
    key: (d) => d.name,
  }, (ctx, refresh) => ({
    intro: [changeForm(`${kind}-create`, [
      { name: "name", label: "Name", required: true, placeholder: example },
      ...settings,
    ], `Create ${kind}`, async (v) => {
      const query = ns(ctx);
      const created = await call("POST", `/${plural}`, { query, body: { name: v.name, ...body(v) } });
      return `Created ${kind} ${created.name} (${filters(created)}).`;
    }, refresh)],
    load: () => call("GET", `/${plural}`, { query: ns(ctx) }),
    columns: [
      { title: "Name", cell: (d) => link(`#/${plural}/${segment(d.name)}`, d.name), class: "name" },
      ...columns,
      { title: "", cell: (d) => [
        button(open, () => ctx.go(`#/${plural}/${segment(d.name)}`)),
        ...(actions ? actions(d, ctx, refresh) : []),
        confirmDelete(kind, d.name, ctx, refresh),
      ], class: "actions" },
    ],
  }));
}

export const streams = destinationList("stream", "orders.eu", {
  settings: [
    { name: "topic_filters", label: "Topic filters", placeholder: "default: orders/eu" },
    { name: "partitions", label: "Partitions", type: "number", min: 1, value: "1", class: "short" },
    { name: "retention_ms", label: "Retention ms", type: "number", placeholder: "7 days", class: "short" },
  ],
  body: (v) => ({
    partitions: optionalInt(v.partitions),
    topic_filters: v.topic_filters ? v.topic_filters.split(",").map((f) => f.trim()) : undefined,
    retention_ms: optionalInt(v.retention_ms),
  }),
  filters: (s) => s.topic_filters.join(", "),
  columns: [
    { title: "Topic filters", cell: (s) => s.topic_filters.join(", ") },
    { title: "Partitions", cell: (s) => s.partitions, class: "num" },
    { title: "Messages", cell: (s) => fmtNum(s.messages), class: "num messages" },
    { title: "Bytes", cell: (s) => fmtBytes(s.bytes), class: "num" },
    { title: "Segments", cell: (s) => fmtNum(s.segments), class: "num" },
    { title: "Offsets (partition: start–end)", cell: offsets },
    { title: "Retention", cell: (s) => retention(s.retention_ms) },
  ],
  open: "Browse",
});

const RECORD_COLUMNS = [
  { title: "Partition", cell: (r) => r.partition, class: "num" },
  { title: "Offset", cell: (r) => r.offset, class: "num offset" },
  { title: "Time", cell: (r) => fmtTime(r.timestamp_ms) },
  { title: "Topic", cell: (r) => r.topic ?? el("span", { class: "muted" }, "(Kafka)") },
  { title: "Key", cell: (r) => encoded(r.key, r.key_encoding) },
  { title: "Value", cell: (r) => encoded(r.value, r.value_encoding), class: "value" },
  { title: "Headers", cell: (r) => r.headers.map((h) => `${h.name}=${h.value ?? ""}`).join(", ") },
];

// #/streams/<name>: the stream's counts and its records from an offset.
export const streamBrowser = detailPage("streams", "Stream", (ctx, name, summary) => {
  const records = el("div", { id: "records" });
  const more = el("div", { class: "more" });
  const reader = form("stream-read", [
    { name: "partition", label: "Partition", type: "number", min: 0, value: "0", class: "short" },
    { name: "offset", label: "From offset", type: "number", min: 0, placeholder: "log start", class: "short" },
    { name: "limit", label: "Limit", type: "number", min: 1, value: "50", class: "short" },
  ], "Read", (v) => read(v.partition, v.offset, v.limit));

  function read(partition, offset, limit) {
    return attempt(async () => {
      const page = await call("GET", `/streams/${segment(name)}/messages`, {
        query: { ...ns(ctx), partition, offset, limit },
      });
      records.replaceChildren(table(RECORD_COLUMNS, page.records, {
        empty: `No records from offset ${offset || page.log_start_offset} `
          + `(high watermark ${page.high_watermark}).`,
        key: (r) => `${r.partition}:${r.offset}`,
      }));
      const next = button(`Next from ${page.next_offset}`, () => {
        reader.elements.offset.value = page.next_offset;
        read(partition, page.next_offset, limit);
      });
      more.replaceChildren(el("span", { class: "muted" },
        `log start ${page.log_start_offset}, high watermark ${page.high_watermark} `,
        page.next_offset < page.high_watermark ? next : null));
    });
  }

  async function refresh() {
    const s = await call("GET", `/streams/${segment(name)}`, { query: ns(ctx) });
    reader.elements.partition.max = s.partitions - 1;
    summary.textContent = `${count(s.messages, "message")}, ${fmtBytes(s.bytes)}, `
      + `${count(s.segments, "segment")}; partitions ${offsets(s)}; `
      + `topic filters ${s.topic_filters.join(", ")}`;
  }
  read(0, "", 50);
  return { nodes: [reader, records, more], refresh };
});

export const queues = destinationList("queue", "jobs", {
  settings: [
    { name: "topic_filter", label: "Topic filter", placeholder: "default: the name" },
    { name: "shards", label: "Shards", type: "number", min: 1, placeholder: "4", class: "short" },
    { name: "max_retries", label: "Max retries", type: "number", min: 0, placeholder: "5", class: "short" },
  ],
  body: (v) => ({
    topic_filter: v.topic_filter || undefined,
    shards: optionalInt(v.shards),
    max_retries: optionalInt(v.max_retries),
  }),
  filters: (q) => q.topic_filter,
  columns: [
    { title: "Topic filter", cell: (q) => q.topic_filter },
    { title: "Shards", cell: (q) => q.shards, class: "num" },
    { title: "Ready", cell: (q) => fmtNum(q.ready), class: "num ready" },
    { title: "Unacked", cell: (q) => fmtNum(q.unacked), class: "num" },
    { title: "Consumers", cell: (q) => fmtNum(q.consumers), class: "num" },
    { title: "Bytes", cell: (q) => fmtBytes(q.bytes), class: "num" },
    { title: "Max retries", cell: (q) => q.max_retries, class: "num" },
    { title: "Dead letters to", cell: (q) => q.dead_letter_topic ?? "–" },
  ],
  open: "Peek",
  actions: (q, ctx, refresh) => [
    confirmButton("Purge", `Drop every ready message of queue ${q.name}?`, async () => {
      const done = await call("POST", `/queues/${segment(q.name)}/purge`, { query: ns(ctx) });
      return `Purged ${done.purged} messages from ${q.name}.`;
    }, refresh),
  ],
});

const QUEUE_MESSAGE_COLUMNS = [
  { title: "Seq", cell: (m) => m.seq, class: "num" },
  { title: "Time", cell: (m) => fmtTime(m.timestamp_ms) },
  { title: "Topic", cell: (m) => m.topic },
  { title: "Key", cell: (m) => encoded(m.key, m.key_encoding) },
  { title: "Payload", cell: (m) => encoded(m.payload, m.encoding), class: "value" },
  { title: "Content type", cell: (m) => m.content_type ?? "–" },
  { title: "Redelivered", cell: (m) => (m.redelivered ? "yes" : "no") },
];

// #/queues/<name>: the oldest ready messages, left in the queue.
export const queuePeek = detailPage("queues", "Queue", (ctx, name, summary) => {
  const messages = el("div", { id: "queue-messages" });
  const peeker = form("queue-peek", [
    { name: "limit", label: "Limit", type: "number", min: 1, value: "10", class: "short" },
  ], "Peek", (v) => peek(v.limit));

  function peek(limit) {
    return attempt(async () => {
      const page = await call("GET", `/queues/${segment(name)}/messages`, {
        query: { ...ns(ctx), limit },
      });
      messages.replaceChildren(table(QUEUE_MESSAGE_COLUMNS, page.messages, {
        empty: "No ready messages.",
        key: (m) => String(m.seq),
      }));
    });
  }

  async function refresh() {
    const q = await call("GET", `/queues/${segment(name)}`, { query: ns(ctx) });
    summary.textContent = `${fmtNum(q.ready)} ready, ${fmtNum(q.unacked)} unacked, `
      + `${count(q.consumers, "consumer")} here, ${fmtBytes(q.bytes)}; `
      + `topic filter ${q.topic_filter}`;
  }
  peek(10);
  const hint = el("p", { class: "hint" }, "A peek leaves the messages in the queue.");
  return { nodes: [peeker, hint, messages], refresh };
});
