"""JSON Schemas of the operations endpoints (health, readiness, stream and queue reads,
consumer groups, clients): like ``schemas``, used unchanged to validate requests and as the
OpenAPI document's components."""

from __future__ import annotations

from flowmq_admin.schemas import STREAM_CREATE, Schema

HEALTH: Schema = {
    "type": "object",
    "properties": {
        "status": {"type": "string", "const": "ok"},
        "node_id": {"type": "string"},
        "version": {"type": "string"},
    },
    "required": ["status", "node_id", "version"],
}

_CHECK: Schema = {
    "type": "object",
    "properties": {
        "ok": {"type": "boolean"},
        "ms": {"type": "number", "description": "How long the check took"},
        "error": {"type": ["string", "null"]},
    },
    "required": ["ok", "error"],
}

READY: Schema = {
    "type": "object",
    "properties": {
        "status": {"type": "string", "const": "ready"},
        "node_id": {"type": "string"},
        "checks": {
            "type": "object",
            "properties": {"meta": _CHECK, "objects": _CHECK, "cluster": _CHECK},
            "required": ["meta", "objects", "cluster"],
        },
    },
    "required": ["status", "node_id", "checks"],
}

_ENCODING: Schema = {
    "type": "string",
    "enum": ["utf8", "base64"],
    "description": "How the value beside it is given: UTF-8 text as is, anything else base64",
}

_HEADER: Schema = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "value": {"type": ["string", "null"]},
        "encoding": _ENCODING,
    },
    "required": ["name", "value", "encoding"],
}

STREAM_RECORD: Schema = {
    "type": "object",
    "properties": {
        "partition": {"type": "integer"},
        "offset": {"type": "integer"},
        "timestamp_ms": {"type": "integer"},
        "topic": {
            "type": ["string", "null"],
            "description": "Canonical topic it was published to (null: produced by Kafka)",
        },
        "key": {"type": ["string", "null"]},
        "key_encoding": _ENCODING,
        "value": {"type": ["string", "null"]},
        "value_encoding": _ENCODING,
        "headers": {"type": "array", "items": _HEADER},
    },
    "required": ["partition", "offset", "timestamp_ms", "key", "value", "headers"],
}

STREAM_MESSAGES: Schema = {
    "type": "object",
    "properties": {
        "stream": {"type": "string"},
        "namespace": {"type": "string"},
        "partition": {"type": "integer"},
        "records": {"type": "array", "items": STREAM_RECORD},
        "next_offset": {"type": "integer", "description": "Offset to read from next"},
        "high_watermark": {"type": "integer"},
        "log_start_offset": {"type": "integer"},
    },
    "required": ["stream", "partition", "records", "next_offset", "high_watermark"],
}

QUEUE_MESSAGE: Schema = {
    "type": "object",
    "properties": {
        "seq": {"type": "integer"},
        "redelivered": {"type": "boolean"},
        "topic": {"type": "string"},
        "timestamp_ms": {"type": "integer"},
        "key": {"type": ["string", "null"]},
        "key_encoding": _ENCODING,
        "payload": {"type": "string"},
        "encoding": _ENCODING,
        "content_type": {"type": ["string", "null"]},
        "headers": {"type": "array", "items": _HEADER},
    },
    "required": ["seq", "topic", "payload", "encoding", "headers"],
}

QUEUE_MESSAGES: Schema = {
    "type": "object",
    "properties": {
        "queue": {"type": "string"},
        "namespace": {"type": "string"},
        "messages": {"type": "array", "items": QUEUE_MESSAGE},
    },
    "required": ["queue", "messages"],
}

QUEUE_TAKE: Schema = {
    "type": "object",
    "properties": {
        "max_messages": {
            "type": "integer",
            "minimum": 1,
            "maximum": 100,
            "default": 1,
            "description": "Take up to this many (default 1); fewer if the queue has fewer",
        }
    },
    "additionalProperties": False,
}

QUEUE_PURGED: Schema = {
    "type": "object",
    "properties": {
        "queue": {"type": "string"},
        "namespace": {"type": "string"},
        "purged": {"type": "integer", "description": "Ready messages dropped"},
    },
    "required": ["queue", "purged"],
}

