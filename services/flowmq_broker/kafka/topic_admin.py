"""CreateTopics, DeleteTopics, CreatePartitions."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from flowmq_broker.kafka.context import RequestContext
from flowmq_broker.kafka.topics import TopicError, partition_count
from flowmq_core.acl import ADMIN, CREATE, DELETE, STREAM
from flowmq_wire.kafka import ErrorCode

log = logging.getLogger(__name__)


async def _outcome(job: Any) -> tuple[int, str | None, Any]:
    try:
        return ErrorCode.NONE, None, await job
    except TopicError as exc:
        return exc.code, exc.message, None
    except Exception as exc:  # the catalog or the meta store failed
        log.warning("kafka: topic operation failed: %s", exc)
        return ErrorCode.UNKNOWN_SERVER_ERROR, str(exc), None


async def handle_create_topics(ctx: RequestContext, req: Any) -> Any:
    topics = ctx.tenant.topics
    resp = ctx.response
    seen: dict[str, int] = {}
    for t in req.topics:
        seen[t.name] = seen.get(t.name, 0) + 1
    jobs = []
    access = ctx.conn.access
    for t in req.topics:
        if not access.allowed(CREATE, STREAM, t.name):
            jobs.append(
                _fail(ErrorCode.TOPIC_AUTHORIZATION_FAILED, f"not authorized to create {t.name!r}")
            )
        elif seen[t.name] > 1:
            jobs.append(_fail(ErrorCode.INVALID_REQUEST, f"topic {t.name!r} is listed twice"))
        elif t.assignments:
            jobs.append(
                _fail(ErrorCode.INVALID_REQUEST, "manual replica assignment is not supported")
            )
        else:
            configs = [(c.name, c.value) for c in t.configs]
            jobs.append(
                _outcome(
                    topics.create(
                        t.name, t.num_partitions, configs, validate_only=bool(req.validate_only)
                    )
                )
            )
    results = await asyncio.gather(*jobs)
    out = []
    for t, (code, message, dest) in zip(req.topics, results, strict=True):
        fields: dict[str, Any] = {}
        if dest is not None:
            fields = {
                "num_partitions": partition_count(dest),
                "replication_factor": 1,
                "configs": [],
            }
            if ctx.version >= 7 and not req.validate_only:
                fields["topic_id"] = topics.topic_id(dest)
        else:
            fields = {"num_partitions": -1, "replication_factor": -1, "configs": []}
        out.append(
            resp.CreatableTopicResult(name=t.name, error_code=code, error_message=message, **fields)
        )
    return resp(throttle_time_ms=0, topics=out)


async def _fail(code: int, message: str) -> tuple[int, str | None, Any]:
    return code, message, None


async def handle_delete_topics(ctx: RequestContext, req: Any) -> Any:
    topics = ctx.tenant.topics
    resp = ctx.response
    if ctx.version >= 6:
        wanted = []
        for t in req.topics:
            name = t.name
            if name is None and t.topic_id is not None:
                dest = topics.by_id(t.topic_id)
                name = dest.name if dest is not None else None
            wanted.append((name, t.topic_id))
    else:
        wanted = [(name, None) for name in req.topic_names]
    out = []
    for name, tid in wanted:
        if name is None:
            code, message = ErrorCode.UNKNOWN_TOPIC_ID, "no topic has this id"
        elif not ctx.conn.access.allowed(DELETE, STREAM, name):
            code, message = (
                ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                f"not authorized to delete {name!r}",
            )
        else:
            code, message, _ = await _outcome(topics.delete(name))
        out.append(
            resp.DeletableTopicResult(
                name=name, topic_id=tid, error_code=code, error_message=message
            )
        )
    return resp(throttle_time_ms=0, responses=out)


async def handle_create_partitions(ctx: RequestContext, req: Any) -> Any:
    topics = ctx.tenant.topics
    resp = ctx.response
    out = []
    for t in req.topics:
        if not ctx.conn.access.allowed(ADMIN, STREAM, t.name):  # Kafka's ALTER on the topic
            code, message = (
                ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                f"not authorized to alter {t.name!r}",
            )
        elif t.assignments:
            code, message = ErrorCode.INVALID_REQUEST, "manual replica assignment is not supported"
        else:
            code, message, _ = await _outcome(
                topics.add_partitions(t.name, t.count, validate_only=bool(req.validate_only))
            )
        out.append(
            resp.CreatePartitionsTopicResult(name=t.name, error_code=code, error_message=message)
        )
    return resp(throttle_time_ms=0, results=out)


__all__ = ["handle_create_partitions", "handle_create_topics", "handle_delete_topics"]
