"""Metadata changes reach every broker: by gossip at once, by anti-entropy when gossip fails."""

from __future__ import annotations

import asyncio
import time

import pytest

import flowmq_metrics as metrics
from flowmq_broker.routing import Binding
from flowmq_broker.server import IGNORE_EVENTS_ENV, Broker
from flowmq_meta.catalog import Destination
from tests.fixtures.cluster import BrokerCluster, http, metric, wait_for
from tests.fixtures.inprocess import joined_pair


@pytest.fixture
async def pair(tmp_path):
    async with joined_pair(tmp_path, ["admin"], "t") as brokers:
        yield brokers


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
    # The router has it before the pass that loaded it is counted (the pass still runs the
    # catalog's change callbacks): wait for the count with a deadline.
    deadline = time.monotonic() + 3.0
    while metrics.anti_entropy_missing_events_detected_count.value() < missed_before + 1:
        assert time.monotonic() < deadline, "the repair was not counted as a missed event"
        await asyncio.sleep(0.01)
    assert metrics.anti_entropy_syncs_completed_count.value() > syncs_before


def test_a_broker_process_that_misses_gossip_events_catches_up_by_anti_entropy(tmp_path):
    """Three processes; "deaf" ignores every gossip event (a test-only fault): a stream
    created through another broker still routes there within anti-entropy's second, and the
    broker counts what it missed."""
    cluster = BrokerCluster(tmp_path, "t", ("a", "b", "deaf"))
    try:
        cluster.start("a")
        cluster.start("b")
        cluster.start("deaf", env={IGNORE_EVENTS_ENV: "1"})
        cluster.wait_size(3, cluster.names, timeout=15)
        deaf = cluster["deaf"]
        missed_before = metric(deaf.http, "anti_entropy_missing_events_detected_count")
        created = http(
            "POST",
            f"{cluster['b'].http}/api/v1/streams",
            {"name": "heard-late", "topic_filters": ["late/#"]},
            token="t",
        )
        assert created["success"] is True, created

        def routes_it(broker) -> bool:
            found = http("GET", f"{broker.http}/api/v1/routes?topic=late/x", token="t")
            return any(d["name"] == "heard-late" for d in found["data"]["destinations"])

        started = time.monotonic()
        wait_for(lambda: routes_it(deaf), 3.0, "the deaf broker routes the new stream")
        assert time.monotonic() - started < 2.0  # anti-entropy runs every second
        wait_for(  # counted once the catalog reload's callbacks are done
            lambda: metric(deaf.http, "anti_entropy_missing_events_detected_count") > missed_before,
            2.0,
            "the deaf broker counts the missed change",
        )
        assert metric(cluster["a"].http, "gossip_event_propagation_hops_count") >= 1
    finally:
        cluster.stop_all()
