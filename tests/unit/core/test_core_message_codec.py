"""The one serialised message form: every field round-trips, bad bytes are reported."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flowmq_core.message import Message
from flowmq_core.message_codec import CorruptMessage, decode_message, encode_message


def test_every_field_round_trips() -> None:
    m = Message(
        "a/b",
        b"\x00payload\xff",
        qos=2,
        retain=True,
        headers=[("k", b"v"), ("k", b"w")],
        timestamp_ms=123,
        key=b"key",
        content_type="text/plain",
        expiry_ms=456,
        source_protocol="amqp",
        properties={
            "raw": b"\x01",
            "s": "x",
            "i": -5,
            "t": True,
            "f": False,
            "n": None,
            "x": 1.5,
            "ids": [3, 7],
            "map": {"a": 1},
        },
    )
    assert decode_message(encode_message(m)) == m


def test_bytes_and_text_stay_apart() -> None:
    m = decode_message(encode_message(Message("t", b"p", properties={"b": b"x", "s": "x"})))
    assert m.properties == {"b": b"x", "s": "x"}
    assert type(m.payload) is bytes and type(m.properties["s"]) is str


def test_a_property_without_a_serialised_type_arrives_as_text() -> None:
    m = decode_message(encode_message(Message("t", b"", properties={"odd": object})))
    assert m.properties == {"odd": str(object)}


def test_decodes_from_a_slice_of_a_larger_buffer() -> None:
    data = b"head" + encode_message(Message("t", b"body", timestamp_ms=1)) + b"tail"
    view = memoryview(data)[4:-4]
    assert decode_message(view) == Message("t", b"body", timestamp_ms=1)


@pytest.mark.parametrize(
    "data",
    [b"", b"\x09garbage", b"\x93\x01\x02\x03", encode_message(Message("t", b"x"))[:-1]],
    ids=["empty", "trailing bytes", "wrong shape", "truncated"],
)
def test_bytes_that_are_not_a_message_are_reported(data: bytes) -> None:
    with pytest.raises(CorruptMessage):
        decode_message(data)


@given(
    topic=st.text(min_size=1, max_size=20),
    payload=st.binary(max_size=200),
    headers=st.lists(st.tuples(st.text(max_size=5), st.binary(max_size=5)), max_size=4),
    expiry=st.none() | st.integers(min_value=0, max_value=2**62),
)
def test_round_trip_property(topic: str, payload: bytes, headers: list, expiry: int | None) -> None:
    m = Message(topic, payload, headers=headers, timestamp_ms=1, expiry_ms=expiry)
    assert decode_message(encode_message(m)) == m
