"""Produce and InitProducerId.

A Produce request is checked and every partition's records submitted to the batcher in
one synchronous pass (``StreamStore.append_nowait``), so all of them can share one flush;
the answer comes when they are all durable.  Only a topic to auto-create or an idempotent
producer this broker has not seen yet on a partition needs a round trip to the meta store
first.

Cross-protocol (DESIGN.md §3): the batches are stored in Stream ``T`` untouched; only when
the canonical topic ``map(T)`` also matches other destinations are they decoded into
messages and routed to those (never to ``T`` again).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Any

import flowmq_metrics as metrics
from flowmq_broker.backpressure import KAFKA_THROTTLE_MS
from flowmq_broker.kafka.context import RequestContext
from flowmq_broker.kafka.idempotence import (
    DuplicateBatch,
    EarlierCopy,
    ProducerBatch,
    SequenceRefused,
    StateKey,
    producer_batch,
)
from flowmq_broker.kafka.topics import TopicError, partition_count
from flowmq_broker.routing import Binding
from flowmq_commit.errors import CommitError
from flowmq_core.acl import CREATE, PRODUCE
from flowmq_core.acl import STREAM as STREAM_RESOURCE
from flowmq_core.errors import FlowMQError
from flowmq_core.mapping import kafka_to_canonical
from flowmq_core.message import Message
from flowmq_kas3.errors import DecompressedTooLarge, InvalidRecordBatch, Kas3Error
from flowmq_kas3.records import BatchesSummary, crc_ok, decode_batches, iter_batches
from flowmq_meta.catalog import STREAM
from flowmq_wire.kafka import ErrorCode

log = logging.getLogger(__name__)

_MAX_EPOCH = 32767


class _Part:
    """One partition of a Produce request on its way to an answer."""

    __slots__ = (
        "batch",
        "copies",
        "error",
        "future",
        "index",
        "key",
        "message",
        "offset",
        "records",
        "earlier",
        "summary",
    )

    def __init__(self, index: int, records: Any) -> None:
        self.index = index
        self.records = records
        self.error: int = ErrorCode.NONE
        self.message: str | None = None
        self.offset = -1
        self.summary: BatchesSummary | None = None
        self.future: asyncio.Future[int] | None = None
        self.batch: ProducerBatch | None = None
        self.key: StateKey | None = None
        self.earlier: EarlierCopy | None = None  # an earlier copy of an idempotent batch
        self.copies = 0  # durable copies routed to other destinations matching its topic

    def fail(self, code: int, message: str | None = None) -> None:
        self.error = code
        self.message = message


class _BatchTooLarge(Exception):
    """A record batch larger than message.max.bytes (MESSAGE_TOO_LARGE)."""


def _validate(records: bytes, max_batch_bytes: int) -> BatchesSummary:
    """What the store needs to know about the chunk (``StreamStore.append_nowait`` takes it
    instead of parsing the batches again); raises ``InvalidRecordBatch`` for bad framing or
    CRC, ``_BatchTooLarge`` for a batch past ``max_batch_bytes``."""
    count = batches = 0
    max_ts = -1
    view = memoryview(records)
    for info in iter_batches(records):
        if info.size > max_batch_bytes:
            raise _BatchTooLarge(
                f"record batch of {info.size} bytes exceeds message.max.bytes {max_batch_bytes}"
            )
        if not crc_ok(view[info.position : info.position + info.size]):
            raise InvalidRecordBatch(f"record batch at byte {info.position} fails its CRC")
        count += info.offset_count
        max_ts = max(max_ts, info.max_timestamp)
        batches += 1
    if count == 0:
        raise InvalidRecordBatch("empty record set")
    return BatchesSummary(count, max_ts, batches)


def _plan(ctx: RequestContext, req: Any) -> tuple[list[tuple[str, list[_Part]]], list[str]]:
    """Parts per topic, and the topics to create first.  Authorization: ``produce`` on the
    stream (TOPIC_AUTHORIZATION_FAILED), and ``create`` to have a missing one auto-created."""
    topics = ctx.tenant.topics
    ns = ctx.tenant.namespace
    access = ctx.conn.access
    max_batch_bytes = ctx.server.max_message_bytes
    plan: list[tuple[str, list[_Part]]] = []
    missing: list[str] = []
    for t in req.topic_data:
        name = t.name
        parts = [_Part(pd.index, pd.records) for pd in t.partition_data]
        plan.append((name, parts))
        if not access.allowed(PRODUCE, STREAM_RESOURCE, name):
            for part in parts:
                part.fail(
                    ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                    f"not authorized to produce to topic {name!r}",
                )
            continue
        dest = topics.get(name)
        if dest is None:
            error = topics.name_error(name)
            if (
                error is None
                and topics.auto_create
                and access.allowed(CREATE, STREAM_RESOURCE, name)
            ):
                missing.append(name)
                continue
            for part in parts:
                if error is not None:
                    part.fail(error.code, error.message)
                else:
                    part.fail(
                        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist"
                    )
            continue
        count = partition_count(dest)
        for part in parts:
            if not 0 <= part.index < count:
                part.fail(
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                    f"topic {name!r} has no partition {part.index}",
                )
                continue
            if not part.records:
                part.fail(ErrorCode.CORRUPT_MESSAGE, "no records")
                continue
            try:
                part.summary = _validate(part.records, max_batch_bytes)
                part.batch = producer_batch(part.records)
            except InvalidRecordBatch as exc:
                part.fail(ErrorCode.CORRUPT_MESSAGE, str(exc))
                continue
            except _BatchTooLarge as exc:  # counted and logged once, in _submit
                part.fail(ErrorCode.MESSAGE_TOO_LARGE, str(exc))
                continue
            if part.batch is not None:
                part.key = (ns, name, part.index, part.batch.producer_id)
    return plan, missing


def _find_earlier_copies(ctx: RequestContext, plan: list[tuple[str, list[_Part]]]) -> None:
    """Idempotent parts this broker knows are already written (or being written here): they
    are answered with that copy's offset instead of being submitted."""
    producers = ctx.server.producers
    for _, parts in plan:
        for part in parts:
            if part.key is not None and not part.error:
                part.earlier = producers.earlier_copy(part.key, part.batch)  # type: ignore[arg-type]


