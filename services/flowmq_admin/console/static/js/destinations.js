// Streams and queues: lists with live counts, create and delete; the message browser (a
// stream read from an offset) and the queue peek.

import { call, segment } from "./api.js";
import {
  attempt, button, count, el, encoded, fmtBytes, fmtNum, fmtTime, form, link, notify, table,
} from "./dom.js";

const ns = (ctx) => ({ namespace: ctx.namespace() });
const optionalInt = (text) => (text === "" ? undefined : Number.parseInt(text, 10));

function confirmDelete(kind, name, ctx, after) {
  return button("Delete", () => attempt(async () => {
    if (!window.confirm(`Delete ${kind} ${name}? Its messages are lost.`)) return;
    await call("DELETE", `/${kind}s/${segment(name)}`, { query: ns(ctx) });
    notify(`Deleted ${kind} ${name}.`);
    await after();
  }), "danger");
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

export const streams = {
  id: "streams",
  title: "Streams",
  mount(view, ctx) {
    const list = el("div", { id: "streams-list" });
    const create = form("stream-create", [
      { name: "name", label: "Name", required: true, placeholder: "orders.eu" },
      { name: "topic_filters", label: "Topic filters", placeholder: "default: orders/eu" },
      { name: "partitions", label: "Partitions", type: "number", min: 1, value: "1", class: "short" },
      { name: "retention_ms", label: "Retention ms", type: "number", placeholder: "7 days", class: "short" },
    ], "Create stream", (v) => attempt(async () => {
      const body = { name: v.name, partitions: optionalInt(v.partitions) };
      if (v.topic_filters) body.topic_filters = v.topic_filters.split(",").map((f) => f.trim());
      if (v.retention_ms) body.retention_ms = optionalInt(v.retention_ms);
      const created = await call("POST", "/streams", { query: ns(ctx), body });
      notify(`Created stream ${created.name} (${created.topic_filters.join(", ")}).`);
      await refresh();
    }));
    view.append(el("h2", {}, "Streams"), create, list);

    async function refresh() {
      const rows = await call("GET", "/streams", { query: ns(ctx) });
      list.replaceChildren(table([
        { title: "Name", cell: (s) => link(`#/streams/${segment(s.name)}`, s.name), class: "name" },
        { title: "Topic filters", cell: (s) => s.topic_filters.join(", ") },
        { title: "Partitions", cell: (s) => s.partitions, class: "num" },
        { title: "Messages", cell: (s) => fmtNum(s.messages), class: "num messages" },
        { title: "Bytes", cell: (s) => fmtBytes(s.bytes), class: "num" },
        { title: "Segments", cell: (s) => fmtNum(s.segments), class: "num" },
        { title: "Offsets (partition: start–end)", cell: offsets },
        { title: "Retention", cell: (s) => retention(s.retention_ms) },
        { title: "", cell: (s) => [
          button("Browse", () => ctx.go(`#/streams/${segment(s.name)}`)),
          confirmDelete("stream", s.name, ctx, refresh),
        ], class: "actions" },
      ], rows, { empty: "No streams in this namespace.", key: (s) => s.name }));
    }
    return { refresh };
  },
};

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
export const streamBrowser = {
  id: "streams",
  title: "Stream",
  mount(view, ctx, name) {
    const summary = el("p", { id: "stream-summary", class: "summary" });
    const records = el("div", { id: "records" });
    const more = el("div", { class: "more" });
    let partitions = 1;
    const reader = form("stream-read", [
      { name: "partition", label: "Partition", type: "number", min: 0, value: "0", class: "short" },
      { name: "offset", label: "From offset", type: "number", min: 0, placeholder: "log start", class: "short" },
      { name: "limit", label: "Limit", type: "number", min: 1, value: "50", class: "short" },
    ], "Read", (v) => read(v.partition, v.offset, v.limit));
    view.append(
      el("h2", {}, "Stream ", el("span", { class: "name" }, name), " ", link("#/streams", "(all streams)")),
      summary, reader, records, more,
    );

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
      partitions = s.partitions;
      reader.elements.partition.max = partitions - 1;
      summary.textContent = `${count(s.messages, "message")}, ${fmtBytes(s.bytes)}, `
        + `${count(s.segments, "segment")}; partitions ${offsets(s)}; `
        + `topic filters ${s.topic_filters.join(", ")}`;
    }
    read(0, "", 50);
    return { refresh };
  },
};

