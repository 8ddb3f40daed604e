"""AMQP 0-9-1 framing and the per-message methods, by hand (see the package docstring).

A frame is ``type u8 | channel u16 | size u32 | payload | 0xCE``.  ``FrameReader`` splits a
byte stream into ``(type, channel, payload)``; the ``encode_*`` functions build whole frames
(a message: method + content header + body frames) ready to be joined into one write.
"""

from __future__ import annotations

import struct
from typing import Any

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_METHOD = 1
FRAME_HEADER = 2
FRAME_BODY = 3
FRAME_HEARTBEAT = 8
FRAME_END = 0xCE
FRAME_END_BYTE = b"\xce"
FRAME_MIN_SIZE = 4096  # every peer must accept frames this large (spec 4.2.3)
FRAME_OVERHEAD = 8  # header 7 + end 1

CLASS_BASIC = 60
# (class << 16) | method of the methods handled by hand.
BASIC_PUBLISH = 0x003C0028
BASIC_RETURN = 0x003C0032
BASIC_DELIVER = 0x003C003C
BASIC_GET_OK = 0x003C0047
BASIC_ACK = 0x003C0050
BASIC_REJECT = 0x003C005A
BASIC_NACK = 0x003C0078

_HEAD = struct.Struct(">BHI")
_METHOD_ID = struct.Struct(">I")
_U16 = struct.Struct(">H")
_TAG_BITS = struct.Struct(">QB")
_CONTENT_HEADER = struct.Struct(">HHQ")

HEARTBEAT_FRAME = _HEAD.pack(FRAME_HEARTBEAT, 0, 0) + FRAME_END_BYTE


class FrameError(Exception):
    """Framing is broken (bad end octet, oversized or unknown frame): the connection must be
    closed with 501 FRAME_ERROR, as nothing after it can be trusted."""


class FrameTooLarge(FrameError):
    """A frame larger than the negotiated frame_max (501 FRAME_ERROR)."""


class SyntaxError_(Exception):  # noqa: N801 - the builtin name is taken
    """A method's arguments do not parse: 502 SYNTAX_ERROR."""


# Not on the wire: what ``FrameReader`` makes of the per-message frames it recognises, so a
# run of publishes (or acks) costs one item each instead of three frames and a method decode.
# A Basic.Publish with its content header (class Basic) and exactly one body frame holding
# the whole body: payload ``(exchange, routing key, bits, raw properties, body)``.
FRAME_PUBLISH = 0x101
# A Basic.Ack from a client: payload ``(delivery tag, multiple)``.
FRAME_ACK = 0x102

# The method each stands for, in errors about it.
PSEUDO_METHODS = {FRAME_PUBLISH: BASIC_PUBLISH, FRAME_ACK: BASIC_ACK}

Frame = tuple[int, int, Any]

_PUBLISH_PREFIX = b"\x00\x3c\x00\x28"  # Basic.Publish's class and method ids
_ACK_PREFIX = b"\x00\x3c\x00\x50"
# Per connection: a client cycling through names costs at most ~300 KB here, not megabytes.
_PUBLISH_CACHE_MAX = 256


