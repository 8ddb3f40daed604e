"""Fetch (with long poll) and ListOffsets.

Record bytes go out exactly as stored (base offsets already patched by the store).  A Fetch
answers at most min(its ``max_bytes``, ``kafka_fetch_max_bytes``) (Kafka's fetch.max.bytes),
except that the first non-empty partition always gives at least one whole batch (KIP-74), so
a consumer always progresses.  Partitions are read in request order, a few at a time, each
given what is left of that budget (``_read_within``): once it is spent, the rest are not
read at all, so what one Fetch pulls from storage stays near its budget.  While the result
is below ``min_bytes`` it waits on the partitions' high watermarks
(``StreamStore.wait_for_any``) until ``max_wait_ms`` and reads again.  A poll woken by this
broker's own commit reads the chunks that woke it from the page cache
(``StreamStore.fetch_committed``) instead of asking the meta store again: the commit wakes it
and it answers in the same loop turns, with no thread hand-off between the commit and the
answer.  Sessions (KIP-227) are not kept: every answer is a full one with session id 0,
which clients take as "no session" and keep sending full requests.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, NamedTuple

import flowmq_metrics as metrics
from flowmq_broker.kafka.context import RequestContext
from flowmq_broker.kafka.topics import partition_count
from flowmq_core.acl import CONSUME, DESCRIBE, STREAM
from flowmq_kas3.errors import OffsetOutOfRange
from flowmq_kas3.records import iter_batches
from flowmq_kas3.store import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, FetchResult
from flowmq_wire.kafka import ErrorCode

log = logging.getLogger(__name__)

_EMPTY = b""
# Partitions read concurrently (storage round trips overlap); each wave reserves its reads'
# limits out of the budget, so a wave never asks for more than what is left.
_READ_WAVE = 8


class _Want(NamedTuple):
    topic: str
    partition: int
    offset: int
    max_bytes: int
    error: int  # known before reading (unknown topic or partition)


class _Got(NamedTuple):
    error: int
    records: bytes | bytearray
    high_watermark: int
    log_start_offset: int


def _wants(ctx: RequestContext, req: Any) -> list[_Want]:
    topics = ctx.tenant.topics
    access = ctx.conn.access
    wants = []
    for t in req.topics:
        dest = topics.get(t.topic)
        count = partition_count(dest) if dest is not None else 0
        authorized = access.allowed(CONSUME, STREAM, t.topic)
        for p in t.partitions:
            if not authorized:
                error = ErrorCode.TOPIC_AUTHORIZATION_FAILED
            elif 0 <= p.partition < count:
                error = ErrorCode.NONE
            else:
                error = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            wants.append(_Want(t.topic, p.partition, p.fetch_offset, p.partition_max_bytes, error))
    return wants


async def _read(ctx: RequestContext, want: _Want, limit: int) -> _Got:
    if want.error:
        return _Got(want.error, _EMPTY, -1, -1)
    store = ctx.server.services.streams
    try:
        result: FetchResult = await store.fetch(
            ctx.tenant.namespace, want.topic, want.partition, want.offset, max(1, limit)
        )
    except OffsetOutOfRange as exc:
        return _Got(ErrorCode.OFFSET_OUT_OF_RANGE, _EMPTY, exc.high_watermark, exc.log_start_offset)
    except Exception as exc:  # storage trouble: the client retries, as with a Kafka disk error
        log.warning("kafka: fetch %s[%d] failed: %s", want.topic, want.partition, exc)
        return _Got(ErrorCode.KAFKA_STORAGE_ERROR, _EMPTY, -1, -1)
    return _Got(ErrorCode.NONE, result.records, result.high_watermark, result.log_start_offset)


async def _unread(ctx: RequestContext, want: _Want) -> _Got:
    """A partition left out once the budget is spent: no records, its offsets for the
    client's lag (from the meta store alone)."""
    if want.error:
        return _Got(want.error, _EMPTY, -1, -1)
    store = ctx.server.services.streams
    try:
        info = await store.partition_info(ctx.tenant.namespace, want.topic, want.partition)
    except Exception as exc:
        log.warning("kafka: offsets of %s[%d] unavailable: %s", want.topic, want.partition, exc)
        return _Got(ErrorCode.KAFKA_STORAGE_ERROR, _EMPTY, -1, -1)
    return _Got(ErrorCode.NONE, _EMPTY, info.high_watermark, info.log_start_offset)


