"""MQTT 5 properties (§2.2.2): identifiers, value types, where each may appear, and their codec.

Properties are a plain mapping keyed by snake_case name. Value types:

* byte / two-byte / four-byte / variable byte integers → ``int``
  (the 0-or-1 flags such as ``retain_available`` stay ``int`` as on the wire);
* UTF-8 strings → ``str``; binary data (``correlation_data``, ``authentication_data``) → ``bytes``;
* ``user_property`` → ``list[tuple[str, str]]`` in wire order (may repeat, order kept);
* ``subscription_identifier`` → ``list[int]`` in a PUBLISH (one per matching subscription),
  a single ``int`` in a SUBSCRIBE. The encoder accepts an int or a list in either.

The encoder skips entries whose value is ``None``, so callers can build mappings without
conditionals.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flowmq_wire.mqtt import reason_codes as rc
from flowmq_wire.mqtt.errors import MalformedPacket, ProtocolViolation
from flowmq_wire.mqtt.packets import (
    AUTH,
    CONNACK,
    CONNECT,
    DISCONNECT,
    EMPTY_PROPERTIES,
    PACKET_NAMES,
    PINGREQ,
    PINGRESP,
    PUBACK,
    PUBCOMP,
    PUBLISH,
    PUBREC,
    PUBREL,
    SUBACK,
    SUBSCRIBE,
    UNSUBACK,
    WILL,
    Properties,
)
from flowmq_wire.mqtt.primitives import (
    decode_binary,
    decode_string,
    decode_vbi,
    encode_binary,
    encode_string,
    encode_vbi,
    pack_u16,
    pack_u32,
    unpack_u32_from,
)

BYTE, U16, U32, VBI, STRING, BINARY, PAIR = range(7)

PAYLOAD_FORMAT_INDICATOR = 0x01
MESSAGE_EXPIRY_INTERVAL = 0x02
CONTENT_TYPE = 0x03
RESPONSE_TOPIC = 0x08
CORRELATION_DATA = 0x09
SUBSCRIPTION_IDENTIFIER = 0x0B
SESSION_EXPIRY_INTERVAL = 0x11
ASSIGNED_CLIENT_IDENTIFIER = 0x12
SERVER_KEEP_ALIVE = 0x13
AUTHENTICATION_METHOD = 0x15
AUTHENTICATION_DATA = 0x16
REQUEST_PROBLEM_INFORMATION = 0x17
WILL_DELAY_INTERVAL = 0x18
REQUEST_RESPONSE_INFORMATION = 0x19
RESPONSE_INFORMATION = 0x1A
SERVER_REFERENCE = 0x1C
REASON_STRING = 0x1F
RECEIVE_MAXIMUM = 0x21
TOPIC_ALIAS_MAXIMUM = 0x22
TOPIC_ALIAS = 0x23
MAXIMUM_QOS = 0x24
RETAIN_AVAILABLE = 0x25
USER_PROPERTY = 0x26
MAXIMUM_PACKET_SIZE = 0x27
WILDCARD_SUBSCRIPTION_AVAILABLE = 0x28
SUBSCRIPTION_IDENTIFIER_AVAILABLE = 0x29
SHARED_SUBSCRIPTION_AVAILABLE = 0x2A

_ACKS = {PUBACK, PUBREC, PUBREL, PUBCOMP}
_WITH_REASON_STRING = {CONNACK, SUBACK, UNSUBACK, DISCONNECT, AUTH} | _ACKS

# (identifier, name, type, packets it may appear in) — v5 Table 2-4.
PROPERTY_TABLE: tuple[tuple[int, str, int, frozenset[int]], ...] = tuple(
    (pid, name, kind, frozenset(where))
    for pid, name, kind, where in (
        (0x01, "payload_format_indicator", BYTE, {PUBLISH, WILL}),
        (0x02, "message_expiry_interval", U32, {PUBLISH, WILL}),
        (0x03, "content_type", STRING, {PUBLISH, WILL}),
        (0x08, "response_topic", STRING, {PUBLISH, WILL}),
        (0x09, "correlation_data", BINARY, {PUBLISH, WILL}),
        (0x0B, "subscription_identifier", VBI, {PUBLISH, SUBSCRIBE}),
        (0x11, "session_expiry_interval", U32, {CONNECT, CONNACK, DISCONNECT}),
        (0x12, "assigned_client_identifier", STRING, {CONNACK}),
        (0x13, "server_keep_alive", U16, {CONNACK}),
        (0x15, "authentication_method", STRING, {CONNECT, CONNACK, AUTH}),
        (0x16, "authentication_data", BINARY, {CONNECT, CONNACK, AUTH}),
        (0x17, "request_problem_information", BYTE, {CONNECT}),
        (0x18, "will_delay_interval", U32, {WILL}),
        (0x19, "request_response_information", BYTE, {CONNECT}),
        (0x1A, "response_information", STRING, {CONNACK}),
        (0x1C, "server_reference", STRING, {CONNACK, DISCONNECT}),
        (0x1F, "reason_string", STRING, _WITH_REASON_STRING),
        (0x21, "receive_maximum", U16, {CONNECT, CONNACK}),
        (0x22, "topic_alias_maximum", U16, {CONNECT, CONNACK}),
        (0x23, "topic_alias", U16, {PUBLISH}),
        (0x24, "maximum_qos", BYTE, {CONNACK}),
        (0x25, "retain_available", BYTE, {CONNACK}),
        (0x26, "user_property", PAIR, set(PACKET_NAMES) - {PINGREQ, PINGRESP}),
        (0x27, "maximum_packet_size", U32, {CONNECT, CONNACK}),
        (0x28, "wildcard_subscription_available", BYTE, {CONNACK}),
        (0x29, "subscription_identifier_available", BYTE, {CONNACK}),
        (0x2A, "shared_subscription_available", BYTE, {CONNACK}),
    )
)

PROPERTY_NAMES: dict[int, str] = {pid: name for pid, name, _, _ in PROPERTY_TABLE}
PROPERTY_IDS: dict[str, int] = {name: pid for pid, name, _, _ in PROPERTY_TABLE}
_KIND: dict[int, int] = {pid: kind for pid, _, kind, _ in PROPERTY_TABLE}
_BY_NAME: dict[str, tuple[int, int]] = {name: (pid, kind) for pid, name, kind, _ in PROPERTY_TABLE}

ALLOWED: dict[int, frozenset[int]] = {
    ptype: frozenset(pid for pid, _, _, where in PROPERTY_TABLE if ptype in where)
    for ptype in PACKET_NAMES
}
"""Packet type (``WILL`` = 0 for Will Properties) → property identifiers valid there."""

# Values the spec calls a Protocol Error (§3.1.2.11, §3.2.2.3, §3.3.2.3, §3.8.2.1).
_ZERO_OR_ONE = frozenset(
    {
        REQUEST_PROBLEM_INFORMATION,
        REQUEST_RESPONSE_INFORMATION,
        MAXIMUM_QOS,
        RETAIN_AVAILABLE,
        WILDCARD_SUBSCRIPTION_AVAILABLE,
        SUBSCRIPTION_IDENTIFIER_AVAILABLE,
        SHARED_SUBSCRIPTION_AVAILABLE,
    }
)
_NON_ZERO = frozenset({RECEIVE_MAXIMUM, MAXIMUM_PACKET_SIZE, SUBSCRIPTION_IDENTIFIER, TOPIC_ALIAS})
_CHECKED = _ZERO_OR_ONE | _NON_ZERO


def _check_value(pid: int, value: int) -> None:
    if pid in _ZERO_OR_ONE:
        if value > 1:
            raise ProtocolViolation(f"property {PROPERTY_NAMES[pid]} must be 0 or 1, got {value}")
    elif value == 0:
        if pid == TOPIC_ALIAS:
            raise ProtocolViolation("topic alias 0 is not permitted", rc.TOPIC_ALIAS_INVALID)
        raise ProtocolViolation(f"property {PROPERTY_NAMES[pid]} must not be 0")


def decode_properties(buf: bytes, pos: int, end: int, ptype: int) -> tuple[Properties, int]:
    """Decode the property block at ``buf[pos]`` (its length first) of a ``ptype`` packet.

    Unknown identifiers, identifiers not valid for the packet type, and values running past the
    property block are Malformed (§2.2.2.2); a repeated single-valued property and the
    out-of-range values listed in the spec are Protocol Errors.
    """
    if pos >= end:
        raise MalformedPacket(f"{PACKET_NAMES[ptype]} is missing its property length")
    if buf[pos] == 0:
        return EMPTY_PROPERTIES, pos + 1
    length, pos = decode_vbi(buf, pos, end)
    stop = pos + length
    if stop > end:
        raise MalformedPacket(f"{PACKET_NAMES[ptype]} property length exceeds the packet")
    allowed = ALLOWED[ptype]
    props: dict[str, Any] = {}
    while pos < stop:
        pid = buf[pos]
        pos += 1
        if pid not in allowed:
            if pid in PROPERTY_NAMES:
                raise MalformedPacket(
                    f"property {PROPERTY_NAMES[pid]} is not allowed in {PACKET_NAMES[ptype]}"
                )
            raise MalformedPacket(f"unknown property identifier 0x{pid:02X}")
        kind = _KIND[pid]
        if kind == BYTE:
            if pos >= stop:
                raise MalformedPacket("property value runs past the property length")
            value: Any = buf[pos]
            pos += 1
        elif kind == U16:
            if pos + 2 > stop:
                raise MalformedPacket("property value runs past the property length")
            value = (buf[pos] << 8) | buf[pos + 1]
            pos += 2
        elif kind == U32:
            if pos + 4 > stop:
                raise MalformedPacket("property value runs past the property length")
            value = unpack_u32_from(buf, pos)[0]
            pos += 4
        elif kind == VBI:
            value, pos = decode_vbi(buf, pos, stop)
        elif kind == STRING:
            value, pos = decode_string(buf, pos, stop)
        elif kind == BINARY:
            value, pos = decode_binary(buf, pos, stop)
        else:
            key, pos = decode_string(buf, pos, stop)
            val, pos = decode_string(buf, pos, stop)
            value = (key, val)
        if pid in _CHECKED:
            _check_value(pid, value)
        name = PROPERTY_NAMES[pid]
        if pid == USER_PROPERTY or (pid == SUBSCRIPTION_IDENTIFIER and ptype == PUBLISH):
            seq = props.get(name)
            if seq is None:
                props[name] = [value]
            else:
                seq.append(value)
        elif name in props:
            raise ProtocolViolation(
                f"property {name} appears more than once in {PACKET_NAMES[ptype]}"
            )
        else:
            props[name] = value
    return props, stop


def _encode_one(pid: int, kind: int, value: Any) -> bytes:
    if kind == BYTE:
        return bytes((pid, value))
    if kind == U16:
        return bytes((pid,)) + pack_u16(value)
    if kind == U32:
        return bytes((pid,)) + pack_u32(value)
    if kind == VBI:
        return bytes((pid,)) + encode_vbi(value)
    if kind == STRING:
        return bytes((pid,)) + encode_string(value)
    return bytes((pid,)) + encode_binary(value)


def encode_properties(props: Mapping[str, Any] | None) -> bytes:
    """Property length + properties; ``b"\\x00"`` for none. Unknown names raise ``ValueError``.

    Properties are written in the mapping's order; validity per packet type is the caller's
    responsibility (the encoder trusts its input, which also lets tests build bad packets).
    """
    if not props:
        return b"\x00"
    parts: list[bytes] = []
    for name, value in props.items():
        if value is None:
            continue
        try:
            pid, kind = _BY_NAME[name]
        except KeyError:
            raise ValueError(f"unknown MQTT property {name!r}") from None
        if kind == PAIR:
            for key, val in value:
                parts.append(b"\x26" + encode_string(key) + encode_string(val))
        elif kind == VBI and not isinstance(value, int):
            for v in value:
                parts.append(_encode_one(pid, kind, v))
        else:
            parts.append(_encode_one(pid, kind, value))
    body = b"".join(parts)
    return encode_vbi(len(body)) + body
