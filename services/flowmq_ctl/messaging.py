"""``flowmq produce`` and ``flowmq consume``: messages in and out over the admin API.

Produce publishes to a topic with the HTTP publish endpoint (``-m`` messages, else one per line
of standard input, sent in batches), so the message is routed exactly as an MQTT publish would
be: to every Stream, Queue and Subscription whose filter matches.

Consume reads a Stream (``GET /streams/{name}/messages``, partition by partition, long polls
while idle) or takes from a Queue (``POST /queues/{name}/messages/take``: taken messages are
gone), one message per line.  A Stream read starts at the end unless ``--from-beginning``,
``--offset`` or a ``--group`` with committed offsets says otherwise; with ``--group`` the
position is committed after each batch printed (through ``reset-offsets``, so it is refused
while Kafka consumers of the group are live).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from typing import Any

from flowmq_ctl.client import Refused, UsageError, quote
from flowmq_ctl.context import Context
from flowmq_ctl.output import emit, emit_line

BATCH = 500  # messages per publish request (the API takes up to 1000)
PAGE = 100  # records per read request
IDLE_POLL_MS = 500  # long poll while every partition is caught up
QUEUE_POLL_S = 0.5


# --- produce ----------------------------------------------------------------------------------
def _headers(given: list[str] | None) -> dict[str, str]:
    headers = {}
    for item in given or ():
        for pair in item.split(","):
            name, sep, value = pair.partition("=")
            if not sep or not name:
                raise UsageError(f"--headers takes name=value pairs; got {pair!r}")
            headers[name] = value
    return headers


def _payloads(args: argparse.Namespace) -> Iterator[str]:
    if args.message:
        yield from args.message
        return
    for line in sys.stdin:
        yield line.rstrip("\n")


def produce(args: argparse.Namespace, ctx: Context) -> int:
    topic = args.topic or args.dest
    if not topic:
        raise UsageError("give the topic to publish to: flowmq produce TOPIC (or --topic TOPIC)")
    template: dict[str, Any] = {"qos": args.qos}
    if args.key is not None:
        template["key"] = args.key
    if args.retain:
        template["retain"] = True
    headers = _headers(args.headers)
    if headers:
        template["headers"] = headers
    path = f"/topics/{quote(topic, safe='/')}/messages/batch"
    sent = 0
    destinations: dict[tuple[str, str], None] = {}
    batch: list[dict[str, Any]] = []

    def flush() -> None:
        nonlocal sent
        if not batch:
            return
        result = ctx.api.call("POST", path, {"messages": batch}, ctx.ns_query)
        for item in result["results"]:
            for dest in item["destinations"]:
                destinations[(dest["type"], dest["name"])] = None
        sent += len(batch)
        batch.clear()

    for payload in _payloads(args):
        batch.append({**template, "payload": payload})
        if len(batch) >= BATCH:
            flush()
    flush()
    reached = [{"type": t, "name": n} for t, n in destinations]
    summary = {"topic": topic, "published": sent, "destinations": reached}
    if ctx.fmt == "table":
        names = ", ".join(f"{d['type']} {d['name']}" for d in reached) or "no stored destination"
        ctx.out.write(f"published {sent} message(s) to {topic} → {names}\n")
    else:
        emit(summary, ctx.fmt)
    return 0


# --- consume ----------------------------------------------------------------------------------
class _Budget:
    """``--num`` (stop after N) and ``--timeout`` (stop after S seconds without a message)."""

    def __init__(self, num: int | None, timeout: float | None) -> None:
        self.left = num
        self.timeout = timeout
        self.last = time.monotonic()

    def take(self, n: int) -> None:
        if n:
            self.last = time.monotonic()
        if self.left is not None:
            self.left -= n

    @property
    def room(self) -> int:
        return PAGE if self.left is None else max(0, min(PAGE, self.left))

    @property
    def done(self) -> bool:
        if self.left is not None and self.left <= 0:
            return True
        return self.timeout is not None and time.monotonic() - self.last >= self.timeout

    def wait_ms(self) -> int:
        if self.timeout is None:
            return IDLE_POLL_MS
        left = self.timeout - (time.monotonic() - self.last)
        return max(0, min(IDLE_POLL_MS, int(left * 1000)))


def _kind(args: argparse.Namespace, ctx: Context) -> str:
    if args.type:
        return args.type
    for kind in ("stream", "queue"):
        try:
            ctx.api.call("GET", f"/{kind}s/{quote(args.dest)}", query=ctx.ns_query)
            return kind
        except Refused as exc:
            if exc.status != 404:
                raise
    raise Refused(f"no stream or queue named {args.dest!r}", 404, "not_found")


def _show_record(ctx: Context, record: dict[str, Any], print_key: bool) -> None:
    text = record["value"] if record["value"] is not None else ""
    if print_key:
        text = f"{record['key'] if record['key'] is not None else ''}\t{text}"
    emit_line(record, ctx.fmt, text, ctx.out)


def consume(args: argparse.Namespace, ctx: Context) -> int:
    budget = _Budget(args.num, args.timeout)
    if _kind(args, ctx) == "queue":
        if args.group or args.offset is not None or args.from_beginning:
            raise UsageError("--group, --offset and --from-beginning apply to streams only")
        return _consume_queue(args, ctx, budget)
    return _consume_stream(args, ctx, budget)


def _consume_queue(args: argparse.Namespace, ctx: Context, budget: _Budget) -> int:
    base = f"/queues/{quote(args.dest)}/messages"
    while not budget.done:
        if args.peek:
            found = ctx.api.call("GET", base, query={**ctx.ns_query, "limit": budget.room})
        else:
            body = {"max_messages": budget.room}
            found = ctx.api.call("POST", base + "/take", body, ctx.ns_query)
        for message in found["messages"]:
            text = message["payload"]
            if args.print_key:
                text = f"{message['key'] if message['key'] is not None else ''}\t{text}"
            emit_line(message, ctx.fmt, text, ctx.out)
        budget.take(len(found["messages"]))
        if args.peek:
            return 0
        if not found["messages"] and not budget.done:
            time.sleep(min(QUEUE_POLL_S, budget.wait_ms() / 1000 or QUEUE_POLL_S))
    return 0


def _start_offsets(
    args: argparse.Namespace, ctx: Context, stream: dict[str, Any], partitions: list[int]
) -> dict[int, int]:
    starts, ends = stream["start_offsets"], stream["end_offsets"]
    committed: dict[int, int] = {}
    if args.group:
        try:
            group = ctx.api.call("GET", f"/groups/{quote(args.group)}", query=ctx.ns_query)
        except Refused as exc:
            if exc.status != 404:
                raise
        else:
            committed = {
                o["partition"]: o["committed_offset"]
                for o in group["offsets"]
                if o["stream"] == args.dest
            }
    offsets = {}
    for p in partitions:
        if args.offset is not None:
            offsets[p] = min(max(args.offset, starts[p]), ends[p])
        elif p in committed:
            offsets[p] = min(max(committed[p], starts[p]), ends[p])
        else:
            offsets[p] = starts[p] if args.from_beginning else ends[p]
    return offsets


def _consume_stream(args: argparse.Namespace, ctx: Context, budget: _Budget) -> int:
    name = quote(args.dest)
    stream = ctx.api.call("GET", f"/streams/{name}", query=ctx.ns_query)
    count = stream["partitions"]
    if args.partition is not None and not 0 <= args.partition < count:
        raise UsageError(
            f"stream {args.dest} has {count} partition(s): no partition {args.partition}"
        )
    partitions = [args.partition] if args.partition is not None else list(range(count))
    offsets = _start_offsets(args, ctx, stream, partitions)
    idle_round = False
    while not budget.done:
        got_any = False
        for p in partitions:
            if budget.done:
                break
            query = {
                **ctx.ns_query,
                "partition": p,
                "offset": offsets[p],
                "limit": budget.room,
                "wait_ms": budget.wait_ms() if idle_round and len(partitions) == 1 else 0,
            }
            page = ctx.api.call("GET", f"/streams/{name}/messages", query=query, timeout=60)
            for record in page["records"]:
                _show_record(ctx, record, args.print_key)
            budget.take(len(page["records"]))
            if page["next_offset"] != offsets[p]:
                offsets[p] = page["next_offset"]
                if args.group:
                    body = {"stream": args.dest, "to": offsets[p], "partition": p}
                    ctx.api.call(
                        "POST", f"/groups/{quote(args.group)}/reset-offsets", body, ctx.ns_query
                    )
            got_any = got_any or bool(page["records"])
        if not got_any and len(partitions) > 1 and not budget.done:
            time.sleep(min(IDLE_POLL_MS, budget.wait_ms() or IDLE_POLL_MS) / 1000 / 2)
        idle_round = not got_any
    return 0
