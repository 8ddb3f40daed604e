"""MQTT data representations (v5 §1.5, 3.1.1 §1.5): Variable Byte Integer, two-byte integer,
UTF-8 encoded string, binary data.

Decoders take ``(buf, pos, end)`` and return ``(value, new_pos)``; ``end`` is the end of the
enclosing packet (or property block), never of the whole read buffer, so a field that claims
more bytes than its packet has is reported as malformed instead of swallowing the next packet.
"""

from __future__ import annotations

import struct

from flowmq_wire.mqtt.errors import MalformedPacket

MAX_VBI = 268_435_455
"""Largest Variable Byte Integer (four bytes), hence also the largest remaining length."""

pack_u16 = struct.Struct(">H").pack
pack_u32 = struct.Struct(">I").pack
unpack_u32_from = struct.Struct(">I").unpack_from


def encode_vbi(value: int) -> bytes:
    """Variable Byte Integer encoding of ``0 <= value <= MAX_VBI``."""
    if value < 0x80:
        if value < 0:
            raise ValueError(f"variable byte integer must not be negative: {value}")
        return bytes((value,))
    if value < 0x4000:
        return bytes(((value & 0x7F) | 0x80, value >> 7))
    if value > MAX_VBI:
        raise ValueError(f"variable byte integer too large: {value} > {MAX_VBI}")
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def decode_vbi(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """Decode a Variable Byte Integer inside ``buf[pos:end]``.

    Rejects more than four bytes and non-minimal encodings (a trailing 0x00 continuation),
    which the spec requires senders never to produce [MQTT-1.5.5-1].
    """
    value = 0
    shift = 0
    for i in range(pos, min(pos + 4, end)):
        byte = buf[i]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            if byte == 0 and i > pos:
                raise MalformedPacket("variable byte integer is not minimally encoded")
            return value, i + 1
        shift += 7
    if end - pos >= 4:
        raise MalformedPacket("variable byte integer longer than four bytes")
    raise MalformedPacket("variable byte integer runs past the end of the packet")


def encode_string(text: str) -> bytes:
    """Two-byte length + UTF-8; a string with a lone surrogate raises ``UnicodeEncodeError``."""
    data = text.encode()
    if len(data) > 0xFFFF:
        raise ValueError(f"MQTT string longer than 65535 bytes ({len(data)})")
    return pack_u16(len(data)) + data


def encode_binary(data: bytes | bytearray | memoryview) -> bytes:
    """Two-byte length + the bytes."""
    if len(data) > 0xFFFF:
        raise ValueError(f"MQTT binary data longer than 65535 bytes ({len(data)})")
    return pack_u16(len(data)) + bytes(data)


def _field_span(buf: bytes, pos: int, end: int, what: str) -> tuple[int, int]:
    """Where the bytes of a two-byte-length-prefixed field at ``pos`` start and stop."""
    start = pos + 2
    if start > end:
        raise MalformedPacket(f"{what} length runs past the end of the packet")
    stop = start + ((buf[pos] << 8) | buf[pos + 1])
    if stop > end:
        raise MalformedPacket(f"{what} runs past the end of the packet")
    return start, stop


def decode_string(buf: bytes, pos: int, end: int) -> tuple[str, int]:
    """Decode a UTF-8 encoded string; ill-formed UTF-8 (including encoded surrogates
    U+D800-DFFF, which Python's strict codec rejects) and U+0000 are malformed [MQTT-1.5.4]."""
    start, stop = _field_span(buf, pos, end, "string")
    try:
        text = buf[start:stop].decode()
    except UnicodeDecodeError as e:
        raise MalformedPacket(f"string is not well-formed UTF-8 ({e.reason})") from None
    if "\x00" in text:
        raise MalformedPacket("string contains U+0000")
    return text, stop


def decode_binary(buf: bytes, pos: int, end: int) -> tuple[bytes, int]:
    """Decode binary data (two-byte length + bytes)."""
    start, stop = _field_span(buf, pos, end, "binary data")
    return buf[start:stop], stop
