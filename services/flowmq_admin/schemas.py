"""JSON Schemas of the admin API's bodies: used to validate requests and, unchanged, as the
OpenAPI document's components, so the document cannot drift from what the handlers accept.

They are built by the small functions below (``obj``, ``text``, ``int_range``, …), each of
which writes one JSON Schema shape the same way everywhere."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from flowmq_core.acl import ACTIONS, EFFECTS
from flowmq_core.limits import MAX_TOPIC_BYTES

Schema = dict[str, Any]

# --- builders ----------------------------------------------------------------------------
STRING: Schema = {"type": "string"}
INTEGER: Schema = {"type": "integer"}
BOOLEAN: Schema = {"type": "boolean"}
NULLABLE_STRING: Schema = {"type": ["string", "null"]}
NULLABLE_INTEGER: Schema = {"type": ["integer", "null"]}


def _with(schema: Schema, description: str | None, keywords: dict[str, Any]) -> Schema:
    """``schema`` with more keywords and, last, its description (when it has one)."""
    schema.update(keywords)
    if description is not None:
        schema["description"] = description
    return schema


def described(schema: Schema, description: str) -> Schema:
    return {**schema, "description": description}


def nullable(schema: Schema) -> Schema:
    """``schema`` that also allows null (its constraints hold for the non-null values)."""
    return {**schema, "type": [schema["type"], "null"]}


def text(max_length: int, pattern: str | None = None, description: str | None = None) -> Schema:
    """A non-empty string of at most ``max_length`` characters, matching ``pattern``."""
    schema: Schema = {"type": "string", "minLength": 1, "maxLength": max_length}
    return _with(schema, description, {"pattern": pattern} if pattern else {})


def int_range(
    minimum: int, maximum: int, description: str | None = None, **keywords: Any
) -> Schema:
    """An integer from ``minimum`` to ``maximum``; ``keywords``: more of JSON Schema."""
    return _with({"type": "integer", "minimum": minimum, "maximum": maximum}, description, keywords)


def enum(values: Iterable[str], description: str | None = None) -> Schema:
    return _with({"type": "string", "enum": list(values)}, description, {})


def array(items: Schema, description: str | None = None, **keywords: Any) -> Schema:
    return _with({"type": "array", "items": items}, description, keywords)


def each(schema: Schema, *names: str) -> dict[str, Schema]:
    """Properties ``names``, all of them ``schema``."""
    return {name: schema for name in names}


def counts(**descriptions: str) -> dict[str, Schema]:
    """Integer properties, each with what it counts."""
    return {name: described(INTEGER, what) for name, what in descriptions.items()}


def obj(
    properties: dict[str, Schema],
    required: Iterable[str] = (),
    *,
    closed: bool = False,
    **keywords: Any,
) -> Schema:
    """An object of ``properties``.  ``closed``: no other property allowed (request bodies,
    views that must never show more); ``keywords``: more of JSON Schema (description, …)."""
    schema: Schema = {"type": "object", "properties": properties}
    if required:
        schema["required"] = list(required)
    if closed:
        schema["additionalProperties"] = False
    return _with(schema, None, keywords)


# --- requests ----------------------------------------------------------------------------
_NULLABLE_POSITIVE_INT: Schema = nullable(int_range(1, 2**31 - 1))

TOPIC_FILTER: Schema = text(MAX_TOPIC_BYTES)

NAMESPACE_NAME: Schema = text(64, "^[A-Za-z0-9_-]+$")

NAMESPACE_CREATE: Schema = obj({"name": NAMESPACE_NAME}, ["name"], closed=True)

STREAM_NAME: Schema = text(249, "^[A-Za-z0-9._-]+$", "A Kafka topic name.")

_STREAM_SETTINGS: dict[str, Schema] = {
    "topic_filters": array(
        TOPIC_FILTER,
        minItems=1,
        maxItems=64,
        description="Canonical topic filters routed into the stream; default: the stream name "
        "mapped to a topic ('.' becomes '/').",
    ),
    "partitions": int_range(1, 1024),
    "retention_ms": int_range(-1, 2**62, "-1: keep forever. Default 604800000 (7 days), as Kafka."),
    "retention_bytes": int_range(-1, 2**62, "Per partition; -1: unbounded (default)."),
}

STREAM_CREATE: Schema = obj({"name": STREAM_NAME, **_STREAM_SETTINGS}, ["name"], closed=True)

STREAM_UPDATE: Schema = obj(_STREAM_SETTINGS, closed=True, minProperties=1)

_QUEUE_SETTINGS: dict[str, Schema] = {
    "topic_filter": described(
        TOPIC_FILTER, "Default: the queue name mapped to a topic ('.' becomes '/')."
    ),
    "max_size_mb": described(_NULLABLE_POSITIVE_INT, "null: unbounded."),
    "message_ttl_seconds": described(_NULLABLE_POSITIVE_INT, "null: no expiry."),
    "max_retries": int_range(0, 1000),
    "dead_letter_topic": nullable(TOPIC_FILTER),
}

QUEUE_CREATE: Schema = obj(
    {
        "name": text(255),
        **_QUEUE_SETTINGS,
        "shards": int_range(1, 256, "Fixed at creation; 1 gives strict FIFO."),
    },
    ["name"],
    closed=True,
)

QUEUE_UPDATE: Schema = obj(_QUEUE_SETTINGS, closed=True, minProperties=1)

ENCODING: Schema = enum(["utf8", "base64"])

PUBLISH_MESSAGE: Schema = obj(
    {
        "payload": {"type": "string", "maxLength": 1_048_576},
        "encoding": ENCODING,
        "qos": int_range(0, 2),
        "retain": BOOLEAN,
        "key": {**NULLABLE_STRING, "maxLength": 65535},
        "content_type": {**NULLABLE_STRING, "maxLength": 255},
        "headers": {
            "type": "object",
            "additionalProperties": {"type": "string", "maxLength": 65535},
            "maxProperties": 64,
        },
    },
    ["payload"],
    closed=True,
)

PUBLISH_BATCH: Schema = obj(
    {"messages": array(PUBLISH_MESSAGE, minItems=1, maxItems=1000)}, ["messages"], closed=True
)

USERNAME: Schema = text(
    255, "^[^\\x00-\\x1f\\x7f-\\x9f]+$", "At most 255 bytes of UTF-8, no control characters."
)

PASSWORD: Schema = text(1024, description="Not empty; at most 1024 bytes of UTF-8.")

USER_CREATE: Schema = obj(
    {
        "username": USERNAME,
        "password": PASSWORD,
        "namespace": {**NAMESPACE_NAME, "default": "default"},
    },
    ["username", "password"],
    closed=True,
)

USER_UPDATE: Schema = obj({"password": PASSWORD}, ["password"], closed=True)

ACL_ID: Schema = {
    "type": "string",
    "pattern": "^[0-9a-f]{16}$",
    "description": "A rule's id: a hash of its content (16 hex digits).",
}

_ACL_FIELDS: dict[str, Schema] = {
    "principal": text(
        255,
        description="A user name, group:<name> (a user's groups) or * (anyone, anonymous "
        "clients included).",
    ),
    "namespace": described(NAMESPACE_NAME, "The tenant."),
    "resource": text(
        MAX_TOPIC_BYTES,
        description="A topic filter (MQTT syntax), stream:<name>, queue:<name>, "
        "group:<kafka group> (a name ending in * is a prefix) or namespace (all of it).",
    ),
    "action": enum(ACTIONS),
    "effect": enum(EFFECTS),
}

ACL_CREATE: Schema = obj(_ACL_FIELDS, _ACL_FIELDS, closed=True)

# --- responses ---------------------------------------------------------------------------
ERROR: Schema = obj({**each(STRING, "code", "message"), "details": {}}, ["code", "message"])

NAMESPACE: Schema = obj({"name": STRING, "created_at_ms": INTEGER}, ["name"])


def _destination(own: dict[str, Schema], *required: str) -> Schema:
    """A destination as the handlers' views give it: identity, ``own`` fields, bookkeeping."""
    return obj(
        {**each(STRING, "name", "namespace"), **own, **each(INTEGER, "created_at_ms", "version")},
        ["name", "namespace", *required],
    )


