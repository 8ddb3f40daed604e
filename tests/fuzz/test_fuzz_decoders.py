"""Property tests of the three wire decoders, each run as its listener runs it.

Whatever bytes arrive — random, or a valid frame of the live fuzzer's corpus mutated by its
mutators (tests/fixtures/fuzz) — a decoder returns what it decoded or raises its codec's own
error type, never another exception (which a listener would not answer as a protocol
error).  And a valid frame decodes to what encodes back to the same bytes.  The MQTT decoder
has more of both in tests/unit/wire/mqtt; here it meets the live fuzzer's frames.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowmq_wire.amqp import frames as fr
from flowmq_wire.amqp import properties
from flowmq_wire.amqp.methods import UnknownMethod, decode_method, encode_method
from flowmq_wire.kafka import (
    FrameSplitter,
    KafkaCodecError,
    decode_request,
    parse_request_header,
)
from flowmq_wire.mqtt.codec import MqttCodecError, MqttDecoder, encode
from tests.fixtures.fuzz.amqp import AmqpFuzz
from tests.fixtures.fuzz.kafka import SERVED, KafkaFuzz
from tests.fixtures.fuzz.mqtt import MqttFuzz
from tests.fixtures.fuzz.mutations import FuzzProtocol, junk, mutate

SETTINGS = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
_VERSIONS = {key: (low, high) for key, low, high in SERVED}


# --- each decoder as its listener drives it ----------------------------------------------------


def decode_mqtt(opening: bytes, chunks: list[bytes]) -> list:
    decoder = MqttDecoder()
    return [p for chunk in (opening, *chunks) for p in decoder.feed(chunk)]


def decode_kafka(opening: bytes, chunks: list[bytes]) -> list:
    """Frames, then (as KafkaConnection does for the APIs and versions it serves) header and
    body."""
    splitter = FrameSplitter()
    out = []
    for chunk in (opening, *chunks):
        for frame in splitter.feed(chunk):
            header = parse_request_header(frame)
            low, high = _VERSIONS.get(header.api_key, (1, 0))
            if low <= header.api_version <= high:
                out.append(decode_request(header, frame))
    return out


def decode_amqp(opening: bytes, chunks: list[bytes]) -> list:
    """Frames after the protocol header, then what AmqpConnection and Channel decode: methods
    (the per-message ones by hand), content headers and their properties."""
    reader = fr.FrameReader()
    out: list = []
    for chunk in (opening[len(fr.PROTOCOL_HEADER) :], *chunks):
        for frame_type, _, payload in reader.feed(chunk):
            if frame_type == fr.FRAME_METHOD:
                index = fr.method_index(payload)
                if index == fr.BASIC_PUBLISH:
                    out.append(fr.decode_publish(payload))
                elif index in (fr.BASIC_ACK, fr.BASIC_NACK, fr.BASIC_REJECT):
                    out.append(fr.decode_tag_bits(payload))
                else:
                    out.append(decode_method(payload))
            elif frame_type == fr.FRAME_HEADER:
                _, _, raw = fr.decode_content_header(payload)
                props = properties.parse(raw)
                if "headers" in props:
                    properties.decode_headers(props["headers"])
                out.append(props)
    return out


Decode = Callable[[bytes, list[bytes]], list]
CASES: list[tuple[FuzzProtocol, Decode, tuple[type[Exception], ...]]] = [
    (MqttFuzz(), decode_mqtt, (MqttCodecError,)),
    (KafkaFuzz(), decode_kafka, (KafkaCodecError,)),
    (AmqpFuzz(), decode_amqp, (fr.FrameError, fr.SyntaxError_, UnknownMethod)),
]
IDS = [protocol.name for protocol, _, _ in CASES]


def _split(data: st.DataObject, stream: bytes) -> list[bytes]:
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=3)))
    bounds = [0, *cuts, len(stream)]
    return [stream[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def _opening(protocol: FuzzProtocol, rng: random.Random) -> tuple[bytes, str]:
    """The handshake as one stream (its steps joined), and its dialect."""
    steps, dialect = protocol.handshake(rng)
    return b"".join(steps), dialect


# --- any bytes: decoded, or the codec's own error -----------------------------------------------


@pytest.mark.parametrize(("protocol", "decode", "errors"), CASES, ids=IDS)
def test_random_bytes_after_a_handshake(protocol, decode, errors) -> None:
    @SETTINGS
    @given(st.integers(0, 2**32), st.binary(max_size=300), st.data())
    def check(seed: int, tail: bytes, data: st.DataObject) -> None:
        opening, _ = _opening(protocol, random.Random(seed))
        try:
            decode(opening, _split(data, tail))
        except errors:
            pass

    check()


@pytest.mark.parametrize(("protocol", "decode", "errors"), CASES, ids=IDS)
def test_mutated_frames(protocol, decode, errors) -> None:
    """A valid handshake (sometimes mutated itself), then valid frames with one mutated."""

    @SETTINGS
    @given(st.integers(0, 2**32), st.integers(1, 6), st.data())
    def check(seed: int, count: int, data: st.DataObject) -> None:
        rng = random.Random(seed)
        opening, dialect = _opening(protocol, rng)
        frames = [protocol.frame(rng, dialect) for _ in range(count)]
        bad = rng.randrange(-1, count)  # -1: the handshake
        if bad < 0:
            opening = mutate(rng, opening, frames[0], protocol)
        else:
            frames[bad] = mutate(rng, frames[bad], frames[0], protocol)
            if rng.random() < 0.1:
                frames[bad] = junk(rng)
        try:
            decode(opening, _split(data, b"".join(frames)))
        except errors:
            pass

    check()


# --- valid frames: encode(decode(x)) == x ------------------------------------------------------


@SETTINGS
@given(st.integers(0, 2**32))
def test_mqtt_packets_encode_back_to_their_bytes(seed: int) -> None:
    rng = random.Random(seed)
    protocol = MqttFuzz()
    steps, dialect = protocol.handshake(rng)
    frames = [protocol.frame(rng, dialect) for _ in range(8)]
    packets = decode_mqtt(steps[0], frames)
    level = int(dialect)
    assert [encode(p, level) for p in packets] == [steps[0], *frames]


@SETTINGS
@given(st.integers(0, 2**32))
def test_kafka_requests_encode_back_to_their_bytes(seed: int) -> None:
    frame = KafkaFuzz().frame(random.Random(seed), "")
    (body,) = FrameSplitter().feed(frame)
    header = parse_request_header(body)
    if header.api_key not in _VERSIONS:
        return  # an API the broker does not serve: not decoded
    request = decode_request(header, body)
    assert header.api_key == request.API_KEY
    request.with_header(correlation_id=header.correlation_id, client_id=header.client_id)
    assert bytes(request.encode(header=True, framed=True)) == frame


@SETTINGS
@given(st.integers(0, 2**32))
def test_amqp_methods_and_properties_encode_back_to_their_bytes(seed: int) -> None:
    frame = AmqpFuzz().frame(random.Random(seed), "")
    parsed = fr.FrameReader().feed(frame)
    frame_type, channel, payload = parsed[0]
    if frame_type == fr.FRAME_HEARTBEAT:
        return
    assert encode_method(channel, decode_method(payload)) == frame[: 8 + len(payload)]
    for frame_type, _, payload in parsed[1:]:
        if frame_type == fr.FRAME_HEADER:
            _, _, raw = fr.decode_content_header(payload)
            props = properties.parse(raw)
            if "headers" in props:
                props["headers"] = properties.decode_headers(props["headers"])
            assert properties.build(props) == raw
