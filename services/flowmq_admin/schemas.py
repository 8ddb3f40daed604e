"""JSON Schemas of the admin API's bodies: used to validate requests and, unchanged, as the
OpenAPI document's components, so the document cannot drift from what the handlers accept."""

from __future__ import annotations

from typing import Any

from flowmq_core.acl import ACTIONS, EFFECTS
from flowmq_core.limits import MAX_TOPIC_BYTES

Schema = dict[str, Any]

_NULLABLE_POSITIVE_INT: Schema = {"type": ["integer", "null"], "minimum": 1, "maximum": 2**31 - 1}

TOPIC_FILTER: Schema = {"type": "string", "minLength": 1, "maxLength": MAX_TOPIC_BYTES}

NAMESPACE_CREATE: Schema = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 64, "pattern": "^[A-Za-z0-9_-]+$"}
    },
    "required": ["name"],
    "additionalProperties": False,
}

_STREAM_SETTINGS: dict[str, Schema] = {
    "topic_filters": {
        "type": "array",
        "items": TOPIC_FILTER,
        "minItems": 1,
        "maxItems": 64,
        "description": "Canonical topic filters routed into the stream; default: the "
        "stream name mapped to a topic ('.' becomes '/').",
    },
    "partitions": {"type": "integer", "minimum": 1, "maximum": 1024},
    "retention_ms": {
        "type": "integer",
        "minimum": -1,
        "maximum": 2**62,
        "description": "-1: keep forever. Default 604800000 (7 days), as Kafka.",
    },
    "retention_bytes": {
        "type": "integer",
        "minimum": -1,
        "maximum": 2**62,
        "description": "Per partition; -1: unbounded (default).",
    },
}

STREAM_CREATE: Schema = {
    "type": "object",
    "properties": {
        "name": {
            "type": "string",
            "minLength": 1,
            "maxLength": 249,
            "pattern": "^[A-Za-z0-9._-]+$",
            "description": "A Kafka topic name.",
        },
        **_STREAM_SETTINGS,
    },
    "required": ["name"],
    "additionalProperties": False,
}

STREAM_UPDATE: Schema = {
    "type": "object",
    "properties": _STREAM_SETTINGS,
    "additionalProperties": False,
    "minProperties": 1,
}

_QUEUE_SETTINGS: dict[str, Schema] = {
    "topic_filter": {
        **TOPIC_FILTER,
        "description": "Default: the queue name mapped to a topic ('.' becomes '/').",
    },
    "max_size_mb": {**_NULLABLE_POSITIVE_INT, "description": "null: unbounded."},
    "message_ttl_seconds": {**_NULLABLE_POSITIVE_INT, "description": "null: no expiry."},
    "max_retries": {"type": "integer", "minimum": 0, "maximum": 1000},
    "dead_letter_topic": {"type": ["string", "null"], "minLength": 1, "maxLength": MAX_TOPIC_BYTES},
}

QUEUE_CREATE: Schema = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 255},
        **_QUEUE_SETTINGS,
        "shards": {
            "type": "integer",
            "minimum": 1,
            "maximum": 256,
            "description": "Fixed at creation; 1 gives strict FIFO.",
        },
    },
    "required": ["name"],
    "additionalProperties": False,
}

QUEUE_UPDATE: Schema = {
    "type": "object",
    "properties": _QUEUE_SETTINGS,
    "additionalProperties": False,
    "minProperties": 1,
}

PUBLISH_MESSAGE: Schema = {
    "type": "object",
    "properties": {
        "payload": {"type": "string", "maxLength": 1_048_576},
        "encoding": {"type": "string", "enum": ["utf8", "base64"]},
        "qos": {"type": "integer", "minimum": 0, "maximum": 2},
        "retain": {"type": "boolean"},
        "key": {"type": ["string", "null"], "maxLength": 65535},
        "content_type": {"type": ["string", "null"], "maxLength": 255},
        "headers": {
            "type": "object",
            "additionalProperties": {"type": "string", "maxLength": 65535},
            "maxProperties": 64,
        },
    },
    "required": ["payload"],
    "additionalProperties": False,
}

