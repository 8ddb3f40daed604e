"""What a broker queues for a peer it is not connected to yet is bounded by the messages it
holds, not by frames: a frame carrying a read's runs of messages (``fwdr``) weighs what it
carries (``flowmq_cluster.link.Links.send``).  Real TCP on 127.0.0.1."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

from flowmq_cluster import link
from flowmq_cluster.link import Links


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def test_an_unconnected_peers_backlog_counts_messages_and_arrives_when_it_comes_up():
    port = free_port()  # nobody listens there yet: the frames wait in the backlog
    sender = Links("a", lambda link_, frame: None)
    got: list[Any] = []
    arrived = asyncio.Event()

    def receive(link_: link.Link, frame: Any) -> None:
        got.append(frame)
        if len(got) == 2:
            arrived.set()

    receiver = Links("b", receive)
    sender.set_peer("b", ("127.0.0.1", port))
    try:
        assert sender.send("b", ["runs", "almost full"], link.MAX_PENDING_FRAMES - 1)
        assert sender.send("b", ["one"])
        assert not sender.send("b", ["two more"], 2)  # over the bound: dropped
        assert not sender.send("b", ["one more"])
        await receiver.start(port)
        await asyncio.wait_for(arrived.wait(), 10)
        assert got == [["runs", "almost full"], ["one"]]
        # Connected: the backlog is empty again, and weight no longer matters.
        assert sender.send("b", ["heavy"], link.MAX_PENDING_FRAMES * 2)
    finally:
        await sender.stop()
        await receiver.stop()
