"""Kafka wire codec: framing, request headers, and kafka-python's ``kafka.protocol``
generated classes for bodies (DESIGN.md §10).  Pure: no sockets, no asyncio.

    splitter = FrameSplitter()
    for frame in splitter.feed(data):
        header = parse_request_header(frame)
        request = decode_request(header, frame)
        out = encode_response(response_class(header.api_key, header.api_version)(...),
                              header.correlation_id)
"""

from flowmq_wire.kafka.codec import *  # noqa: F403
from flowmq_wire.kafka.codec import __all__ as _codec_names
from flowmq_wire.kafka.errors import ErrorCode, FrameTooLarge, KafkaCodecError, MalformedRequest
from flowmq_wire.kafka.framing import DEFAULT_MAX_FRAME, FrameSplitter

__all__ = [
    *_codec_names,
    "DEFAULT_MAX_FRAME",
    "ErrorCode",
    "FrameSplitter",
    "FrameTooLarge",
    "KafkaCodecError",
    "MalformedRequest",
]
