"""Basic content properties.

Publishers' properties are kept as the raw bytes of their content header (flags + property
list) and forwarded unchanged to AMQP consumers, so every property — header table types
included — survives end to end without a decode/encode cycle.  ``parse`` reads the fields the
broker needs (TTL, content type, headers for other protocols); ``build`` makes raw properties
for messages that came from MQTT, Kafka or HTTP.
"""

from __future__ import annotations

import struct
from typing import Any

from pamqp import decode, encode

from flowmq_wire.amqp.frames import SyntaxError_

# (name, flag bit, type) in wire order (spec: Basic class properties).
FIELDS: tuple[tuple[str, int, str], ...] = (
    ("content_type", 1 << 15, "shortstr"),
    ("content_encoding", 1 << 14, "shortstr"),
    ("headers", 1 << 13, "table"),
    ("delivery_mode", 1 << 12, "octet"),
    ("priority", 1 << 11, "octet"),
    ("correlation_id", 1 << 10, "shortstr"),
    ("reply_to", 1 << 9, "shortstr"),
    ("expiration", 1 << 8, "shortstr"),
    ("message_id", 1 << 7, "shortstr"),
    ("timestamp", 1 << 6, "timestamp"),
    ("type", 1 << 5, "shortstr"),
    ("user_id", 1 << 4, "shortstr"),
    ("app_id", 1 << 3, "shortstr"),
    ("cluster_id", 1 << 2, "shortstr"),
)
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")

EMPTY = b"\x00\x00"


def parse(raw: bytes) -> dict[str, Any]:
    """Present properties by name; ``headers`` stays raw (the table with its length prefix,
    see ``decode_headers``) since most messages are routed without looking inside it."""
    if len(raw) < 2:
        raise SyntaxError_("content header without property flags")
    flags = _U16.unpack_from(raw)[0]
    if flags & 1:
        raise SyntaxError_("basic properties have no continuation flags")
    out: dict[str, Any] = {}
    if not flags:
        return out
    pos = 2
    try:
        for name, bit, kind in FIELDS:
            if not flags & bit:
                continue
            if kind == "shortstr":
                n = raw[pos]
                stop = pos + 1 + n
                if stop > len(raw):
                    raise SyntaxError_(f"property {name} runs past the header")
                out[name] = raw[pos + 1 : stop].decode()
                pos = stop
            elif kind == "octet":
                out[name] = raw[pos]
                pos += 1
            elif kind == "timestamp":
                out[name] = _U64.unpack_from(raw, pos)[0]
                pos += 8
            else:
                n = _U32.unpack_from(raw, pos)[0]
                stop = pos + 4 + n
                if stop > len(raw):
                    raise SyntaxError_("headers table runs past the header")
                out[name] = raw[pos:stop]
                pos = stop
    except (IndexError, struct.error, UnicodeDecodeError) as exc:
        raise SyntaxError_(f"malformed basic properties: {exc}") from None
    return out


def decode_headers(raw_table: bytes) -> dict[str, Any]:
    """A raw field table (length-prefixed) -> dict, values as pamqp decodes them."""
    try:
        return decode.field_table(raw_table)[1]
    except Exception as exc:  # pamqp raises several types for bad tables
        raise SyntaxError_(f"malformed headers table: {exc}") from None


def encode_headers(table: dict[str, Any]) -> bytes:
    return encode.field_table(table)


def build(props: dict[str, Any]) -> bytes:
    """Raw properties from values; ``headers`` may be a dict or an already encoded table,
    ``timestamp`` is seconds since the epoch (int)."""
    flags = 0
    parts: list[bytes] = []
    for name, bit, kind in FIELDS:
        value = props.get(name)
        if value is None:
            continue
        flags |= bit
        if kind == "shortstr":
            data = str(value).encode()[:255]
            parts.append(bytes((len(data),)) + data)
        elif kind == "octet":
            parts.append(bytes((int(value) & 0xFF,)))
        elif kind == "timestamp":
            parts.append(_U64.pack(int(value)))
        else:
            parts.append(value if isinstance(value, bytes) else encode_headers(value))
    return _U16.pack(flags) + b"".join(parts)


def header_value_bytes(value: Any) -> bytes:
    """A header table value as bytes, for protocols whose headers are byte strings."""
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bool):
        return b"true" if value else b"false"
    return str(value).encode()