def handle_produce(ctx: RequestContext, req: Any) -> Any:
    if req.acks not in (0, 1, -1):
        return _uniform_error(ctx, req, ErrorCode.INVALID_REQUIRED_ACKS, f"acks={req.acks}")
    if req.transactional_id:
        return _uniform_error(
            ctx,
            req,
            ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
            "transactions are not supported by FlowMQ",
        )
    gate = ctx.conn.produce_gate
    if gate is not None and not gate.done():
        # An earlier request of this connection is still on its way to the batcher; a
        # producer's pipelined batches must reach it in order.
        return _produce_later(ctx, req, gate)
    plan, missing = _plan(ctx, req)
    if missing or _unknown_producers(ctx, plan):
        return _produce_later(ctx, req, None)
    _find_earlier_copies(ctx, plan)
    return _submit(ctx, req, plan)


def _unknown_producers(ctx: RequestContext, plan: list[tuple[str, list[_Part]]]) -> list[Any]:
    producers = ctx.server.producers
    return [
        part.key
        for _, parts in plan
        for part in parts
        if part.key is not None and not part.error and not producers.known(part.key)
    ]


def _produce_later(ctx: RequestContext, req: Any, gate: asyncio.Future[None] | None) -> Any:
    """The slow path (topics to create, producer state to load, an earlier request still
    on it): later requests of the connection queue behind this one until it is submitted."""
    submitted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    ctx.conn.produce_gate = submitted
    return _produce_slowly(ctx, req, gate, submitted)


async def _produce_slowly(
    ctx: RequestContext,
    req: Any,
    gate: asyncio.Future[None] | None,
    submitted: asyncio.Future[None],
) -> Any:
    try:
        if gate is not None:
            await asyncio.wait([gate])
        plan, missing = _plan(ctx, req)
        if missing:
            created = await ctx.tenant.topics.ensure(missing)
            plan, still_missing = _plan(ctx, req)
            for name, parts in plan:
                result = created.get(name)
                if isinstance(result, TopicError):
                    for part in parts:
                        part.fail(result.code, result.message)
                elif name in still_missing:  # deleted again before this request got to it
                    for part in parts:
                        part.fail(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} deleted")
        await _load_producers(ctx, plan, _unknown_producers(ctx, plan))
        _find_earlier_copies(ctx, plan)
        result = _submit(ctx, req, plan)
    finally:
        if not submitted.done():
            submitted.set_result(None)
    return await result if isinstance(result, asyncio.Future) else result


async def _load_producers(
    ctx: RequestContext, plan: list[tuple[str, list[_Part]]], keys: list[Any]
) -> None:
    """Load producer state; if the meta store fails, the parts that needed it fail with a
    retriable error (their flush would fail the same way)."""
    if not keys:
        return
    try:
        await ctx.server.producers.load(keys)
    except Exception as exc:
        log.warning("kafka: cannot load idempotent producer state: %s", exc)
        wanted = set(keys)
        for _, parts in plan:
            for part in parts:
                if part.key in wanted and not part.error:
                    part.fail(ErrorCode.KAFKA_STORAGE_ERROR, "producer state unavailable")


