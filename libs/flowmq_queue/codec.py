"""The stored form of a queued message body: the message's one serialised form.

Bodies live in the batcher's segment objects next to stream chunks, so this is what a ranged
GET brings back.  A body is exactly ``flowmq_core.message_codec.encode_message(message)`` —
the form cluster frames and retained MQTT messages use too — with no envelope of its own: the
index entry already says where each body starts and how long it is.  A body that does not
decode (written by FlowMQ-py before that form, or damaged) raises :class:`CorruptBody`.
"""

from __future__ import annotations

from flowmq_core.message import Message
from flowmq_core.message_codec import CorruptMessage, encode_message
from flowmq_core.message_codec import decode_message as _decode_message


class CorruptBody(Exception):
    pass


def decode_message(data: bytes | bytearray | memoryview) -> Message:
    try:
        return _decode_message(data)
    except CorruptMessage as exc:
        raise CorruptBody(f"stored message body does not decode: {exc}") from None


__all__ = ["CorruptBody", "decode_message", "encode_message"]