_OFFSETS: Schema = array(INTEGER)

STREAM: Schema = _destination(
    {
        "topic_filters": array(STRING),
        **each(INTEGER, "partitions", "retention_ms", "retention_bytes"),
        # Live counts (GET only), from the meta store's stream index, for the whole cluster.
        "start_offsets": described(_OFFSETS, "Log start offset of each partition"),
        "end_offsets": described(_OFFSETS, "High watermark of each partition"),
        **counts(
            bytes="Bytes stored, all partitions",
            segments="Index entries (chunks), all partitions",
            messages="Offsets retained: sum of end - start",
        ),
    },
    "topic_filters",
    "partitions",
)

QUEUE: Schema = _destination(
    {
        "topic_filter": STRING,
        **each(NULLABLE_INTEGER, "max_size_mb", "message_ttl_seconds"),
        "max_retries": INTEGER,
        "dead_letter_topic": NULLABLE_STRING,
        "shards": INTEGER,
        # Live counts (GET only): ready and unacked for the whole cluster, consumers here.
        **counts(
            ready="Messages waiting to be delivered",
            unacked="Messages delivered, not yet acked",
            consumers="Consumers on this broker",
            bytes="Bytes of the messages held",
        ),
    },
    "topic_filter",
)

USER: Schema = obj(
    {**each(STRING, "username", "namespace"), "created_at_ms": NULLABLE_INTEGER},
    ["username", "namespace", "created_at_ms"],
    closed=True,
    description="A user as the API shows it: never a password hash or credential.",
)

