"""Kafka wire codec: framing, request headers, and kafka-python's ``kafka.protocol``
generated classes for bodies (DESIGN.md §10).  Pure: no sockets, no asyncio.

    splitter = FrameSplitter()
    for frame in splitter.feed(data):
        header = parse_request_header(frame)
        request = decode_request(header, frame)
        out = encode_response(response_class(header.api_key, header.api_version)(...),
                              header.correlation_id)
"""

from flowmq_wire.kafka.codec import (
    API_NAMES,
    API_VERSIONS_KEY,
    REQUEST_CLASSES,
    RESPONSE_CLASSES,
    RequestHeader,
    api_name,
    api_versions_error,
    decode_request,
    encode_response,
    is_flexible,
    parse_request_header,
    response_class,
)
from flowmq_wire.kafka.errors import ErrorCode, FrameTooLarge, KafkaCodecError, MalformedRequest
from flowmq_wire.kafka.framing import DEFAULT_MAX_FRAME, FrameSplitter

__all__ = [
    "API_NAMES",
    "API_VERSIONS_KEY",
    "DEFAULT_MAX_FRAME",
    "REQUEST_CLASSES",
    "RESPONSE_CLASSES",
    "ErrorCode",
    "FrameSplitter",
    "FrameTooLarge",
    "KafkaCodecError",
    "MalformedRequest",
    "RequestHeader",
    "api_name",
    "api_versions_error",
    "decode_request",
    "encode_response",
    "is_flexible",
    "parse_request_header",
    "response_class",
]
