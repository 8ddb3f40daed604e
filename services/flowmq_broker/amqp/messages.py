"""AMQP messages <-> the protocol-neutral ``Message``.

A message published over AMQP keeps its raw content-header properties
(``properties["amqp_properties"]``), which AMQP consumers get back byte for byte; the fields
other protocols understand (content type, headers, TTL, correlation id) are also copied into
the ``Message``.  Messages from elsewhere get properties built from those fields.
"""

from __future__ import annotations

import math
import time
from typing import Any

from flowmq_core.message import Message, now_ms
from flowmq_wire.amqp import properties as amqp_props

RAW = "amqp_properties"
EXCHANGE = "amqp_exchange"
ROUTING_KEY = "amqp_routing_key"


_PARSED: dict[bytes, dict[str, Any]] = {}
_PARSED_MAX = 4096


def _parse(raw: bytes) -> dict[str, Any]:
    """Publishers mostly repeat the same properties: parse each distinct set once."""
    props = _PARSED.get(raw)
    if props is None:
        props = amqp_props.parse(raw)
        if len(_PARSED) >= _PARSED_MAX:
            _PARSED.clear()
        _PARSED[raw] = props
    return props


# What a set of raw properties gives every message published with it: (qos, content type,
# headers, expiration in ms or None, correlation data or None).
_Shape = tuple[int, str | None, list[tuple[str, bytes]], int | None, bytes | None]
_SHAPES: dict[bytes, _Shape] = {}


def _shape(raw: bytes) -> _Shape:
    shape = _SHAPES.get(raw)
    if shape is not None:
        return shape
    props = _parse(raw)
    headers: list[tuple[str, bytes]] = []
    expiration = None
    correlation = None
    if props:
        table = props.get("headers")
        if table is not None:
            headers = [
                (k, amqp_props.header_value_bytes(v))
                for k, v in amqp_props.decode_headers(table).items()
            ]
        text = props.get("expiration")
        if text is not None:
            try:
                expiration = max(0, int(text))
            except ValueError:
                pass
        correlation_id = props.get("correlation_id")
        if correlation_id is not None:
            correlation = correlation_id.encode()
    shape = (
        1 if props.get("delivery_mode") == 2 else 0,
        props.get("content_type"),
        headers,
        expiration,
        correlation,
    )
    if len(_SHAPES) >= _PARSED_MAX:
        _SHAPES.clear()
    _SHAPES[raw] = shape
    return shape


def from_publish(
    topic: str, exchange: str, routing_key: str, raw_props: bytes, body: bytes
) -> Message:
    """Raises ``flowmq_wire.amqp.frames.SyntaxError_`` for malformed properties."""
    now = time.time_ns() // 1_000_000  # now_ms(), without the call
    qos, content_type, headers, expiration, correlation = _SHAPES.get(raw_props) or _shape(
        raw_props
    )
    extra: dict[str, Any] = {RAW: raw_props, EXCHANGE: exchange, ROUTING_KEY: routing_key}
    if correlation is not None:
        extra["correlation_data"] = correlation
    return Message(
        topic,
        body,
        qos,
        False,
        headers.copy(),  # each message its own: a header change must not reach the others
        now,
        None,
        content_type,
        None if expiration is None else now + expiration,
        "amqp",
        extra,
    )


def delivery_properties(message: Message) -> bytes:
    """Raw content-header properties for delivering ``message`` to an AMQP consumer."""
    extra = message.properties
    raw = extra.get(RAW)
    if raw is not None and not extra.get("headers_changed"):
        return raw
    props: dict[str, Any] = amqp_props.parse(raw) if raw is not None else {}
    if raw is None:
        if message.content_type is not None:
            props["content_type"] = message.content_type
        props["delivery_mode"] = 2 if message.qos else 1
        props["timestamp"] = message.timestamp_ms // 1000
        correlation = extra.get("correlation_data")
        if isinstance(correlation, bytes):
            props["correlation_id"] = correlation.decode("utf-8", "replace")
        if message.expiry_ms is not None:
            props["expiration"] = str(max(0, math.ceil(message.expiry_ms - now_ms())))
    if message.headers:
        table: dict[str, Any] = {}
        for name, value in message.headers:
            try:
                table[name] = value.decode()
            except UnicodeDecodeError:
                table[name] = bytearray(value)
        props["headers"] = table
    else:
        props.pop("headers", None)
    return amqp_props.build(props)


def exchange_and_key(message: Message) -> tuple[str, str]:
    """What a consumer sees as the message's exchange and routing key."""
    extra = message.properties
    exchange = extra.get(EXCHANGE)
    if exchange is not None:
        return exchange, extra.get(ROUTING_KEY, "")
    return "amq.topic", message.topic.replace("/", ".")
