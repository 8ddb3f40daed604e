"""The stored form of a queued message body: a ``Message`` in a compact binary layout.

Bodies live in the batcher's segment objects next to stream chunks, so this is what a ranged
GET brings back.  Layout (big-endian)::

    version u8 | qos u8 | flags u8 (1 retain, 2 has key, 4 has content type, 8 has expiry)
    timestamp_ms i64 | [expiry_ms i64] | topic u16+utf8 | source u8+ascii
    [content_type u16+utf8] | [key u32+bytes]
    header count u16, each: name u16+utf8, value u32+bytes
    property count u16, each: name u8+ascii, type u8, value (see _PROP_*)
    payload (the rest)

Only JSON-like property values survive (str, bytes, int, bool, float, None); adapters keep
their protocol extras in that form (AMQP raw properties are bytes).
"""

from __future__ import annotations

import struct
from typing import Any

from flowmq_core.message import Message

VERSION = 1
_HEAD = struct.Struct(">BBBq")
_I64 = struct.Struct(">q")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_F64 = struct.Struct(">d")

_RETAIN, _HAS_KEY, _HAS_CT, _HAS_EXPIRY = 1, 2, 4, 8
_PROP_BYTES, _PROP_STR, _PROP_INT, _PROP_TRUE, _PROP_FALSE, _PROP_NONE, _PROP_FLOAT = range(7)


class CorruptBody(Exception):
    pass


def encode_message(m: Message) -> bytes:
    # Hot path (one call per queued message): %-formatting and one struct per field group
    # cost ~1 us where a part-by-part build cost ~4 us.
    flags = (
        (_RETAIN if m.retain else 0)
        | (_HAS_KEY if m.key is not None else 0)
        | (_HAS_CT if m.content_type is not None else 0)
        | (_HAS_EXPIRY if m.expiry_ms is not None else 0)
    )
    topic = m.topic.encode()
    source = m.source_protocol.encode()[:255]
    out = [
        _HEAD.pack(VERSION, m.qos, flags, m.timestamp_ms),
        _I64.pack(m.expiry_ms) if m.expiry_ms is not None else b"",
        b"%s%s%c%s" % (_U16.pack(len(topic)), topic, len(source), source),
    ]
    if m.content_type is not None:
        ct = m.content_type.encode()
        out.append(_U16.pack(len(ct)) + ct)
    if m.key is not None:
        out.append(_U32.pack(len(m.key)) + m.key)
    out.append(_U16.pack(len(m.headers)))
    for name, value in m.headers:
        raw = name.encode()
        out.append(b"%s%s%s%s" % (_U16.pack(len(raw)), raw, _U32.pack(len(value)), value))
    props = [_encode_prop(k, v) for k, v in m.properties.items()]
    props = [p for p in props if p is not None]
    out.append(_U16.pack(len(props)))
    out += props
    out.append(m.payload)
    return b"".join(out)


def _encode_prop(name: str, value: Any) -> bytes | None:
    """``name u8+ascii | type u8 | value``; None for names or values we cannot keep."""
    key = name.encode()
    if len(key) > 255:
        return None
    kind = type(value)
    if kind is bytes or kind is bytearray:
        return b"%c%s%c%s%s" % (len(key), key, _PROP_BYTES, _U32.pack(len(value)), value)
    if kind is str:
        raw = value.encode()
        return b"%c%s%c%s%s" % (len(key), key, _PROP_STR, _U32.pack(len(raw)), raw)
    if value is None:
        return b"%c%s%c" % (len(key), key, _PROP_NONE)
    if value is True or value is False:
        return b"%c%s%c" % (len(key), key, _PROP_TRUE if value else _PROP_FALSE)
    if kind is int:
        return b"%c%s%c%s" % (len(key), key, _PROP_INT, _I64.pack(value))
    if kind is float:
        return b"%c%s%c%s" % (len(key), key, _PROP_FLOAT, _F64.pack(value))
    return None


def decode_message(data: bytes) -> Message:
    try:
        return _decode(data)
    except (IndexError, struct.error, UnicodeDecodeError, ValueError) as exc:
        raise CorruptBody(f"stored message body does not decode: {exc}") from None


def _decode(data: bytes) -> Message:
    version, qos, flags, timestamp = _HEAD.unpack_from(data)
    if version != VERSION:
        raise ValueError(f"unknown body version {version}")
    pos = _HEAD.size
    expiry = None
    if flags & _HAS_EXPIRY:
        expiry = _I64.unpack_from(data, pos)[0]
        pos += 8
    n = _U16.unpack_from(data, pos)[0]
    topic = data[pos + 2 : pos + 2 + n].decode()
    pos += 2 + n
    n = data[pos]
    source = data[pos + 1 : pos + 1 + n].decode()
    pos += 1 + n
    content_type = None
    if flags & _HAS_CT:
        n = _U16.unpack_from(data, pos)[0]
        content_type = data[pos + 2 : pos + 2 + n].decode()
        pos += 2 + n
    key = None
    if flags & _HAS_KEY:
        n = _U32.unpack_from(data, pos)[0]
        key = data[pos + 4 : pos + 4 + n]
        pos += 4 + n
    count = _U16.unpack_from(data, pos)[0]
    pos += 2
    headers = []
    for _ in range(count):
        n = _U16.unpack_from(data, pos)[0]
        name = data[pos + 2 : pos + 2 + n].decode()
        pos += 2 + n
        n = _U32.unpack_from(data, pos)[0]
        headers.append((name, data[pos + 4 : pos + 4 + n]))
        pos += 4 + n
    count = _U16.unpack_from(data, pos)[0]
    pos += 2
    props: dict[str, Any] = {}
    for _ in range(count):
        n = data[pos]
        name = data[pos + 1 : pos + 1 + n].decode()
        pos += 1 + n
        kind = data[pos]
        pos += 1
        if kind == _PROP_NONE:
            value: Any = None
        elif kind == _PROP_TRUE:
            value = True
        elif kind == _PROP_FALSE:
            value = False
        elif kind == _PROP_INT:
            value = _I64.unpack_from(data, pos)[0]
            pos += 8
        elif kind == _PROP_FLOAT:
            value = _F64.unpack_from(data, pos)[0]
            pos += 8
        elif kind in (_PROP_STR, _PROP_BYTES):
            n = _U32.unpack_from(data, pos)[0]
            raw = data[pos + 4 : pos + 4 + n]
            pos += 4 + n
            value = raw.decode() if kind == _PROP_STR else bytes(raw)
        else:
            raise ValueError(f"unknown property type {kind}")
        props[name] = value
    if pos > len(data):
        raise ValueError("body is truncated")
    return Message(
        topic=topic,
        payload=bytes(data[pos:]),
        qos=qos,
        retain=bool(flags & _RETAIN),
        headers=headers,
        timestamp_ms=timestamp,
        key=key,
        content_type=content_type,
        expiry_ms=expiry,
        source_protocol=source,
        properties=props,
    )
