"""The Kafka wire helpers: framing over any split of the byte stream, request headers of
both versions, and the UNSUPPORTED_VERSION answer as kafka-python decodes it."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kafka.protocol.metadata import ApiVersionsResponse, MetadataRequest
from kafka.protocol.producer import ProduceRequest

from flowmq_wire.kafka import (
    ErrorCode,
    FrameSplitter,
    FrameTooLarge,
    MalformedRequest,
    api_versions_error,
    decode_request,
    encode_response,
    parse_request_header,
    response_class,
)


def frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


@given(
    st.lists(st.binary(min_size=10, max_size=300), min_size=1, max_size=8),
    st.lists(st.integers(min_value=1, max_value=400), min_size=1, max_size=30),
)
def test_frames_come_out_whole_however_the_stream_is_cut(payloads, cuts) -> None:
    stream = b"".join(frame(p) for p in payloads)
    splitter = FrameSplitter()
    out: list[bytes] = []
    pos = 0
    for cut in cuts:
        out.extend(bytes(f) for f in splitter.feed(stream[pos : pos + cut]))
        pos += cut
        if pos >= len(stream):
            break
    if pos < len(stream):
        out.extend(bytes(f) for f in splitter.feed(stream[pos:]))
    assert out == payloads
    assert splitter.buffered == 0


def test_oversize_and_undersize_frames_are_refused() -> None:
    with pytest.raises(FrameTooLarge):
        FrameSplitter(max_frame=1000).feed(struct.pack(">i", 1001))
    with pytest.raises(MalformedRequest):
        FrameSplitter().feed(struct.pack(">i", 4) + b"abcd")
    splitter = FrameSplitter(max_frame=1000)
    assert splitter.feed(b"\x00\x00") == []
    with pytest.raises(FrameTooLarge):
        splitter.feed(b"\x10\x00")  # the size completes across reads


@pytest.mark.parametrize("version", [1, 9, 12])
def test_headers_of_both_versions_parse(version) -> None:
    request = MetadataRequest[version](topics=None, allow_auto_topic_creation=False)
    request.with_header(correlation_id=42, client_id="unit")
    payload = bytes(request.encode(header=True, framed=True))[4:]
    header = parse_request_header(payload)
    assert (header.api_key, header.api_version, header.correlation_id, header.client_id) == (
        3,
        version,
        42,
        "unit",
    )
    decoded = decode_request(header, memoryview(payload))
    assert decoded.topics is None


def test_bad_bodies_raise_malformed_request() -> None:
    request = ProduceRequest[9](transactional_id=None, acks=1, timeout_ms=5, topic_data=[])
    request.with_header(correlation_id=1, client_id=None)
    payload = bytes(request.encode(header=True, framed=True))[4:]
    header = parse_request_header(payload)
    with pytest.raises(MalformedRequest):
        decode_request(header, memoryview(payload[: header.size + 3]))


def test_unsupported_version_answer_is_api_versions_v0() -> None:
    data = bytes(api_versions_error(7, [(0, 3, 12), (18, 0, 4)]))
    decoded = ApiVersionsResponse[0].decode(data[4:], header=True)
    assert decoded.header.correlation_id == 7
    assert decoded.error_code == ErrorCode.UNSUPPORTED_VERSION
    assert [(a.api_key, a.min_version, a.max_version) for a in decoded.api_keys] == [
        (0, 3, 12),
        (18, 0, 4),
    ]


def test_responses_encode_with_flexible_headers() -> None:
    cls = response_class(12, 4)  # Heartbeat v4: flexible
    data = bytes(encode_response(cls(throttle_time_ms=0, error_code=27), 99))
    assert struct.unpack_from(">ii", data) == (len(data) - 4, 99)
    assert data[8] == 0  # empty tagged fields of response header v1
