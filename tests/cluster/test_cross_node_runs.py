"""Plain QoS 0 MQTT messages cross to another node a read at a time (DESIGN.md §11, §14): what
one client's read publishes for a node goes in one ``fwdr`` frame, the PUBLISH packets as the
client sent them, and the receiving node delivers them as it delivers a local publisher's run.
Two in-process brokers share one meta store; the clients are raw sockets (one write can carry
many packets), run in threads while the brokers serve."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from flowmq_broker.server import Broker
from flowmq_wire.mqtt.codec import encode
from flowmq_wire.mqtt.packets import Puback, Publish, SubscriptionOptions
from tests.fixtures.inprocess import joined_pair
from tests.fixtures.waiting import wait_until_async
from tests.integration.mqtt.conftest import RawClient

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def pair(tmp_path):
    async with joined_pair(tmp_path, ["mqtt"]) as brokers:
        yield brokers


def count_frames(broker: Broker) -> list[list[Any]]:
    """The ``fwdr`` frames ``broker`` receives from now on (each still delivered)."""
    cluster = broker.cluster
    assert cluster is not None
    frames: list[list[Any]] = []
    deliver = cluster.handlers["fwdr"]

    def counted(link: Any, frame: list[Any]) -> None:
        frames.append(frame)
        deliver(link, frame)

    cluster.handlers["fwdr"] = counted
    return frames


async def subscriber(
    broker: Broker, level: int, client_id: str, topic_filter: str, **kwargs: Any
) -> RawClient:
    def made() -> RawClient:
        client = RawClient(broker.ports["mqtt"], level)
        client.connect(client_id, properties=kwargs.pop("properties", None))
        qos = kwargs.pop("qos", 0)
        granted = client.subscribe((topic_filter, SubscriptionOptions(qos=qos)), **kwargs)
        assert granted == [qos]
        return client

    return await asyncio.to_thread(made)


async def routed(origin: Broker, topic: str, node: str) -> None:
    """Wait until ``origin`` forwards ``topic`` to ``node``."""
    cluster = origin.cluster
    assert cluster is not None
    await wait_until_async(
        lambda: node in cluster.nodes_matching("default", topic), 10, what=f"a route to {node}"
    )


async def received(client: RawClient, count: int) -> list[Any]:
    return await asyncio.to_thread(lambda: [client.recv() for _ in range(count)])


async def test_a_read_of_plain_qos0_packets_crosses_in_one_frame_and_arrives_in_order(pair):
    a, b = pair
    v4 = await subscriber(b, 4, "runs-v4", "runs/+")
    v5 = await subscriber(b, 5, "runs-v5", "runs/+")
    v5_id = await subscriber(b, 5, "runs-v5-id", "runs/+", sub_id=9)
    await routed(a, "runs/1", "b")
    publisher = await asyncio.to_thread(RawClient, a.ports["mqtt"], 4)
    await asyncio.to_thread(publisher.connect, "runs-pub")
    # The first message on each topic checks it (ACL, route plan); the rest go by its plan.
    warm = [Publish("runs/1", b"w1"), Publish("runs/2", b"w2")]
    await asyncio.to_thread(publisher.send, *warm)
    for client in (v4, v5, v5_id):
        assert [p.payload for p in await received(client, 2)] == [b"w1", b"w2"]
    frames = count_frames(b)
    # One write: runs on two topics, interleaved (the order must survive the runs).
    topics = ["runs/1"] * 5 + ["runs/2"] * 3 + ["runs/1"] * 4 + ["runs/2"] * 2 + ["runs/1"] * 6
    sent = [Publish(topic, f"m{i}".encode()) for i, topic in enumerate(topics)]
    await asyncio.to_thread(publisher.send, *sent)

    got_v4 = await received(v4, len(sent))
    assert got_v4 == sent
    got_v5 = await received(v5, len(sent))
    assert [(p.topic, p.payload) for p in got_v5] == [(p.topic, p.payload) for p in sent]
    got_id = await received(v5_id, len(sent))
    assert [(p.topic, p.payload) for p in got_id] == [(p.topic, p.payload) for p in sent]
    assert all(p.properties["subscription_identifier"] == [9] for p in got_id)
    # They crossed as runs of the packets the publisher wrote: fewer frames than runs (one
    # per read of the publisher's socket), every message in one of them, as its bytes.
    runs = [frame[4] for frame in frames]
    assert frames and len(frames) < 5, f"{len(frames)} frames for 5 runs"
    assert sum(sum(r[1::4]) for r in runs) == len(sent)
    assert b"".join(data for r in runs for data in r[3::4]) == b"".join(encode(p, 4) for p in sent)
    for client in (publisher, v4, v5, v5_id):
        client.close()


async def test_qos1_between_qos0_runs_keeps_the_publishers_order_across_nodes(pair):
    a, b = pair
    sub = await subscriber(b, 5, "mixed-sub", "mixed/t", qos=1)
    await routed(a, "mixed/t", "b")
    publisher = await asyncio.to_thread(RawClient, a.ports["mqtt"], 5)
    await asyncio.to_thread(publisher.connect, "mixed-pub")
    await asyncio.to_thread(publisher.send, Publish("mixed/t", b"warm"))
    assert (await received(sub, 1))[0].payload == b"warm"
    # One write: QoS 0 runs (one frame) around a QoS 1 message (forwarded and confirmed alone).
    sent = [Publish("mixed/t", b"q0-a"), Publish("mixed/t", b"q0-b")]
    sent += [Publish("mixed/t", b"q1-c", 1, packet_id=7), Publish("mixed/t", b"q0-d")]
    await asyncio.to_thread(publisher.send, *sent)
    got = await received(sub, 4)
    assert [p.payload for p in got] == [b"q0-a", b"q0-b", b"q1-c", b"q0-d"]
    assert [p.qos for p in got] == [0, 0, 1, 0]
    ack = await asyncio.to_thread(publisher.expect, Puback)
    assert ack.packet_id == 7 and ack.reason_code < 0x80  # confirmed by b
    sub.close()
    publisher.close()


async def test_a_forwarded_run_keeps_to_the_subscribers_maximum_packet_size(pair):
    a, b = pair
    small = await subscriber(b, 5, "max-sub", "max/t", properties={"maximum_packet_size": 64})
    await routed(a, "max/t", "b")
    publisher = await asyncio.to_thread(RawClient, a.ports["mqtt"], 5)
    await asyncio.to_thread(publisher.connect, "max-pub")
    await asyncio.to_thread(publisher.send, Publish("max/t", b"warm"))
    assert (await received(small, 1))[0].payload == b"warm"
    # One run on one topic, one packet of it over the subscriber's limit: only that one goes.
    payloads = [b"one", b"x" * 100, b"three"]
    await asyncio.to_thread(publisher.send, *(Publish("max/t", p) for p in payloads))
    assert [p.payload for p in await received(small, 2)] == [b"one", b"three"]
    await asyncio.to_thread(small.expect_nothing)
    small.close()
    publisher.close()


async def test_a_node_on_older_code_gets_each_message_in_a_frame_of_its_own(pair):
    """A node that does not say it takes runs (older code, in a rolling upgrade) would drop a
    ``fwdr`` frame as unknown: it is sent each message as a ``fwd`` frame instead."""
    a, b = pair
    sub = await subscriber(b, 4, "old-sub", "old/+")
    await routed(a, "old/1", "b")
    older = b.cluster
    assert older is not None and a.cluster is not None
    older.links.features = ()  # what b's next links say it takes
    dropped: list[Any] = []
    older.handlers["fwdr"] = lambda link, frame: dropped.append(frame)  # as older code would
    for link in list(older.links._inbound):  # a's link to b: the next one is b's new kind
        link.close()
    await wait_until_async(
        lambda: not a.cluster.links.supports("b", "fwdr"), 10, what="a's link to b gone"
    )
    publisher = await asyncio.to_thread(RawClient, a.ports["mqtt"], 4)
    await asyncio.to_thread(publisher.connect, "old-pub")
    sent = [Publish(f"old/{i % 3}", b"m%d" % i) for i in range(30)]
    await asyncio.to_thread(publisher.send, *sent)
    got = await received(sub, len(sent))
    assert [p.payload for p in got] == [p.payload for p in sent]
    assert dropped == []
    assert not a.cluster.links.supports("b", "fwdr")
    sub.close()
    publisher.close()
