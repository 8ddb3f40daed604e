"""The hand-written AMQP codec agrees with pamqp's (an independent implementation)."""

from __future__ import annotations

import pytest
from pamqp import body as pbody
from pamqp import commands, frame, header

from flowmq_wire.amqp import frames as fr
from flowmq_wire.amqp import properties
from flowmq_wire.amqp.methods import UnknownMethod, decode_method, encode_method

PROPS = commands.Basic.Properties(
    content_type="text/plain",
    headers={"a": 1, "b": "x", "c": {"d": True}},
    delivery_mode=2,
    correlation_id="c1",
    expiration="1000",
    timestamp=None,
    app_id="app",
)


def test_reader_splits_frames_across_reads() -> None:
    data = (
        frame.marshal(commands.Basic.Publish(exchange="ex", routing_key="rk", mandatory=True), 1)
        + frame.marshal(header.ContentHeader(0, 5, PROPS), 1)
        + frame.marshal(pbody.ContentBody(b"hello"), 1)
    )
    reader = fr.FrameReader()
    frames = []
    for i in range(len(data)):
        frames += reader.feed(data[i : i + 1])
    assert [(t, ch) for t, ch, _ in frames] == [(1, 1), (2, 1), (3, 1)]
    assert fr.decode_publish(frames[0][2]) == ("ex", "rk", True, False)
    class_id, size, raw = fr.decode_content_header(frames[1][2])
    assert (class_id, size) == (60, 5)
    parsed = properties.parse(raw)
    assert parsed["content_type"] == "text/plain" and parsed["delivery_mode"] == 2
    assert properties.decode_headers(parsed["headers"]) == PROPS.headers
    assert frames[2][2] == b"hello"


def test_bad_frame_end_and_oversized_frames() -> None:
    with pytest.raises(fr.FrameError):
        fr.FrameReader().feed(b"\x01\x00\x00\x00\x00\x00\x01x\x00")
    with pytest.raises(fr.FrameError):
        fr.FrameReader(4096).feed(b"\x03\x00\x01\x00\x01\x00\x00")


def test_deliver_and_confirm_encoders_match_pamqp() -> None:
    raw = properties.build({"content_type": "text/plain", "delivery_mode": 2})
    big = b"y" * 10_000
    data = fr.encode_deliver(
        3, fr.shortstr("ctag"), 7, True, fr.shortstr("ex") + fr.shortstr("rk"), raw, big, 4096
    )
    out = []
    while data:
        used, channel, value = frame.unmarshal(data)
        out.append((channel, value))
        data = data[used:]
    deliver = out[0][1]
    assert isinstance(deliver, commands.Basic.Deliver)
    assert (deliver.consumer_tag, deliver.delivery_tag, deliver.redelivered) == ("ctag", 7, True)
    assert (deliver.exchange, deliver.routing_key) == ("ex", "rk")
    assert out[1][1].body_size == len(big) and out[1][1].properties.content_type == "text/plain"
    assert b"".join(v.value for _, v in out[2:]) == big and all(ch == 3 for ch, _ in out)
    _, _, ack = frame.unmarshal(fr.encode_ack(1, 99, True))
    assert (ack.delivery_tag, ack.multiple) == (99, True)
    _, _, nack = frame.unmarshal(fr.encode_nack(1, 5, False))
    assert isinstance(nack, commands.Basic.Nack) and nack.delivery_tag == 5


def test_properties_build_parse_round_trip() -> None:
    values = {
        "content_type": "application/json",
        "content_encoding": "gzip",
        "headers": {"k": "v", "n": 3},
        "delivery_mode": 1,
        "priority": 9,
        "correlation_id": "x",
        "reply_to": "r",
        "expiration": "60000",
        "message_id": "m",
        "timestamp": 1_700_000_000,
        "type": "t",
        "user_id": "u",
        "app_id": "a",
        "cluster_id": "c",
    }
    parsed = properties.parse(properties.build(values))
    parsed["headers"] = properties.decode_headers(parsed["headers"])
    assert parsed == values
    assert properties.parse(properties.EMPTY) == {}