PUBLISH_BATCH: Schema = {
    "type": "object",
    "properties": {
        "messages": {"type": "array", "items": PUBLISH_MESSAGE, "minItems": 1, "maxItems": 1000}
    },
    "required": ["messages"],
    "additionalProperties": False,
}

USERNAME: Schema = {
    "type": "string",
    "minLength": 1,
    "maxLength": 255,
    "pattern": "^[^\\x00-\\x1f\\x7f-\\x9f]+$",
    "description": "At most 255 bytes of UTF-8, no control characters.",
}

PASSWORD: Schema = {
    "type": "string",
    "minLength": 1,
    "maxLength": 1024,
    "description": "Not empty; at most 1024 bytes of UTF-8.",
}

USER_CREATE: Schema = {
    "type": "object",
    "properties": {
        "username": USERNAME,
        "password": PASSWORD,
        "namespace": {**NAMESPACE_CREATE["properties"]["name"], "default": "default"},
    },
    "required": ["username", "password"],
    "additionalProperties": False,
}

USER_UPDATE: Schema = {
    "type": "object",
    "properties": {"password": PASSWORD},
    "required": ["password"],
    "additionalProperties": False,
}

ACL_ID: Schema = {
    "type": "string",
    "pattern": "^[0-9a-f]{16}$",
    "description": "A rule's id: a hash of its content (16 hex digits).",
}

_ACL_FIELDS: dict[str, Schema] = {
    "principal": {
        "type": "string",
        "minLength": 1,
        "maxLength": 255,
        "description": "A user name, group:<name> (a user's groups) or * (anyone, anonymous "
        "clients included).",
    },
    "namespace": {**NAMESPACE_CREATE["properties"]["name"], "description": "The tenant."},
    "resource": {
        "type": "string",
        "minLength": 1,
        "maxLength": MAX_TOPIC_BYTES,
        "description": "A topic filter (MQTT syntax), stream:<name>, queue:<name>, "
        "group:<kafka group> (a name ending in * is a prefix) or namespace (all of it).",
    },
    "action": {"type": "string", "enum": list(ACTIONS)},
    "effect": {"type": "string", "enum": list(EFFECTS)},
}

ACL_CREATE: Schema = {
    "type": "object",
    "properties": _ACL_FIELDS,
    "required": list(_ACL_FIELDS),
    "additionalProperties": False,
}

# --- responses ---------------------------------------------------------------------------
ERROR: Schema = {
    "type": "object",
    "properties": {
        "code": {"type": "string"},
        "message": {"type": "string"},
        "details": {},
    },
    "required": ["code", "message"],
}

NAMESPACE: Schema = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "created_at_ms": {"type": "integer"}},
    "required": ["name"],
}


def _destination(own: dict[str, Schema], *required: str) -> Schema:
    """A destination as the handlers' views give it: identity, ``own`` fields, bookkeeping."""
    return {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "namespace": {"type": "string"},
            **own,
            "created_at_ms": {"type": "integer"},
            "version": {"type": "integer"},
        },
        "required": ["name", "namespace", *required],
    }


_OFFSETS: Schema = {"type": "array", "items": {"type": "integer"}}

STREAM: Schema = _destination(
    {
        "topic_filters": {"type": "array", "items": {"type": "string"}},
        "partitions": {"type": "integer"},
        "retention_ms": {"type": "integer"},
        "retention_bytes": {"type": "integer"},
        # Live counts (GET only), from the meta store's stream index, for the whole cluster.
        "start_offsets": {**_OFFSETS, "description": "Log start offset of each partition"},
        "end_offsets": {**_OFFSETS, "description": "High watermark of each partition"},
        "bytes": {"type": "integer", "description": "Bytes stored, all partitions"},
        "segments": {"type": "integer", "description": "Index entries (chunks), all partitions"},
        "messages": {"type": "integer", "description": "Offsets retained: sum of end - start"},
    },
    "topic_filters",
    "partitions",
)

