"""An ACL change made through one broker decides on the other within a second: by gossip at
once, by anti-entropy when gossip is lost.  Two in-process brokers share one meta store; the
rule is made through broker a's admin API and a real MQTT client on broker b is refused."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from flowmq_broker.server import Broker
from tests.fixtures.inprocess import joined_pair
from tests.integration.mqtt.conftest import Paho

TOKEN = "t"


@pytest.fixture
async def pair(tmp_path):
    async with joined_pair(tmp_path, ["mqtt", "admin"], TOKEN) as brokers:
        yield brokers


async def add_rule_through(broker: Broker, **rule: str) -> None:
    url = f"http://127.0.0.1:{broker.ports['http']}/api/v1/acls"
    body = {"namespace": "default", **rule}
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, json=body, headers={"Authorization": f"Bearer {TOKEN}"}) as r,
    ):
        assert r.status == 201, await r.text()


async def flipped_within(broker: Broker, topic: str, seconds: float) -> float:
    """Seconds until anonymous clients of ``broker`` may no longer publish to ``topic``."""
    access = broker.authorizer.access("default", None)
    started = time.monotonic()
    while access.may_publish(topic):
        assert time.monotonic() - started < seconds, f"not denied within {seconds} s"
        await asyncio.sleep(0.005)
    return time.monotonic() - started


def publish_code(port: int, topic: str) -> int:
    client = Paho(port, f"pub-{topic.replace('/', '-')}")
    try:
        client.connect()
        return client.publish(topic, b"x", 1)
    finally:
        client.close()


async def test_a_rule_made_on_one_broker_decides_on_the_other_by_gossip(pair):
    a, b = pair
    await b.sync._poll.stop()  # no anti-entropy on b: only gossip can tell it
    port = b.ports["mqtt"]
    assert await asyncio.to_thread(publish_code, port, "g/x") < 0x80  # allowed before
    await add_rule_through(a, principal="*", resource="g/#", action="publish", effect="deny")
    assert await flipped_within(b, "g/x", 1.0) < 1.0
    assert await asyncio.to_thread(publish_code, port, "g/x") == 0x87


async def test_anti_entropy_applies_a_rule_gossip_lost(pair):
    a, b = pair
    a.gossip.drop = lambda addr, kind: True  # nobody hears anything any more
    b.gossip.drop = lambda addr, kind: True
    port = b.ports["mqtt"]
    assert await asyncio.to_thread(publish_code, port, "ae/x") < 0x80
    await add_rule_through(a, principal="*", resource="ae/#", action="publish", effect="deny")
    # Anti-entropy reads the metadata version every second.
    assert await flipped_within(b, "ae/x", 2.0) < 1.5
    assert await asyncio.to_thread(publish_code, port, "ae/x") == 0x87
