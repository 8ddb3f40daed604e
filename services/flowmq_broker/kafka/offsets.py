"""OffsetCommit and OffsetFetch: committed offsets in the meta store (``GroupOffsetStore``),
acknowledged once the batched transaction holding them is durable; who may commit is the
group coordinator's call, and the write transaction checks the commit's generation again
against the group's stored one (ILLEGAL_GENERATION if the group rebalanced meanwhile)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from flowmq_broker.kafka.context import RequestContext
from flowmq_broker.kafka.coordinator import valid_group_id
from flowmq_broker.kafka.topics import partition_count
from flowmq_core.acl import CONSUME, DESCRIBE, GROUP, STREAM
from flowmq_core.message import now_ms
from flowmq_meta.group_offsets import CommittedOffset, StaleGeneration
from flowmq_wire.kafka import ErrorCode

log = logging.getLogger(__name__)

_V = TypeVar("_V")

# Kafka's offset.metadata.max.bytes.
MAX_OFFSET_METADATA = 4096


def handle_offset_commit(ctx: RequestContext, req: Any) -> Any:
    server = ctx.server
    resp = ctx.response
    topic_cls = resp.OffsetCommitResponseTopic
    part_cls = topic_cls.OffsetCommitResponsePartition
    access = ctx.conn.access
    if not access.allowed(CONSUME, GROUP, req.group_id):
        group_error = ErrorCode.GROUP_AUTHORIZATION_FAILED
    elif not server.owns_group(req.group_id):
        group_error = ErrorCode.NOT_COORDINATOR
    elif not valid_group_id(req.group_id):
        group_error = ErrorCode.INVALID_GROUP_ID
    else:
        group_error = ctx.tenant.coordinator.check_commit(
            req.group_id, req.generation_id_or_member_epoch, req.member_id or ""
        )
    stamp = now_ms()
    results: list[tuple[str, list[tuple[int, int]]]] = []
    entries = []
    for t in req.topics:
        dest = ctx.tenant.topics.get(t.name)
        count = partition_count(dest) if dest is not None else 0
        topic_allowed = access.allowed(CONSUME, STREAM, t.name)
        codes = []
        for p in t.partitions:
            code = group_error
            if not code:
                if not topic_allowed:
                    code = ErrorCode.TOPIC_AUTHORIZATION_FAILED
                elif not 0 <= p.partition_index < count:
                    code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                elif (
                    p.committed_metadata is not None
                    and len(p.committed_metadata) > MAX_OFFSET_METADATA
                ):
                    code = ErrorCode.OFFSET_METADATA_TOO_LARGE
                else:
                    epoch = p.committed_leader_epoch if ctx.version >= 6 else -1
                    entries.append(
                        (
                            t.name,
                            p.partition_index,
                            CommittedOffset(p.committed_offset, p.committed_metadata, epoch, stamp),
                        )
                    )
            codes.append((p.partition_index, code))
        results.append((t.name, codes))

    def build(error: int) -> Any:
        return resp(
            throttle_time_ms=0,
            topics=_topics(
                topic_cls,
                results,
                lambda i, code: part_cls(partition_index=i, error_code=code or error),
            ),
        )

    if not entries:
        return build(ErrorCode.NONE)
    generation = req.generation_id_or_member_epoch
    written = server.offsets.commit(ctx.tenant.namespace, req.group_id, entries, generation)
    answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    def done(fut: asyncio.Future[None]) -> None:
        error = ErrorCode.NONE
        if fut.cancelled():
            error = ErrorCode.COORDINATOR_NOT_AVAILABLE
        elif isinstance(fut.exception(), StaleGeneration):
            error = ErrorCode.ILLEGAL_GENERATION
            # Passed the coordinator's check: its own generation is the stale one.
            ctx.tenant.coordinator.generation_superseded(req.group_id, generation)
        elif fut.exception() is not None:
            error = ErrorCode.COORDINATOR_NOT_AVAILABLE
        answer.set_result(build(error))

    written.add_done_callback(done)
    return answer


async def _group_offsets(
    ctx: RequestContext, group_id: str, topics: list[tuple[str, list[int]]] | None
) -> tuple[int, list[tuple[str, list[tuple[int, CommittedOffset | None]]]]]:
    server = ctx.server
    access = ctx.conn.access
    if not access.allowed(DESCRIBE, GROUP, group_id):
        return ErrorCode.GROUP_AUTHORIZATION_FAILED, []
    if not server.owns_group(group_id):
        return ErrorCode.NOT_COORDINATOR, []
    wanted = None if topics is None else [(name, p) for name, parts in topics for p in parts]
    try:
        found = await server.offsets.fetch(ctx.tenant.namespace, group_id, wanted)
    except Exception as exc:
        log.warning("kafka: cannot read the offsets of group %s: %s", group_id, exc)
        return ErrorCode.COORDINATOR_NOT_AVAILABLE, []
    if topics is None:  # as Kafka: the topics it may not describe are left out
        by_topic: dict[str, list[tuple[int, CommittedOffset | None]]] = {}
        for (stream, partition), committed in sorted(found.items()):
            if access.allowed(DESCRIBE, STREAM, stream):
                by_topic.setdefault(stream, []).append((partition, committed))
        return ErrorCode.NONE, list(by_topic.items())
    return ErrorCode.NONE, [
        (
            name,
            [
                (p, found.get((name, p)) if access.allowed(DESCRIBE, STREAM, name) else _REFUSED)
                for p in parts
            ],
        )
        for name, parts in topics
    ]


async def handle_offset_fetch(ctx: RequestContext, req: Any) -> Any:
    resp = ctx.response
    if ctx.version >= 8:
        group_cls = resp.OffsetFetchResponseGroup
        topic_cls = group_cls.OffsetFetchResponseTopics
        part_cls = topic_cls.OffsetFetchResponsePartitions
        groups = []
        for g in req.groups:
            topics = None if g.topics is None else [(t.name, t.partition_indexes) for t in g.topics]
            error, found = await _group_offsets(ctx, g.group_id, topics)
            groups.append(
                group_cls(
                    group_id=g.group_id,
                    topics=_topics(topic_cls, found, lambda p, c: _partition(part_cls, p, c)),
                    error_code=error,
                )
            )
        return resp(throttle_time_ms=0, groups=groups)
    topic_cls = resp.OffsetFetchResponseTopic
    part_cls = topic_cls.OffsetFetchResponsePartition
    topics = None if req.topics is None else [(t.name, t.partition_indexes) for t in req.topics]
    error, found = await _group_offsets(ctx, req.group_id, topics)
    if error and ctx.version < 2:  # no top-level error code before v2
        found = [(name, [(p, None) for p in parts]) for name, parts in (topics or [])]
    part_error = error if ctx.version < 2 else 0  # v0-1: the error is per partition
    return resp(
        throttle_time_ms=0,
        topics=_topics(topic_cls, found, lambda p, c: _partition(part_cls, p, c, part_error)),
        error_code=error,
    )


def _topics(
    topic_cls: Any,
    rows: Iterable[tuple[str, list[tuple[int, _V]]]],
    partition: Callable[[int, _V], Any],
) -> list[Any]:
    """Response topics from ``(name, [(partition index, value)])`` rows, each partition
    built by ``partition(index, value)``."""
    return [
        topic_cls(name=name, partitions=[partition(i, value) for i, value in parts])
        for name, parts in rows
    ]


# A requested topic the client may not describe: TOPIC_AUTHORIZATION_FAILED for its partitions.
_REFUSED = CommittedOffset(-1, None, -1, -1)


def _partition(cls: Any, partition: int, committed: CommittedOffset | None, error: int = 0) -> Any:
    if committed is _REFUSED:
        error = ErrorCode.TOPIC_AUTHORIZATION_FAILED
        committed = None
    if committed is None:
        return cls(
            partition_index=partition,
            committed_offset=-1,
            committed_leader_epoch=-1,
            metadata="",
            error_code=error,
        )
    return cls(
        partition_index=partition,
        committed_offset=committed.offset,
        committed_leader_epoch=committed.leader_epoch,
        metadata=committed.metadata if committed.metadata is not None else "",
        error_code=error,
    )


__all__ = ["handle_offset_commit", "handle_offset_fetch"]
