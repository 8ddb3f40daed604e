"""Subscriptions per session (``mqtt_max_subscriptions``, DESIGN.md §13): a SUBSCRIBE past
the limit gets SUBACK 0x97 Quota exceeded (v5) / 0x80 (3.1.1) for each new filter past it,
the filters before it and re-subscriptions are granted, each refusal is counted, and other
sessions are not affected."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from flowmq_wire.mqtt.packets import Publish, SubscriptionOptions, Unsuback, Unsubscribe
from tests.fixtures.broker_process import BrokerProcess

from .conftest import RawClient, broker_with, rejections, roundtrip

LIMIT = 3


@pytest.fixture(scope="module")
def few_subscriptions_broker(tmp_path_factory) -> Iterator[BrokerProcess]:
    data_dir = tmp_path_factory.mktemp("subscriptions") / "data"
    yield from broker_with(data_dir, "--mqtt-max-subscriptions", str(LIMIT))


@pytest.mark.parametrize(("level", "code"), [(5, 0x97), (4, 0x80)])
def test_subscriptions_past_the_limit_are_refused(few_subscriptions_broker, uid, level, code):
    broker = few_subscriptions_broker
    port = broker.ports["mqtt"]
    bystander = RawClient(port, 5)
    bystander.connect(f"bystander-{uid}")
    assert bystander.subscribe(*(f"b{i}/{uid}" for i in range(LIMIT))) == [0] * LIMIT
    before = rejections(broker, "subscriptions")
    c = RawClient(port, level)
    c.connect(f"many-{uid}")
    assert c.subscribe(f"a/{uid}", f"b/{uid}") == [0, 0]
    qos1 = SubscriptionOptions(qos=1)
    # One more fits; then only re-subscribing an existing filter is granted.
    got = c.subscribe(f"c/{uid}", f"d/{uid}", (f"a/{uid}", qos1), f"e/{uid}")
    assert got == [0, code, 1, code]
    assert rejections(broker, "subscriptions") == before + 2
    # What was granted is delivered; what was refused is not.
    for topic in (f"a/{uid}", f"d/{uid}"):
        bystander.publish(topic, topic.encode(), 1)
    assert c.expect(Publish).topic == f"a/{uid}"
    c.expect_nothing()
    # Unsubscribing frees a place.
    c.send(Unsubscribe(c.packet_id(), [f"b/{uid}"]))
    c.expect(Unsuback)
    assert c.subscribe(f"d/{uid}") == [0]
    # Another session is not affected, and the bystander is still served.
    bystander.publish(f"b0/{uid}", b"to myself", 0)
    assert bystander.expect(Publish).payload == b"to myself"
    roundtrip(port)
    c.close()
    bystander.close()