async def _read_within(
    ctx: RequestContext, wants: list[_Want], budget: int
) -> tuple[list[_Got], bool]:
    """Every partition's answer, reading only while ``budget`` bytes last; and whether
    every partition was read."""
    got: list[_Got] = []
    i, n = 0, len(wants)
    while i < n and budget > 0:
        reads = []
        reserved = 0
        while i < n and len(reads) < _READ_WAVE and reserved < budget:
            want = wants[i]
            limit = min(want.max_bytes, budget - reserved)
            reads.append(_read(ctx, want, limit))
            reserved += max(limit, 0)
            i += 1
        wave = await asyncio.gather(*reads)
        got.extend(wave)
        budget -= sum(len(g.records) for g in wave)
    if i < n:
        got.extend(await asyncio.gather(*(_unread(ctx, w) for w in wants[i:])))
    return got, i == n


def _read_committed(
    ctx: RequestContext, wants: list[_Want], got: list[_Got], budget: int, mark: int
) -> list[_Got] | None:
    """After a long poll woke, the records of the chunks this broker committed since
    ``mark`` (``StreamStore.fetch_committed``) for each partition whose fetch offset was its
    high watermark at the last read, within ``budget`` as ``_read_within`` reads; partitions
    without any keep that read's answer.  None if none has records that way (read the usual
    way).  A read below the high watermark that came back empty (its chunks moved by a
    compaction meanwhile, say) is read again the usual way: starting such a partition at the
    high watermark would skip the records in between."""
    store = ctx.server.services.streams
    ns = ctx.tenant.namespace
    out: list[_Got] = []
    found = False
    for want, g in zip(wants, got, strict=True):
        local = None
        if not g.error and budget > 0 and g.high_watermark == want.offset:
            limit = max(1, min(want.max_bytes, budget))
            local = store.fetch_committed(ns, want.topic, want.partition, want.offset, limit, mark)
        if local is None:
            out.append(g)
            continue
        records, hwm = local
        budget -= len(records)
        found = True
        out.append(_Got(ErrorCode.NONE, records, hwm, g.log_start_offset))
    return out if found else None


async def handle_fetch(ctx: RequestContext, req: Any) -> Any:
    server = ctx.server
    conn = ctx.conn
    if not conn.fetching:
        conn.fetching = True
        server.update_stream_subscriptions()
    resp = ctx.response
    if ctx.version >= 7 and (req.session_id != 0 or req.session_epoch > 0):
        return resp(
            throttle_time_ms=0,
            error_code=ErrorCode.FETCH_SESSION_ID_NOT_FOUND,
            session_id=0,
            responses=[],
        )
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max(req.max_wait_ms, 0) / 1000
    asked = req.max_bytes if ctx.version >= 3 and req.max_bytes > 0 else 1 << 31
    max_bytes = min(asked, server.max_fetch_bytes)
    wants = _wants(ctx, req)
    store = server.services.streams
    ns = ctx.tenant.namespace
    got, complete = await _read_within(ctx, wants, max_bytes)
    while True:
        size = sum(len(g.records) for g in got)
        remaining = deadline - loop.time()
        if size >= req.min_bytes or remaining <= 0 or any(g.error for g in got):
            break
        positions = [
            (ns, w.topic, w.partition, g.high_watermark) for w, g in zip(wants, got, strict=True)
        ]
        mark = store.commit_mark()
        if not await store.wait_for_any(positions, remaining):
            break
        woken = None if size else _read_committed(ctx, wants, got, max_bytes, mark)
        if woken is not None and sum(len(g.records) for g in woken) >= req.min_bytes:
            got = woken  # what this broker just committed: no meta read on the way out
            break
        got, complete = await _read_within(ctx, wants, max_bytes)
    response, trimmed = _response(ctx, wants, got, max_bytes)
    if (trimmed or not complete) and asked > max_bytes:  # the broker's cap, not the client's
        metrics.limits_rejections_count.labels("kafka_fetch_bytes").inc()
        log.info(
            "kafka %s: Fetch of up to %d bytes answered with at most kafka_fetch_max_bytes %d",
            conn.peer, asked, max_bytes,
        )  # fmt: skip
    return response