class FrameReader:
    """Incremental frame splitter; ``feed`` returns every complete frame of the data so far.
    With ``whole_messages`` (a server reading clients), a whole publish (FRAME_PUBLISH) or a
    Basic.Ack (FRAME_ACK) is one item when well formed (anything unusual stays separate
    frames, for the generic path to judge and refuse)."""

    __slots__ = ("_buf", "_publishes", "max_frame_size", "whole_messages")

    def __init__(self, max_frame_size: int = 131072, *, whole_messages: bool = False) -> None:
        self._buf = b""
        self.max_frame_size = max_frame_size
        self.whole_messages = whole_messages
        # Basic.Publish arguments (raw) -> decoded: publishers repeat a few exchanges/keys.
        self._publishes: dict[bytes, tuple[str, str, int] | None] = {}

    def feed(self, data: bytes) -> list[Frame]:
        buf = self._buf + data if self._buf else data
        frames: list[Frame] = []
        append = frames.append
        pos = 0
        end = len(buf)
        limit = self.max_frame_size
        unpack = _HEAD.unpack_from
        whole = self.whole_messages
        while end - pos >= 7:
            frame_type, channel, size = unpack(buf, pos)
            if size + FRAME_OVERHEAD > limit:
                raise FrameTooLarge(f"frame of {size} bytes exceeds frame_max {limit}")
            stop = pos + 7 + size
            if stop >= end:
                break
            if buf[stop] != FRAME_END:
                raise FrameError(f"frame end octet is 0x{buf[stop]:02x}, not 0xce")
            if frame_type == FRAME_METHOD and whole and size >= 4 and channel:
                ids = buf[pos + 7 : pos + 11]
                if ids == _PUBLISH_PREFIX:
                    publish = self._publish(buf, pos + 7, stop, channel)
                    if publish is not None:
                        item, pos = publish
                        append(item)
                        continue
                elif ids == _ACK_PREFIX and size == 13:
                    tag, bits = _TAG_BITS.unpack_from(buf, pos + 11)
                    append((FRAME_ACK, channel, (tag, bits & 1)))
                    pos = stop + 1
                    continue
            elif frame_type not in (FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT, FRAME_METHOD):
                raise FrameError(f"unknown frame type {frame_type}")
            append((frame_type, channel, buf[pos + 7 : stop]))
            pos = stop + 1
        self._buf = buf[pos:] if pos < end else b""
        return frames

    def _publish(self, buf: bytes, start: int, stop: int, channel: int) -> tuple[Frame, int] | None:
        """The publish whose method payload is ``buf[start:stop]``, with its content header and
        single body frame when all are complete, well formed and on ``channel``; its end."""
        end = len(buf)
        head = stop + 1  # the content header frame
        if end - head < 7 + 14:
            return None
        frame_type, hchannel, hsize = _HEAD.unpack_from(buf, head)
        hstop = head + 7 + hsize
        if frame_type != FRAME_HEADER or hchannel != channel or hsize < 14 or hstop >= end:
            return None
        class_id, _weight, body_size = _CONTENT_HEADER.unpack_from(buf, head + 7)
        if class_id != CLASS_BASIC or buf[hstop] != FRAME_END or body_size == 0:
            return None
        body_at = hstop + 1
        if end - body_at < 7:
            return None
        frame_type, bchannel, bsize = _HEAD.unpack_from(buf, body_at)
        bstop = body_at + 7 + bsize
        if (
            frame_type != FRAME_BODY
            or bchannel != channel
            or bsize != body_size
            or bsize + FRAME_OVERHEAD > self.max_frame_size
            or bstop >= end
            or buf[bstop] != FRAME_END
        ):
            return None
        arguments = buf[start + 6 : stop]  # after the ids and reserved-1
        decoded = self._publishes.get(arguments)
        if decoded is None:
            decoded = _publish_arguments(buf, start, stop)
            if decoded is None:
                return None
            if len(self._publishes) >= _PUBLISH_CACHE_MAX:
                self._publishes.clear()
            self._publishes[arguments] = decoded
        exchange, routing_key, bits = decoded
        item = (
            FRAME_PUBLISH,
            channel,
            (exchange, routing_key, bits, buf[head + 19 : hstop], buf[body_at + 7 : bstop]),
        )
        return item, bstop + 1

    @property
    def buffered(self) -> int:
        return len(self._buf)


def _publish_arguments(buf: bytes, start: int, stop: int) -> tuple[str, str, int] | None:
    """Exchange, routing key and bits of a Basic.Publish filling exactly ``buf[start:stop]``;
    None when it does not parse (the generic path refuses it)."""
    pos = start + 6
    names = []
    for _ in range(2):
        if pos >= stop:
            return None
        name_end = pos + 1 + buf[pos]
        if name_end >= stop:
            return None
        try:
            names.append(buf[pos + 1 : name_end].decode())
        except UnicodeDecodeError:
            return None
        pos = name_end
    if pos + 1 != stop:
        return None
    return names[0], names[1], buf[pos]


