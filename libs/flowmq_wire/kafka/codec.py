"""Kafka requests in, responses out, on kafka-python's schema-generated ``kafka.protocol``
classes (flexible versions included).

The request header is parsed here by hand (it is needed before the body's class is known,
and kafka-python's own header decoder copies the whole frame); bodies are decoded and
responses encoded by the generated classes: ``Resp[v](...)`` then ``encode_response``.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import Any, NamedTuple

from kafka.protocol import admin, consumer, metadata, producer, sasl
from kafka.protocol.api_message import ApiMessage
from kafka.protocol.metadata import ApiVersionsResponse

from flowmq_wire.kafka.errors import ErrorCode, MalformedRequest
from flowmq_wire.kafka.nulls import null_field

API_VERSIONS_KEY = 18
_HEAD = struct.Struct(">hhih")


def _api_classes() -> tuple[dict[int, type[Any]], dict[int, type[Any]]]:
    requests: dict[int, type[Any]] = {}
    responses: dict[int, type[Any]] = {}
    for module in (admin, consumer, metadata, producer, sasl):
        for name, cls in vars(module).items():
            if not (isinstance(cls, type) and issubclass(cls, ApiMessage)) or cls is ApiMessage:
                continue
            if name.endswith("Request"):
                requests[cls.API_KEY] = cls
            elif name.endswith("Response"):
                responses[cls.API_KEY] = cls
    return requests, responses


REQUEST_CLASSES, RESPONSE_CLASSES = _api_classes()
API_NAMES: dict[int, str] = {
    key: cls.__name__.removesuffix("Request") for key, cls in REQUEST_CLASSES.items()
}


def api_name(api_key: int) -> str:
    return API_NAMES.get(api_key, f"Unknown{api_key}")


def is_flexible(api_key: int, version: int) -> bool:
    cls = REQUEST_CLASSES.get(api_key)
    return cls is not None and cls.flexible_version_q(version)


class RequestHeader(NamedTuple):
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    size: int  # bytes of the header: the body starts here


def _uvarint(frame: memoryview | bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(frame) or shift > 28:
            raise MalformedRequest("bad unsigned varint in the request header")
        byte = frame[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def parse_request_header(frame: memoryview | bytes) -> RequestHeader:
    """Header v1 (``client_id`` a nullable int16 string) or, for flexible versions, v2
    (the same plus tagged fields).  Unknown API keys parse as v1."""
    if len(frame) < _HEAD.size:
        raise MalformedRequest("request shorter than its header")
    api_key, version, correlation_id, id_len = _HEAD.unpack_from(frame, 0)
    pos = _HEAD.size
    client_id = None
    if id_len >= 0:
        if pos + id_len > len(frame):
            raise MalformedRequest("client_id runs past the end of the request")
        try:
            client_id = bytes(frame[pos : pos + id_len]).decode()
        except UnicodeDecodeError:
            raise MalformedRequest("client_id is not UTF-8") from None
        pos += id_len
    elif id_len != -1:
        raise MalformedRequest(f"bad client_id length {id_len}")
    if is_flexible(api_key, version):
        count, pos = _uvarint(frame, pos)
        for _ in range(count):
            _, pos = _uvarint(frame, pos)
            size, pos = _uvarint(frame, pos)
            pos += size
        if pos > len(frame):
            raise MalformedRequest("tagged fields run past the end of the request header")
    return RequestHeader(api_key, version, correlation_id, client_id, pos)


def decode_request(header: RequestHeader, frame: memoryview) -> Any:
    """The request body as kafka-python's object for ``header.api_version``.  Raises
    ``MalformedRequest`` for bytes that do not decode, and for a null (length -1) in a field
    the schema does not let be null in that version."""
    cls = REQUEST_CLASSES[header.api_key]
    version = header.api_version
    try:
        request = cls.decode(frame[header.size :], version=version)
    except Exception as exc:  # the generated decoders raise many types on bad input
        raise MalformedRequest(f"cannot decode {cls.__name__} v{version}: {exc}") from exc
    path = null_field(cls._struct, request, version)
    if path is not None:
        raise MalformedRequest(f"{cls.__name__} v{version}: {path} is null")
    return request


def response_class(api_key: int, version: int) -> Any:
    return RESPONSE_CLASSES[api_key][version]


def encode_response(response: Any, correlation_id: int) -> bytes | bytearray:
    """Frame a response built as ``Resp[v](...)``: size, header, body."""
    response.with_header(correlation_id=correlation_id)
    return response.encode(header=True, framed=True)


def api_versions_error(
    correlation_id: int,
    supported: Iterable[tuple[int, int, int]],
    error_code: int = ErrorCode.UNSUPPORTED_VERSION,
) -> bytes | bytearray:
    """ApiVersions v0 carrying ``error_code`` and the supported ``(api_key, min, max)``
    list: what a Kafka broker answers to an ApiVersions version it does not know, and what
    FlowMQ answers to any API or version it does not implement."""
    cls = ApiVersionsResponse[0]
    response = cls(
        error_code=int(error_code),
        api_keys=[
            cls.ApiVersion(api_key=key, min_version=low, max_version=high)
            for key, low, high in supported
        ],
    )
    return encode_response(response, correlation_id)


__all__ = [
    "API_NAMES",
    "API_VERSIONS_KEY",
    "REQUEST_CLASSES",
    "RESPONSE_CLASSES",
    "RequestHeader",
    "api_name",
    "api_versions_error",
    "decode_request",
    "encode_response",
    "is_flexible",
    "parse_request_header",
    "response_class",
]