GROUP_SUMMARY: Schema = {
    "type": "object",
    "properties": {
        "group": {"type": "string"},
        "namespace": {"type": "string"},
        "coordinator": {
            "type": ["string", "null"],
            "description": "Node that coordinates the group (null: no Kafka listener here)",
        },
        "state": {
            "type": ["string", "null"],
            "description": "Kafka group state, when this broker coordinates the group",
        },
        "members": {"type": ["integer", "null"]},
    },
    "required": ["group", "namespace"],
}

GROUP: Schema = {
    "type": "object",
    "properties": {
        **GROUP_SUMMARY["properties"],
        "members": {
            "type": ["array", "null"],
            "description": "Live members (null: another broker coordinates the group)",
            "items": {
                "type": "object",
                "properties": {
                    "member_id": {"type": "string"},
                    "group_instance_id": {"type": ["string", "null"]},
                    "client_id": {"type": "string"},
                    "client_host": {"type": "string"},
                },
                "required": ["member_id"],
            },
        },
        "offsets": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "stream": {"type": "string"},
                    "partition": {"type": "integer"},
                    "committed_offset": {"type": "integer"},
                    "end_offset": {"type": "integer"},
                    "lag": {"type": "integer"},
                    "metadata": {"type": ["string", "null"]},
                    "commit_timestamp_ms": {"type": "integer"},
                },
                "required": ["stream", "partition", "committed_offset", "end_offset", "lag"],
            },
        },
        "lag": {"type": "integer", "description": "Sum of the partitions' lag"},
    },
    "required": ["group", "namespace", "offsets", "lag"],
}

GROUP_RESET: Schema = {
    "type": "object",
    "properties": {
        "stream": STREAM_CREATE["properties"]["name"],
        "to": {
            "oneOf": [
                {"type": "string", "enum": ["earliest", "latest"]},
                {"type": "integer", "minimum": 0, "maximum": 2**62},
            ],
            "description": "earliest (log start), latest (end) or an offset (clamped into the log)",
        },
        "partition": {
            "type": "integer",
            "minimum": 0,
            "maximum": 1023,
            "description": "One partition (default: all of the stream's)",
        },
    },
    "required": ["stream", "to"],
    "additionalProperties": False,
}

GROUP_RESET_RESULT: Schema = {
    "type": "object",
    "properties": {
        "group": {"type": "string"},
        "namespace": {"type": "string"},
        "stream": {"type": "string"},
        "offsets": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"partition": {"type": "integer"}, "offset": {"type": "integer"}},
                "required": ["partition", "offset"],
            },
        },
    },
    "required": ["group", "stream", "offsets"],
}

CLIENT: Schema = {
    "type": "object",
    "properties": {
        "id": {"type": "string", "description": "protocol:address; what DELETE takes"},
        "protocol": {"type": "string", "enum": ["mqtt", "amqp", "kafka"]},
        "protocol_version": {"type": ["string", "null"]},
        "node_id": {"type": "string"},
        "address": {"type": "string"},
        "namespace": {"type": "string"},
        "user": {"type": ["string", "null"]},
        "client_id": {"type": ["string", "null"], "description": "MQTT client identifier"},
        "connected": {"type": "boolean", "description": "Past the protocol handshake"},
        "session": {
            "type": ["object", "null"],
            "description": "MQTT: session expiry interval and whether it persists",
        },
        "subscriptions": {
            "type": "array",
            "items": {"type": "string"},
            "description": "MQTT topic filters; AMQP queues consumed",
        },
        "inflight": {
            "type": ["integer", "null"],
            "description": "MQTT: QoS 1/2 messages unacknowledged; AMQP: unacked deliveries",
        },
    },
    "required": ["id", "protocol", "node_id", "address", "subscriptions"],
}

CLIENTS_DISCONNECTED: Schema = {
    "type": "object",
    "properties": {"disconnected": {"type": "array", "items": {"type": "string"}}},
    "required": ["disconnected"],
}
