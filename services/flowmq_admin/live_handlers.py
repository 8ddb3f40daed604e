"""Handlers of the operations endpoints: health and readiness (no token), stream and queue
reads, queue purge, consumer groups and client connections.  As in ``handlers``, each
returns the ``data`` of the success envelope and raises for an error answer."""

from __future__ import annotations

import base64
from typing import Any

from aiohttp import web

from flowmq_admin import live_schemas
from flowmq_admin.envelope import ApiError
from flowmq_admin.handlers import AdminBackend, StreamRead, namespace_of
from flowmq_admin.operations import PARAMS_KEY
from flowmq_admin.validation import read_json_body
from flowmq_core.message import Message
from flowmq_core.version import flowmq_version
from flowmq_kas3.records import Record
from flowmq_meta.catalog import QUEUE, STREAM

TOPIC_HEADER = "flowmq.topic"  # the canonical topic of a routed message, in stream records


def param(request: web.Request, name: str, default: Any = None) -> Any:
    """A query parameter as the operation table typed it (``app._check_params`` parsed it)."""
    return request.get(PARAMS_KEY, {}).get(name, default)


def encoded(data: bytes | None) -> tuple[str | None, str]:
    """``(text, "utf8")`` for UTF-8 data, else ``(base64 text, "base64")``."""
    if data is None:
        return None, "utf8"
    try:
        return bytes(data).decode("utf-8"), "utf8"
    except UnicodeDecodeError:
        return base64.b64encode(data).decode("ascii"), "base64"


def _headers(pairs: list[tuple[str, bytes | None]]) -> list[dict[str, Any]]:
    out = []
    for name, value in pairs:
        text, encoding = encoded(value)
        out.append({"name": name, "value": text, "encoding": encoding})
    return out


# --- health and readiness -----------------------------------------------------------------
async def health(request: web.Request, backend: AdminBackend) -> Any:
    return {"status": "ok", "node_id": backend.node_id, "version": flowmq_version()}


async def ready(request: web.Request, backend: AdminBackend) -> Any:
    checks = await backend.readiness_checks()
    failed = [name for name, check in checks.items() if not check["ok"]]
    if failed:
        reasons = "; ".join(f"{name}: {checks[name]['error']}" for name in failed)
        raise ApiError("not_ready", f"not ready: {reasons}", {"failed": failed, "checks": checks})
    return {"status": "ready", "node_id": backend.node_id, "checks": checks}


# --- stream reads -------------------------------------------------------------------------
def _record_view(partition: int, record: Record) -> dict[str, Any]:
    topic = None
    headers = []
    for name, value in record.headers:
        if name == TOPIC_HEADER and topic is None and value is not None:
            topic = bytes(value).decode("utf-8", "replace")
        else:
            headers.append((name, value))
    key, key_encoding = encoded(record.key)
    value, value_encoding = encoded(record.value)
    return {
        "partition": partition,
        "offset": record.offset,
        "timestamp_ms": record.timestamp,
        "topic": topic,
        "key": key,
        "key_encoding": key_encoding,
        "value": value,
        "value_encoding": value_encoding,
        "headers": _headers(headers),
    }


async def read_stream(request: web.Request, backend: AdminBackend) -> Any:
    namespace = namespace_of(request)
    name = request.match_info["name"]
    dest = await backend.catalog.get_destination(namespace, name, STREAM)
    partition = param(request, "partition", 0)
    partitions = int(dest.options.get("partitions", 1))
    if partition >= partitions:
        raise ApiError(
            "invalid_partition",
            f"stream {name!r} has {partitions} partition(s): no partition {partition}",
        )
    read = await backend.read_stream(
        StreamRead(
            namespace,
            name,
            partition,
            offset=param(request, "offset"),
            limit=param(request, "limit", 100),
            wait_ms=param(request, "wait_ms", 0),
        )
    )
    return {
        "stream": name,
        "namespace": namespace,
        "partition": partition,
        "records": [_record_view(partition, r) for r in read["records"]],
        "next_offset": read["next_offset"],
        "high_watermark": read["high_watermark"],
        "log_start_offset": read["log_start_offset"],
    }


# --- queue reads and purge ------------------------------------------------------------------
def _queue_message_view(item: dict[str, Any]) -> dict[str, Any]:
    message: Message = item["message"]
    payload, encoding = encoded(message.payload)
    key, key_encoding = encoded(message.key)
    return {
        "seq": item["seq"],
        "redelivered": item["redelivered"],
        "topic": message.topic,
        "timestamp_ms": message.timestamp_ms,
        "key": key,
        "key_encoding": key_encoding,
        "payload": payload,
        "encoding": encoding,
        "content_type": message.content_type,
        "headers": _headers(list(message.headers)),
    }


async def _queue(request: web.Request, backend: AdminBackend) -> tuple[str, str]:
    namespace = namespace_of(request)
    name = request.match_info["name"]
    await backend.catalog.get_destination(namespace, name, QUEUE)
    return namespace, name


async def peek_queue(request: web.Request, backend: AdminBackend) -> Any:
    namespace, name = await _queue(request, backend)
    found = await backend.peek_queue(namespace, name, param(request, "limit", 10))
    return {
        "queue": name,
        "namespace": namespace,
        "messages": [_queue_message_view(item) for item in found],
    }


async def take_from_queue(request: web.Request, backend: AdminBackend) -> Any:
    body = await read_json_body(request, live_schemas.QUEUE_TAKE)
    namespace, name = await _queue(request, backend)
    taken = await backend.take_from_queue(namespace, name, body.get("max_messages", 1))
    return {
        "queue": name,
        "namespace": namespace,
        "messages": [_queue_message_view(item) for item in taken],
    }


async def purge_queue(request: web.Request, backend: AdminBackend) -> Any:
    namespace, name = await _queue(request, backend)
    purged = await backend.purge_queue(namespace, name)
    return {"queue": name, "namespace": namespace, "purged": purged}


# --- consumer groups ----------------------------------------------------------------------
async def list_groups(request: web.Request, backend: AdminBackend) -> Any:
    namespace = namespace_of(request)
    await backend.catalog.get_namespace(namespace)
    return await backend.groups(namespace)


async def get_group(request: web.Request, backend: AdminBackend) -> Any:
    namespace = namespace_of(request)
    await backend.catalog.get_namespace(namespace)
    return await backend.group(namespace, request.match_info["group"])


async def reset_group_offsets(request: web.Request, backend: AdminBackend) -> Any:
    body = await read_json_body(request, live_schemas.GROUP_RESET)
    namespace = namespace_of(request)
    await backend.catalog.get_namespace(namespace)
    return await backend.reset_group_offsets(
        namespace, request.match_info["group"], body["stream"], body["to"], body.get("partition")
    )


# --- clients ------------------------------------------------------------------------------
async def list_clients(request: web.Request, backend: AdminBackend) -> Any:
    protocol = param(request, "protocol")
    found = backend.clients()
    return [c for c in found if protocol is None or c["protocol"] == protocol]


async def disconnect_client(request: web.Request, backend: AdminBackend) -> Any:
    """By connection id (``mqtt:127.0.0.1:50412``), or by MQTT client identifier."""
    wanted = request.match_info["id"]
    found = backend.clients()
    ids = [c["id"] for c in found if c["id"] == wanted]
    if not ids:
        ids = [c["id"] for c in found if c["protocol"] == "mqtt" and c["client_id"] == wanted]
    done = [connection_id for connection_id in ids if backend.disconnect_client(connection_id)]
    if not done:
        raise ApiError("not_found", f"no client connection {wanted!r} on this broker")
    return {"disconnected": done}
