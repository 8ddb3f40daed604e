"""Metadata changes reach every broker: by gossip at once, by anti-entropy when gossip fails."""

from __future__ import annotations

import asyncio
import time

import pytest

import flowmq_metrics as metrics
from flowmq_broker.routing import Binding
from flowmq_broker.server import Broker
from flowmq_core.config import BrokerConfig
from flowmq_meta.catalog import Destination


def config(tmp_path, name: str, shared, seeds=()) -> BrokerConfig:
    return BrokerConfig(
        data_dir=str(tmp_path / name),
        node_id=name,
        meta=f"sqlite:///{shared / 'meta.db'}",
        objects=(shared / "objects").as_uri(),
        http_port=0,
        mqtt_port=0,
        kafka_port=0,
        amqp_port=0,
        gossip_port=0,
        seeds=list(seeds),
        roles=["admin"],
        admin_token="t",
    )


@pytest.fixture
async def pair(tmp_path):
    shared = tmp_path / "shared"
    a = Broker(config(tmp_path, "a", shared))
    await a.start()
    b = Broker(config(tmp_path, "b", shared, [f"127.0.0.1:{a.ports['gossip']}"]))
    await b.start()
    deadline = time.monotonic() + 10
    while len(a.gossip.members()) < 2 or len(b.gossip.members()) < 2:
        assert time.monotonic() < deadline, "brokers did not join"
        await asyncio.sleep(0.05)
    yield a, b
    await b.stop()
    await a.stop()


async def create_stream_on(broker: Broker, name: str) -> None:
    await broker.catalog.create_destination(Destination("stream", "default", name, [f"{name}/#"]))
    await broker.metadata_changed()


async def routed_within(broker: Broker, name: str, seconds: float) -> float:
    started = time.monotonic()
    while broker.router.destination(Binding("stream", "default", name)) is None:
        assert time.monotonic() - started < seconds, f"{name} not routed within {seconds} s"
        await asyncio.sleep(0.01)
    return time.monotonic() - started


async def test_a_change_on_one_broker_reaches_the_other_by_gossip(pair):
    a, b = pair
    await a.sync._poll.stop()  # no anti-entropy on a: only gossip can tell it
    hops_before = metrics.gossip_event_propagation_hops_count.value()
    originated_before = metrics.gossip_events_originated_count.value()
    await create_stream_on(b, "from-b")
    assert await routed_within(a, "from-b", 1.0) < 1.0
    assert metrics.gossip_events_originated_count.value() == originated_before + 1
    assert metrics.gossip_event_propagation_hops_count.value() >= hops_before + 1


async def test_anti_entropy_repairs_what_gossip_lost(pair):
    a, b = pair
    a.gossip.drop = lambda addr, kind: True  # a hears nothing any more
    b.gossip.drop = lambda addr, kind: True
    missed_before = metrics.anti_entropy_missing_events_detected_count.value()
    syncs_before = metrics.anti_entropy_syncs_completed_count.value()
    await create_stream_on(b, "while-deaf")
    await routed_within(a, "while-deaf", 3.0)
    assert metrics.anti_entropy_missing_events_detected_count.value() >= missed_before + 1
    assert metrics.anti_entropy_syncs_completed_count.value() > syncs_before