QUEUE: Schema = _destination(
    {
        "topic_filter": {"type": "string"},
        "max_size_mb": {"type": ["integer", "null"]},
        "message_ttl_seconds": {"type": ["integer", "null"]},
        "max_retries": {"type": "integer"},
        "dead_letter_topic": {"type": ["string", "null"]},
        "shards": {"type": "integer"},
        # Live counts (GET only): ready and unacked for the whole cluster, consumers here.
        "ready": {"type": "integer", "description": "Messages waiting to be delivered"},
        "unacked": {"type": "integer", "description": "Messages delivered, not yet acked"},
        "consumers": {"type": "integer", "description": "Consumers on this broker"},
        "bytes": {"type": "integer", "description": "Bytes of the messages held"},
    },
    "topic_filter",
)

USER: Schema = {
    "type": "object",
    "properties": {
        "username": {"type": "string"},
        "namespace": {"type": "string"},
        "created_at_ms": {"type": ["integer", "null"]},
    },
    "required": ["username", "namespace", "created_at_ms"],
    "additionalProperties": False,
    "description": "A user as the API shows it: never a password hash or credential.",
}

ACL: Schema = {
    "type": "object",
    "properties": {"id": ACL_ID, **{name: {"type": "string"} for name in _ACL_FIELDS}},
    "required": ["id", *_ACL_FIELDS],
    "additionalProperties": False,
    "description": "An ACL rule (docs/security.md, Authorization).",
}

SUBSCRIPTION: Schema = {
    "type": "object",
    "properties": {
        "namespace": {"type": "string"},
        "topic_filter": {"type": "string"},
        "client_id": {"type": "string"},
        "protocol": {"type": "string"},
        "node_id": {"type": "string"},
        "qos": {"type": "integer"},
        "shared_group": {"type": ["string", "null"]},
    },
    "required": ["namespace", "topic_filter"],
}

ROUTE_RESULT: Schema = {
    "type": "object",
    "properties": {
        "namespace": {"type": "string"},
        "topic": {"type": "string"},
        "destinations": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "type": {"type": "string"},
                    "name": {"type": "string"},
                    "topic_filters": {"type": "array", "items": {"type": "string"}},
                },
                "required": ["type", "name"],
            },
        },
        "subscriber_nodes": {
            "type": "array",
            "items": {"type": "string"},
            "description": "Broker nodes with Subscriptions (memory push) on the topic: this "
            "one and those it would forward the message to",
        },
    },
    "required": ["topic", "destinations"],
}

NODE: Schema = {
    "type": "object",
    "properties": {
        "node_id": {"type": "string"},
        "status": {"type": "string", "enum": ["up", "down"]},
        "gossip": {"type": "string", "enum": ["alive", "suspect", "dead", "left"]},
        "self": {"type": "boolean"},
        "host": {"type": "string", "description": "Address other brokers reach it at"},
        "roles": {"type": "array", "items": {"type": "string"}},
        "ports": {"type": "object"},
        "version": {"type": "string", "description": "FlowMQ-py version the node runs"},
        "started_at_ms": {"type": "integer"},
        "heartbeat_ms": {"type": "integer"},
    },
    "required": ["node_id", "status"],
}

PUBLISH_RESULT: Schema = {
    "type": "object",
    "properties": {
        "topic": {"type": "string"},
        "destinations": ROUTE_RESULT["properties"]["destinations"],
    },
    "required": ["topic", "destinations"],
}

PUBLISH_BATCH_RESULT: Schema = {
    "type": "object",
    "properties": {"results": {"type": "array", "items": PUBLISH_RESULT}},
    "required": ["results"],
}


def envelope(data: Schema) -> Schema:
    return {
        "type": "object",
        "properties": {
            "success": {"type": "boolean", "const": True},
            "data": data,
            "error": {"type": "null"},
        },
        "required": ["success", "data", "error"],
    }


ERROR_ENVELOPE: Schema = {
    "type": "object",
    "properties": {
        "success": {"type": "boolean", "const": False},
        "data": {"type": "null"},
        "error": ERROR,
    },
    "required": ["success", "data", "error"],
}