# --- decoding --------------------------------------------------------------------------------


def method_index(payload: bytes) -> int:
    if len(payload) < 4:
        raise SyntaxError_("method frame shorter than its class and method ids")
    return _METHOD_ID.unpack_from(payload)[0]


def _shortstr(payload: bytes, pos: int) -> tuple[str, int]:
    n = payload[pos]
    stop = pos + 1 + n
    if stop > len(payload):
        raise SyntaxError_("short string runs past the end of the frame")
    try:
        return payload[pos + 1 : stop].decode(), stop
    except UnicodeDecodeError:
        raise SyntaxError_("short string is not valid UTF-8") from None


def decode_publish(payload: bytes) -> tuple[str, str, bool, bool]:
    """Basic.Publish -> (exchange, routing key, mandatory, immediate)."""
    try:
        exchange, pos = _shortstr(payload, 6)  # class, method, reserved-1
        routing_key, pos = _shortstr(payload, pos)
        bits = payload[pos]
    except IndexError:
        raise SyntaxError_("truncated Basic.Publish") from None
    return exchange, routing_key, bool(bits & 1), bool(bits & 2)


def decode_tag_bits(payload: bytes) -> tuple[int, int]:
    """Basic.Ack / Nack / Reject -> (delivery tag, bit octet)."""
    if len(payload) < 13:
        raise SyntaxError_("truncated acknowledgement")
    return _TAG_BITS.unpack_from(payload, 4)


def decode_content_header(payload: bytes) -> tuple[int, int, bytes]:
    """Content header -> (class id, body size, raw properties: flags + property list)."""
    if len(payload) < 14:
        raise SyntaxError_("truncated content header")
    class_id, _weight, size = _CONTENT_HEADER.unpack_from(payload)
    return class_id, size, payload[12:]


# --- encoding --------------------------------------------------------------------------------


def shortstr(value: str) -> bytes:
    raw = value.encode()
    if len(raw) > 255:
        raise ValueError(f"short string of {len(raw)} bytes (at most 255)")
    return bytes((len(raw),)) + raw


def frame(frame_type: int, channel: int, payload: bytes) -> bytes:
    return _HEAD.pack(frame_type, channel, len(payload)) + payload + FRAME_END_BYTE


def method_frame(channel: int, payload: bytes) -> bytes:
    return _HEAD.pack(FRAME_METHOD, channel, len(payload)) + payload + FRAME_END_BYTE


def content_frames(channel: int, props: bytes, body: bytes, frame_max: int) -> bytes:
    """Content header + body frames (the body split to fit ``frame_max``)."""
    header = _CONTENT_HEADER.pack(CLASS_BASIC, 0, len(body)) + props
    parts = [_HEAD.pack(FRAME_HEADER, channel, len(header)), header, FRAME_END_BYTE]
    room = frame_max - FRAME_OVERHEAD
    if len(body) <= room:
        if body:
            parts += [_HEAD.pack(FRAME_BODY, channel, len(body)), body, FRAME_END_BYTE]
    else:
        view = memoryview(body)
        for start in range(0, len(body), room):
            piece = view[start : start + room]
            parts += [_HEAD.pack(FRAME_BODY, channel, len(piece)), piece, FRAME_END_BYTE]
    return b"".join(parts)


_DELIVER_ID = _METHOD_ID.pack(BASIC_DELIVER)
_GET_OK_ID = _METHOD_ID.pack(BASIC_GET_OK)
_RETURN_ID = _METHOD_ID.pack(BASIC_RETURN)
_ACK_ID = _METHOD_ID.pack(BASIC_ACK)
_NACK_ID = _METHOD_ID.pack(BASIC_NACK)
_U64 = struct.Struct(">Q")
_U32 = struct.Struct(">I")