def _submit(ctx: RequestContext, req: Any, plan: list[tuple[str, list[_Part]]]) -> Any:
    server = ctx.server
    streams = server.services.streams
    producers = server.producers
    ns = ctx.tenant.namespace
    routed: list[Any] = []
    in_records = in_bytes = 0
    for name, parts in plan:
        for part in parts:
            if part.error:
                if part.error == ErrorCode.MESSAGE_TOO_LARGE:
                    metrics.limits_rejections_count.labels("kafka_message_bytes").inc()
                    log.info("kafka %s: %s (topic %s); refused", ctx.conn.peer, part.message, name)
                continue
            earlier = part.earlier
            if earlier is not None:
                if isinstance(earlier, int):
                    part.offset = earlier
                else:
                    part.future = earlier
                continue
            try:
                copies = _route_elsewhere(ctx, name, part, req.acks)
                part.copies = len(copies)
                routed.extend(copies)
            except DecompressedTooLarge as exc:
                metrics.limits_rejections_count.labels("kafka_decompressed_bytes").inc()
                log.info("kafka %s: %s (topic %s); refused", ctx.conn.peer, exc, name)
                part.fail(ErrorCode.MESSAGE_TOO_LARGE, str(exc))
                continue
            except InvalidRecordBatch as exc:
                part.fail(ErrorCode.CORRUPT_MESSAGE, str(exc))
                continue
            hook = track = None
            if part.key is not None:
                hook, track = producers.accept(part.key, part.batch)  # type: ignore[arg-type]
            try:
                fut = streams.append_nowait(
                    ns, name, part.index, part.records, on_commit=hook, summary=part.summary
                )
            except (Kas3Error, CommitError) as exc:  # e.g. BatcherClosed
                part.fail(ErrorCode.KAFKA_STORAGE_ERROR, str(exc))
                if track is not None:
                    failed: asyncio.Future[int] = asyncio.get_running_loop().create_future()
                    failed.set_exception(exc)
                    track(failed)
                continue
            if track is not None:
                track(fut)
            part.future = fut
            in_records += part.summary.offset_count  # type: ignore[union-attr]
            in_bytes += len(part.records)
    throttle_ms = 0
    if in_records:
        metrics.kafka_messages_in_count.labels(ns).inc(in_records)
        metrics.kafka_messages_in_bytes_count.labels(ns).inc(in_bytes)
        if server.services.pressure.active:
            # Durable writes lag (backpressure.py): the answer tells the client to back off
            # (KIP-219) and the connection is not read until they catch up.
            throttle_ms = KAFKA_THROTTLE_MS
            ctx.conn.hold_for_pressure()
    waits: list[Any] = [part.future for _, parts in plan for part in parts if part.future]
    if req.acks == 0:
        for fut in waits:
            fut.add_done_callback(_ignore_result)
        if routed:
            asyncio.ensure_future(_log_routing(asyncio.gather(*routed, return_exceptions=True)))
        return None
    if not waits and not routed:
        return _response(ctx, plan)
    loop = asyncio.get_running_loop()
    answer: asyncio.Future[Any] = loop.create_future()
    gathered = asyncio.gather(*waits, *routed, return_exceptions=True)

    def finish(g: asyncio.Future[list[Any]]) -> None:
        if answer.done():  # cancelled: the connection closed while the writes were pending
            return
        try:
            results = g.result()
            _apply(plan, results[: len(waits)])
            _fail_lost_copies(plan, results[len(waits) :])
            answer.set_result(_response(ctx, plan, throttle_ms))
        except BaseException as exc:  # never leave the connection waiting
            answer.set_exception(exc)

    gathered.add_done_callback(finish)
    return answer


def _apply(plan: list[tuple[str, list[_Part]]], results: list[Any]) -> None:
    it = iter(results)
    for _, parts in plan:
        for part in parts:
            if part.future is None:
                continue
            result = next(it)
            if isinstance(result, DuplicateBatch):
                part.offset = result.offset  # a retry: answered as the first write was
            elif isinstance(result, SequenceRefused):
                part.fail(result.error, str(result))
            elif isinstance(result, BaseException):
                part.fail(ErrorCode.KAFKA_STORAGE_ERROR, f"not written: {result}")
            else:
                part.offset = result