ACL: Schema = obj(
    {"id": ACL_ID, **each(STRING, *_ACL_FIELDS)},
    ["id", *_ACL_FIELDS],
    closed=True,
    description="An ACL rule (docs/security.md, Authorization).",
)

SUBSCRIPTION: Schema = obj(
    {
        **each(STRING, "namespace", "topic_filter", "client_id", "protocol", "node_id"),
        "qos": INTEGER,
        "shared_group": NULLABLE_STRING,
    },
    ["namespace", "topic_filter"],
)

_DESTINATION_REF: Schema = obj(
    {**each(STRING, "type", "name"), "topic_filters": array(STRING)}, ["type", "name"]
)

ROUTE_RESULT: Schema = obj(
    {
        **each(STRING, "namespace", "topic"),
        "destinations": array(_DESTINATION_REF),
        "subscriber_nodes": array(
            STRING,
            "Broker nodes with Subscriptions (memory push) on the topic: this one and those it "
            "would forward the message to",
        ),
    },
    ["topic", "destinations"],
)

NODE: Schema = obj(
    {
        "node_id": STRING,
        "status": enum(["up", "down"]),
        "gossip": enum(["alive", "suspect", "dead", "left"]),
        "self": BOOLEAN,
        "host": described(STRING, "Address other brokers reach it at"),
        "roles": array(STRING),
        "ports": {"type": "object"},
        "version": described(STRING, "FlowMQ-py version the node runs"),
        **each(INTEGER, "started_at_ms", "heartbeat_ms"),
    },
    ["node_id", "status"],
)

PUBLISH_RESULT: Schema = obj(
    {"topic": STRING, "destinations": array(_DESTINATION_REF)}, ["topic", "destinations"]
)

PUBLISH_BATCH_RESULT: Schema = obj({"results": array(PUBLISH_RESULT)}, ["results"])


def _envelope(success: bool, data: Schema, error: Schema) -> Schema:
    return obj(
        {"success": {"type": "boolean", "const": success}, "data": data, "error": error},
        ["success", "data", "error"],
    )


def envelope(data: Schema) -> Schema:
    return _envelope(True, data, {"type": "null"})


ERROR_ENVELOPE: Schema = _envelope(False, {"type": "null"}, ERROR)
