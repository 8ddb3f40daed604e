"""Frames sent ``by_reference`` (a forwarded read's runs of messages, ``fwdr``): their long
byte strings go to the socket as they are, beside the frame's other bytes, and the peer reads
the same msgpack value a copying send gives (``flowmq_cluster.link.encode_parts``).  Real TCP
on 127.0.0.1."""

from __future__ import annotations

import asyncio
from typing import Any

import msgpack
import pytest

from flowmq_cluster import link
from flowmq_cluster.link import Links, encode_parts

LONG = link.BY_REFERENCE_BYTES


def _frame(size: int) -> list[Any]:
    """A ``fwdr``-shaped frame with two runs of ``size`` and ``size // 2`` bytes."""
    return [
        "fwdr",
        "default",
        "client-1",
        4,
        ["a/b", 3, size, b"x" * size, "a/c", 1, 7, b"y" * (size // 2)],
    ]


@pytest.mark.parametrize(
    "size", [0, 100, LONG - 1, LONG, 2 * LONG - 1, 0xFFFF, 0x10000, 300_000]
)  # bin 8/16/32, either side of the by-reference bound
def test_the_parts_joined_are_the_frame_packed(size):
    packer = msgpack.Packer(use_bin_type=True)
    frame = _frame(size)
    parts = encode_parts(packer, frame)
    assert b"".join(parts) == msgpack.packb(frame, use_bin_type=True)
    long_values = [value for value in frame[4] if isinstance(value, bytes) and len(value) >= LONG]
    assert [part for part in parts if any(part is v for v in long_values)] == long_values


def test_nested_lists_and_other_values_pack_as_before():
    packer = msgpack.Packer(use_bin_type=True)
    frame = ["k", [1, [b"z" * LONG, "s", None, True, 2.5, -3, 2**40]], {"m": 1}, b"short"]
    assert b"".join(encode_parts(packer, frame)) == msgpack.packb(frame, use_bin_type=True)


async def test_frames_by_reference_arrive_whole_and_in_order_among_copied_ones():
    got: list[Any] = []
    connected = asyncio.Event()
    arrived = asyncio.Event()
    frames = [_frame(300_000), ["small", 1], _frame(LONG), _frame(10), ["last"]]

    def receive(link_: link.Link, frame: Any) -> None:
        got.append(frame)
        connected.set()
        if len(got) == len(frames) + 1:
            arrived.set()

    receiver = Links("b", receive)
    sender = Links("a", lambda link_, frame: None)
    try:
        port = await receiver.start()
        sender.set_peer("b", ("127.0.0.1", port))
        assert sender.send("b", ["first"])  # queued until the link is up, then sent
        await asyncio.wait_for(connected.wait(), 10)
        for frame in frames:  # on the link that is up: written as encode_parts has them
            assert sender.send("b", frame, by_reference=frame[0] == "fwdr")
        await asyncio.wait_for(arrived.wait(), 10)
        assert got == [["first"], *frames]
    finally:
        await sender.stop()
        await receiver.stop()