def _response(
    ctx: RequestContext, wants: list[_Want], got: list[_Got], max_bytes: int
) -> tuple[Any, bool]:
    """The Fetch response, and whether records were left out for ``max_bytes``."""
    resp = ctx.response
    topic_cls = resp.FetchableTopicResponse
    part_cls = topic_cls.PartitionData
    by_topic: dict[str, list[Any]] = {}
    budget = max_bytes
    out_records = out_bytes = 0
    trimmed = False
    for want, g in zip(wants, got, strict=True):
        records = g.records
        if records:
            # The first non-empty partition always goes whole (KIP-74), the others while
            # the request's max_bytes lasts.
            if out_bytes and len(records) > budget:
                records = _EMPTY
                trimmed = True
            else:
                budget -= len(records)
                out_bytes += len(records)
                out_records += sum(info.record_count for info in iter_batches(records))
        by_topic.setdefault(want.topic, []).append(
            part_cls(
                partition_index=want.partition,
                error_code=g.error,
                high_watermark=g.high_watermark,
                last_stable_offset=g.high_watermark,
                log_start_offset=g.log_start_offset,
                aborted_transactions=None,
                preferred_read_replica=-1,
                records=records,
            )
        )
    if out_records:
        ns = ctx.tenant.namespace
        metrics.kafka_messages_out_count.labels(ns).inc(out_records)
        metrics.kafka_messages_out_bytes_count.labels(ns).inc(out_bytes)
    response = resp(
        throttle_time_ms=0,
        error_code=ErrorCode.NONE,
        session_id=0,
        responses=[topic_cls(topic=name, partitions=parts) for name, parts in by_topic.items()],
    )
    return response, trimmed


# -- ListOffsets -------------------------------------------------------------------------------


async def _offset_for(
    ctx: RequestContext, topic: str, partition: int, timestamp: int
) -> tuple[int, int, int]:
    """(error, timestamp, offset) as ListOffsets answers them."""
    if not ctx.conn.access.allowed(DESCRIBE, STREAM, topic):
        return ErrorCode.TOPIC_AUTHORIZATION_FAILED, -1, -1
    dest = ctx.tenant.topics.get(topic)
    if dest is None or not 0 <= partition < partition_count(dest):
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1, -1
    if timestamp < 0 and timestamp not in (LATEST_TIMESTAMP, EARLIEST_TIMESTAMP):
        return ErrorCode.UNSUPPORTED_VERSION, -1, -1
    store = ctx.server.services.streams
    try:
        found = await store.offset_for_timestamp(ctx.tenant.namespace, topic, partition, timestamp)
    except Exception as exc:
        log.warning("kafka: offsets of %s[%d] unavailable: %s", topic, partition, exc)
        return ErrorCode.KAFKA_STORAGE_ERROR, -1, -1
    if found is None:
        return ErrorCode.NONE, -1, -1
    offset, ts = found
    return ErrorCode.NONE, ts, offset


async def handle_list_offsets(ctx: RequestContext, req: Any) -> Any:
    resp = ctx.response
    topic_cls = resp.ListOffsetsTopicResponse
    part_cls = topic_cls.ListOffsetsPartitionResponse
    jobs = [
        (t.name, p.partition_index, _offset_for(ctx, t.name, p.partition_index, p.timestamp))
        for t in req.topics
        for p in t.partitions
    ]
    results = await asyncio.gather(*(job for _, _, job in jobs))
    by_topic: dict[str, list[Any]] = {}
    for (topic, partition, _), (error, ts, offset) in zip(jobs, results, strict=True):
        by_topic.setdefault(topic, []).append(
            part_cls(
                partition_index=partition,
                error_code=error,
                timestamp=ts,
                offset=offset,
                leader_epoch=-1,
            )
        )
    return resp(
        throttle_time_ms=0,
        topics=[topic_cls(name=name, partitions=parts) for name, parts in by_topic.items()],
    )


__all__ = ["handle_fetch", "handle_list_offsets"]