def test_methods_round_trip_and_unknown_method() -> None:
    method = commands.Queue.Declare(queue="q with space", durable=True, arguments={"x": 1})
    data = encode_method(2, method)
    assert decode_method(data[7:-1]).queue == "q with space"
    with pytest.raises(UnknownMethod):
        decode_method(b"\x00\x63\x00\x01")
    with pytest.raises(fr.SyntaxError_):
        fr.decode_publish(b"\x00\x3c\x00\x28\x00\x00\x09ab")


def _publish(channel: int, exchange: str, key: str, body: bytes, *, bits: int = 0) -> bytes:
    publish = commands.Basic.Publish(
        exchange=exchange, routing_key=key, mandatory=bool(bits & 1), immediate=bool(bits & 2)
    )
    return (
        frame.marshal(publish, channel)
        + frame.marshal(header.ContentHeader(0, len(body), PROPS), channel)
        + (frame.marshal(pbody.ContentBody(body), channel) if body else b"")
    )


def test_reader_hands_over_whole_publishes_and_acks() -> None:
    ack = frame.marshal(commands.Basic.Ack(delivery_tag=9, multiple=True), 2)
    data = _publish(1, "ex", "rk", b"hello", bits=1) + ack + _publish(1, "", "q", b"x")
    items = fr.FrameReader(whole_messages=True).feed(data)
    raw = properties.build(
        {k: getattr(PROPS, k) for k in ("content_type", "headers", "delivery_mode")}
        | {"correlation_id": "c1", "expiration": "1000", "app_id": "app"}
    )
    assert items == [
        (fr.FRAME_PUBLISH, 1, ("ex", "rk", 1, raw, b"hello")),
        (fr.FRAME_ACK, 2, (9, 1)),
        (fr.FRAME_PUBLISH, 1, ("", "q", 0, raw, b"x")),
    ]
    # A client's reader, and a publish still arriving: frame by frame, for the generic path.
    assert [t for t, _, _ in fr.FrameReader().feed(data)] == [1, 2, 3, 1, 1, 2, 3]
    reader = fr.FrameReader(whole_messages=True)
    assert [t for t, _, _ in reader.feed(data[:-3])] == [fr.FRAME_PUBLISH, fr.FRAME_ACK, 1, 2]
    assert reader.feed(data[-3:]) == [(3, 1, b"x")]


@pytest.mark.parametrize(
    "data",
    [
        _publish(1, "ex", "rk", b""),  # no body frame
        _publish(1, "ex", "rk", b"ab")[:-10]  # the body in two frames
        + frame.marshal(pbody.ContentBody(b"a"), 1)
        + frame.marshal(pbody.ContentBody(b"b"), 1),
        _publish(1, "ex", "rk", b"ab").replace(b"\x02\x00\x01", b"\x02\x00\x03", 1),  # channel
        _publish(0, "ex", "rk", b"ab"),  # channel 0: refused as the generic path says
    ],
)
def test_reader_leaves_unusual_publishes_frame_by_frame(data: bytes) -> None:
    items = fr.FrameReader(whole_messages=True).feed(data)
    assert items == fr.FrameReader().feed(data)


def test_reader_leaves_a_publish_with_a_bad_name_to_the_generic_path() -> None:
    data = bytearray(_publish(1, "ex", "rk", b"ab"))
    data[data.index(b"rk")] = 0xFF  # not UTF-8
    items = fr.FrameReader(whole_messages=True).feed(bytes(data))
    assert [t for t, _, _ in items] == [1, 2, 3]
    with pytest.raises(fr.SyntaxError_):
        fr.decode_publish(items[0][2])


@pytest.mark.parametrize("redelivered", [False, True])
@pytest.mark.parametrize("size", [1, 100, 4096 - 8])
def test_deliver_encoder_matches_encode_deliver(redelivered: bool, size: int) -> None:
    raw = properties.build({"content_type": "text/plain", "delivery_mode": 2})
    ctag, exrk = fr.shortstr("ctag"), fr.shortstr("ex") + fr.shortstr("rk")
    encoder = fr.DeliverEncoder(3, ctag, exrk, raw, 4096)
    assert encoder.room == size or size < encoder.room
    out: list[bytes] = []
    encoder.encode(out, 12345, redelivered, b"z" * size)
    expected = fr.encode_deliver(3, ctag, 12345, redelivered, exrk, raw, b"z" * size, 4096)
    assert b"".join(out) == expected