def encode_deliver(
    channel: int,
    consumer_tag: bytes,
    delivery_tag: int,
    redelivered: bool,
    exchange_and_key: bytes,
    props: bytes,
    body: bytes,
    frame_max: int,
) -> bytes:
    """Basic.Deliver + content.  ``consumer_tag`` and ``exchange_and_key`` are already
    short-string encoded (callers cache them: they repeat for every message)."""
    payload = b"".join(
        (
            _DELIVER_ID,
            consumer_tag,
            _U64.pack(delivery_tag),
            b"\x01" if redelivered else b"\x00",
            exchange_and_key,
        )
    )
    return method_frame(channel, payload) + content_frames(channel, props, body, frame_max)


class DeliverEncoder:
    """Basic.Deliver + content header + one body frame for the messages of one shape (channel,
    consumer tag, exchange and routing key, properties), from bytes prepared once: per message
    one ``struct`` pack of the tag and sizes, then the body."""

    __slots__ = ("_again", "_head", "_pack", "_plain", "_tail", "room")

    def __init__(
        self,
        channel: int,
        consumer_tag: bytes,
        exchange_and_key: bytes,
        props: bytes,
        frame_max: int,
    ) -> None:
        method_size = 4 + len(consumer_tag) + 8 + 1 + len(exchange_and_key)
        self._head = _HEAD.pack(FRAME_METHOD, channel, method_size) + _DELIVER_ID + consumer_tag
        header = FRAME_END_BYTE + _HEAD.pack(FRAME_HEADER, channel, 12 + len(props))
        header += _U16.pack(CLASS_BASIC) + b"\x00\x00"  # weight
        self._plain = b"\x00" + exchange_and_key + header
        self._again = b"\x01" + exchange_and_key + header
        self._tail = props + FRAME_END_BYTE + bytes((FRAME_BODY,)) + _U16.pack(channel)
        self._pack = struct.Struct(
            f">{len(self._head)}sQ{len(self._plain)}sQ{len(self._tail)}sI"
        ).pack
        self.room = frame_max - FRAME_OVERHEAD  # the largest body one frame holds

    def encode(self, out: list[bytes], tag: int, redelivered: bool, body: bytes) -> None:
        """Append the frames for a body of 1 to ``room`` bytes (``encode_deliver`` otherwise)."""
        size = len(body)
        mid = self._again if redelivered else self._plain
        out.append(self._pack(self._head, tag, mid, size, self._tail, size))
        out.append(body)
        out.append(FRAME_END_BYTE)


def encode_get_ok(
    channel: int,
    delivery_tag: int,
    redelivered: bool,
    exchange_and_key: bytes,
    message_count: int,
    props: bytes,
    body: bytes,
    frame_max: int,
) -> bytes:
    payload = b"".join(
        (
            _GET_OK_ID,
            _U64.pack(delivery_tag),
            b"\x01" if redelivered else b"\x00",
            exchange_and_key,
            _U32.pack(message_count),
        )
    )
    return method_frame(channel, payload) + content_frames(channel, props, body, frame_max)


def encode_return(
    channel: int,
    reply_code: int,
    reply_text: str,
    exchange: str,
    routing_key: str,
    props: bytes,
    body: bytes,
    frame_max: int,
) -> bytes:
    payload = b"".join(
        (
            _RETURN_ID,
            _U16.pack(reply_code),
            shortstr(reply_text),
            shortstr(exchange),
            shortstr(routing_key),
        )
    )
    return method_frame(channel, payload) + content_frames(channel, props, body, frame_max)


def encode_ack(channel: int, delivery_tag: int, multiple: bool) -> bytes:
    """Basic.Ack from the server: a publisher confirm."""
    return method_frame(channel, _ACK_ID + _TAG_BITS.pack(delivery_tag, 1 if multiple else 0))


def encode_nack(channel: int, delivery_tag: int, multiple: bool) -> bytes:
    return method_frame(channel, _NACK_ID + _TAG_BITS.pack(delivery_tag, 1 if multiple else 0))