def _response(
    ctx: RequestContext, plan: list[tuple[str, list[_Part]]], throttle_ms: int = 0
) -> Any:
    resp = ctx.response
    topic_cls = resp.TopicProduceResponse
    part_cls = topic_cls.PartitionProduceResponse
    return resp(
        responses=[
            topic_cls(
                name=name,
                partition_responses=[
                    part_cls(
                        index=p.index,
                        error_code=p.error,
                        base_offset=p.offset if not p.error else -1,
                        log_append_time_ms=-1,
                        log_start_offset=-1,
                        record_errors=[],
                        error_message=p.message if p.error else None,
                    )
                    for p in parts
                ],
            )
            for name, parts in plan
        ],
        throttle_time_ms=throttle_ms,
    )


def _uniform_error(ctx: RequestContext, req: Any, code: int, message: str) -> Any:
    plan = []
    for t in req.topic_data:
        parts = [_Part(pd.index, None) for pd in t.partition_data]
        for part in parts:
            part.fail(code, message)
        plan.append((t.name, parts))
    return None if req.acks == 0 else _response(ctx, plan)


def _ignore_result(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()


# -- cross-protocol routing --------------------------------------------------------------------


def _route_elsewhere(ctx: RequestContext, name: str, part: _Part, acks: int) -> list[Any]:
    """Route the records to the other destinations matching ``map(name)``; returns the
    awaitables of the durable ones.  Decoding (and decompressing) happens only here."""
    server = ctx.server
    router = server.services.router
    ns = ctx.tenant.namespace
    canonical = kafka_to_canonical(name)
    own = Binding(STREAM, ns, name)
    matched = router.match(ns, canonical)
    if not matched or (len(matched) == 1 and own in matched):
        return []
    pending: list[Any] = []
    qos = 1 if acks else 0
    # Decompressed only here, and never to more than message.max.bytes per batch.
    for record in decode_batches(part.records, max_size=server.max_message_bytes):
        message = Message(
            topic=canonical,
            payload=record.value if record.value is not None else b"",
            qos=qos,
            headers=[(k, v if v is not None else b"") for k, v in record.headers],
            timestamp_ms=record.timestamp,
            key=record.key,
            source_protocol="kafka",
        )
        try:
            _, durable = router.dispatch(ns, message, exclude=own)
        except FlowMQError as exc:
            log.warning("kafka: could not route %s to other destinations: %s", canonical, exc)
            return pending
        pending.extend(durable)
    return pending


def _fail_lost_copies(plan: list[tuple[str, list[_Part]]], results: list[Any]) -> None:
    """Acknowledge what is stored (DESIGN.md §13): a partition whose records reached its
    stream but not every other destination matching its topic is answered with a storage
    error, so the producer retries rather than trusting a copy that is not there."""
    it = iter(results)
    for _, parts in plan:
        for part in parts:
            failed = [r for r in itertools.islice(it, part.copies) if isinstance(r, BaseException)]
            if failed and not part.error:
                part.fail(
                    ErrorCode.KAFKA_STORAGE_ERROR,
                    f"not written to every destination matching the topic: {failed[0]}",
                )


def _log_routing_results(results: list[Any]) -> None:
    for result in results:
        if isinstance(result, BaseException):
            log.warning("kafka: a routed copy was not stored: %s", result)


async def _log_routing(gathered: Any) -> None:
    _log_routing_results(await gathered)


# -- InitProducerId ----------------------------------------------------------------------------


def handle_init_producer_id(ctx: RequestContext, req: Any) -> Any:
    resp = ctx.response
    if req.transactional_id:
        return resp(
            throttle_time_ms=0,
            error_code=ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
            producer_id=-1,
            producer_epoch=-1,
        )
    if not ctx.conn.access.may_any(PRODUCE, STREAM_RESOURCE):
        # Kafka (KIP-679): an idempotent producer needs WRITE on some topic.
        return resp(
            throttle_time_ms=0,
            error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
            producer_id=-1,
            producer_epoch=-1,
        )
    pid = req.producer_id if ctx.version >= 3 else -1
    epoch = req.producer_epoch if ctx.version >= 3 else -1
    if pid is not None and pid >= 0 and epoch is not None and 0 <= epoch < _MAX_EPOCH:
        # KIP-360: a producer bumps its own epoch to reset its sequences.
        return resp(throttle_time_ms=0, error_code=0, producer_id=pid, producer_epoch=epoch + 1)
    return _new_producer_id(ctx)


async def _new_producer_id(ctx: RequestContext) -> Any:
    pid = await ctx.server.producers.allocate_id()
    return ctx.response(throttle_time_ms=0, error_code=0, producer_id=pid, producer_epoch=0)


__all__ = ["handle_init_producer_id", "handle_produce"]
