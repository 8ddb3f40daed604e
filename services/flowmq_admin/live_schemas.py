"""JSON Schemas of the operations endpoints (health, readiness, stream and queue reads,
consumer groups, clients): like ``schemas``, used unchanged to validate requests and as the
OpenAPI document's components."""

from __future__ import annotations

from flowmq_admin.schemas import (
    BOOLEAN,
    ENCODING,
    INTEGER,
    NULLABLE_INTEGER,
    NULLABLE_STRING,
    STREAM_NAME,
    STRING,
    Schema,
    array,
    described,
    each,
    enum,
    int_range,
    obj,
)

HEALTH: Schema = obj(
    {"status": {"type": "string", "const": "ok"}, **each(STRING, "node_id", "version")},
    ["status", "node_id", "version"],
)

_CHECK: Schema = obj(
    {
        "ok": BOOLEAN,
        "ms": described({"type": "number"}, "How long the check took"),
        "error": NULLABLE_STRING,
    },
    ["ok", "error"],
)

_CHECKS = ("meta", "objects", "cluster")

READY: Schema = obj(
    {
        "status": {"type": "string", "const": "ready"},
        "node_id": STRING,
        "checks": obj(each(_CHECK, *_CHECKS), _CHECKS),
    },
    ["status", "node_id", "checks"],
)

_ENCODING: Schema = described(
    ENCODING, "How the value beside it is given: UTF-8 text as is, anything else base64"
)

_HEADER: Schema = obj(
    {"name": STRING, "value": NULLABLE_STRING, "encoding": _ENCODING},
    ["name", "value", "encoding"],
)

_HEADERS: Schema = array(_HEADER)

STREAM_RECORD: Schema = obj(
    {
        **each(INTEGER, "partition", "offset", "timestamp_ms"),
        "topic": described(
            NULLABLE_STRING, "Canonical topic it was published to (null: produced by Kafka)"
        ),
        "key": NULLABLE_STRING,
        "key_encoding": _ENCODING,
        "value": NULLABLE_STRING,
        "value_encoding": _ENCODING,
        "headers": _HEADERS,
    },
    ["partition", "offset", "timestamp_ms", "key", "value", "headers"],
)

STREAM_MESSAGES: Schema = obj(
    {
        **each(STRING, "stream", "namespace"),
        "partition": INTEGER,
        "records": array(STREAM_RECORD),
        "next_offset": described(INTEGER, "Offset to read from next"),
        **each(INTEGER, "high_watermark", "log_start_offset"),
    },
    ["stream", "partition", "records", "next_offset", "high_watermark"],
)

QUEUE_MESSAGE: Schema = obj(
    {
        "seq": INTEGER,
        "redelivered": BOOLEAN,
        "topic": STRING,
        "timestamp_ms": INTEGER,
        "key": NULLABLE_STRING,
        "key_encoding": _ENCODING,
        "payload": STRING,
        "encoding": _ENCODING,
        "content_type": NULLABLE_STRING,
        "headers": _HEADERS,
    },
    ["seq", "topic", "payload", "encoding", "headers"],
)

QUEUE_MESSAGES: Schema = obj(
    {**each(STRING, "queue", "namespace"), "messages": array(QUEUE_MESSAGE)},
    ["queue", "messages"],
)

QUEUE_TAKE: Schema = obj(
    {
        "max_messages": int_range(
            1, 100, "Take up to this many (default 1); fewer if the queue has fewer", default=1
        )
    },
    closed=True,
)

QUEUE_PURGED: Schema = obj(
    {
        **each(STRING, "queue", "namespace"),
        "purged": described(INTEGER, "Ready messages dropped"),
    },
    ["queue", "purged"],
)

_GROUP_IDENTITY: dict[str, Schema] = each(STRING, "group", "namespace")

GROUP_SUMMARY: Schema = obj(
    {
        **_GROUP_IDENTITY,
        "coordinator": described(
            NULLABLE_STRING, "Node that coordinates the group (null: no Kafka listener here)"
        ),
        "state": described(
            NULLABLE_STRING, "Kafka group state, when this broker coordinates the group"
        ),
        "members": NULLABLE_INTEGER,
    },
    ["group", "namespace"],
)

_MEMBER: Schema = obj(
    {
        "member_id": STRING,
        "group_instance_id": NULLABLE_STRING,
        **each(STRING, "client_id", "client_host"),
    },
    ["member_id"],
)

_COMMITTED_OFFSET: Schema = obj(
    {
        "stream": STRING,
        **each(INTEGER, "partition", "committed_offset", "end_offset", "lag"),
        "metadata": NULLABLE_STRING,
        "commit_timestamp_ms": INTEGER,
    },
    ["stream", "partition", "committed_offset", "end_offset", "lag"],
)

GROUP: Schema = obj(
    {
        **GROUP_SUMMARY["properties"],
        "members": {
            "type": ["array", "null"],
            "description": "Live members (null: another broker coordinates the group)",
            "items": _MEMBER,
        },
        "offsets": array(_COMMITTED_OFFSET),
        "lag": described(INTEGER, "Sum of the partitions' lag"),
    },
    ["group", "namespace", "offsets", "lag"],
)

GROUP_RESET: Schema = obj(
    {
        "stream": STREAM_NAME,
        "to": {
            "oneOf": [enum(["earliest", "latest"]), int_range(0, 2**62)],
            "description": "earliest (log start), latest (end) or an offset (clamped into the log)",
        },
        "partition": int_range(0, 1023, "One partition (default: all of the stream's)"),
    },
    ["stream", "to"],
    closed=True,
)

GROUP_RESET_RESULT: Schema = obj(
    {
        **_GROUP_IDENTITY,
        "stream": STRING,
        "offsets": array(obj(each(INTEGER, "partition", "offset"), ["partition", "offset"])),
    },
    ["group", "stream", "offsets"],
)

CLIENT: Schema = obj(
    {
        "id": described(STRING, "protocol:address; what DELETE takes"),
        "protocol": enum(["mqtt", "amqp", "kafka"]),
        "protocol_version": NULLABLE_STRING,
        **each(STRING, "node_id", "address", "namespace"),
        "user": NULLABLE_STRING,
        "client_id": described(NULLABLE_STRING, "MQTT client identifier"),
        "connected": described(BOOLEAN, "Past the protocol handshake"),
        "session": described(
            {"type": ["object", "null"]}, "MQTT: session expiry interval and whether it persists"
        ),
        "subscriptions": array(STRING, "MQTT topic filters; AMQP queues consumed"),
        "inflight": described(
            NULLABLE_INTEGER,
            "MQTT: QoS 1/2 messages unacknowledged; AMQP: unacked deliveries",
        ),
    },
    ["id", "protocol", "node_id", "address", "subscriptions"],
)

CLIENTS_DISCONNECTED: Schema = obj({"disconnected": array(STRING)}, ["disconnected"])