export const queues = {
  id: "queues",
  title: "Queues",
  mount(view, ctx) {
    const list = el("div", { id: "queues-list" });
    const create = form("queue-create", [
      { name: "name", label: "Name", required: true, placeholder: "jobs" },
      { name: "topic_filter", label: "Topic filter", placeholder: "default: the name" },
      { name: "shards", label: "Shards", type: "number", min: 1, placeholder: "4", class: "short" },
      { name: "max_retries", label: "Max retries", type: "number", min: 0, placeholder: "5", class: "short" },
    ], "Create queue", (v) => attempt(async () => {
      const body = { name: v.name };
      if (v.topic_filter) body.topic_filter = v.topic_filter;
      if (v.shards) body.shards = optionalInt(v.shards);
      if (v.max_retries) body.max_retries = optionalInt(v.max_retries);
      const created = await call("POST", "/queues", { query: ns(ctx), body });
      notify(`Created queue ${created.name} (${created.topic_filter}).`);
      await refresh();
    }));
    view.append(el("h2", {}, "Queues"), create, list);

    async function refresh() {
      const rows = await call("GET", "/queues", { query: ns(ctx) });
      list.replaceChildren(table([
        { title: "Name", cell: (q) => link(`#/queues/${segment(q.name)}`, q.name), class: "name" },
        { title: "Topic filter", cell: (q) => q.topic_filter },
        { title: "Shards", cell: (q) => q.shards, class: "num" },
        { title: "Ready", cell: (q) => fmtNum(q.ready), class: "num ready" },
        { title: "Unacked", cell: (q) => fmtNum(q.unacked), class: "num" },
        { title: "Consumers", cell: (q) => fmtNum(q.consumers), class: "num" },
        { title: "Bytes", cell: (q) => fmtBytes(q.bytes), class: "num" },
        { title: "Max retries", cell: (q) => q.max_retries, class: "num" },
        { title: "Dead letters to", cell: (q) => q.dead_letter_topic ?? "–" },
        { title: "", cell: (q) => [
          button("Peek", () => ctx.go(`#/queues/${segment(q.name)}`)),
          button("Purge", () => attempt(async () => {
            if (!window.confirm(`Drop every ready message of queue ${q.name}?`)) return;
            const done = await call("POST", `/queues/${segment(q.name)}/purge`, { query: ns(ctx) });
            notify(`Purged ${done.purged} messages from ${q.name}.`);
            await refresh();
          }), "danger"),
          confirmDelete("queue", q.name, ctx, refresh),
        ], class: "actions" },
      ], rows, { empty: "No queues in this namespace.", key: (q) => q.name }));
    }
    return { refresh };
  },
};

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
export const queuePeek = {
  id: "queues",
  title: "Queue",
  mount(view, ctx, name) {
    const summary = el("p", { id: "queue-summary", class: "summary" });
    const messages = el("div", { id: "queue-messages" });
    const peeker = form("queue-peek", [
      { name: "limit", label: "Limit", type: "number", min: 1, value: "10", class: "short" },
    ], "Peek", (v) => peek(v.limit));
    view.append(
      el("h2", {}, "Queue ", el("span", { class: "name" }, name), " ", link("#/queues", "(all queues)")),
      summary, peeker,
      el("p", { class: "hint" }, "A peek leaves the messages in the queue."),
      messages,
    );

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
    return { refresh };
  },
};
