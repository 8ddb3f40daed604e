"""The stored forms: message bodies and index entry runs round-trip exactly."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flowmq_core.message import Message
from flowmq_queue.codec import CorruptBody, decode_message, encode_message
from flowmq_queue.entries import Run, decode_run, lease_of
from flowmq_queue.index import _fair_shares


def test_message_round_trip_keeps_every_field() -> None:
    m = Message(
        "a/b",
        b"\x00payload\xff",
        qos=1,
        retain=True,
        headers=[("k", b"v"), ("k", b"w")],
        timestamp_ms=123,
        key=b"key",
        content_type="text/plain",
        expiry_ms=456,
        source_protocol="amqp",
        properties={"raw": b"\x01", "s": "x", "i": -5, "t": True, "f": False, "n": None, "x": 1.5},
    )
    assert decode_message(encode_message(m)) == m


@given(
    topic=st.text(min_size=1, max_size=20),
    payload=st.binary(max_size=200),
    headers=st.lists(st.tuples(st.text(max_size=5), st.binary(max_size=5)), max_size=4),
)
def test_message_round_trip_property(topic: str, payload: bytes, headers: list) -> None:
    m = Message(topic, payload, headers=headers, timestamp_ms=1)
    assert decode_message(encode_message(m)) == m


def test_corrupt_body_is_reported() -> None:
    with pytest.raises(CorruptBody):
        decode_message(b"\x09garbage")


def test_run_round_trip_and_lease_fields() -> None:
    run = Run("obj/1", [5, 6, 9], [0, 10, 30], [10, 20, 5], [0, 2, 1], [0, 99, 0])
    assert decode_run(run.encode()) == run
    leased = run.slice(1).leased("node-a", "ctag#1", "42", 1000)
    back = decode_run(leased.encode())
    assert back.seqs == [6, 9] and back.holder == "node-a" and back.deadline_ms == 1000
    assert lease_of(leased.encode()) == ("node-a", "42")


@pytest.mark.parametrize(
    ("demands", "supply", "expected"),
    [
        ([10, 10, 10], 3, [1, 1, 1]),
        ([10, 10, 10], 30, [10, 10, 10]),
        ([1, 10], 8, [1, 7]),
        ([5], 2, [2]),
        ([256, 256, 256], 100, [34, 33, 33]),
    ],
)
def test_fair_shares(demands: list[int], supply: int, expected: list[int]) -> None:
    assert _fair_shares(demands, supply) == expected
