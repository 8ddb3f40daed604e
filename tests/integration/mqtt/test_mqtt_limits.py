"""Identifier limits at the MQTT edge (DESIGN.md §13, ``flowmq_core.limits``): each refusal
uses the protocol's own code, is counted in ``limits_rejections_count``, fails only its own
client, and nothing over a limit reaches the meta store (where it could fail a shared flush
or the route publishing of every client)."""

from __future__ import annotations

import pytest

from flowmq_core.limits import MAX_CLIENT_ID_BYTES, MAX_TOPIC_BYTES, MAX_TOPIC_LEVELS
from flowmq_wire.mqtt.packets import Disconnect

from .conftest import scrape, subscribed


def _rejections(broker, limit: str) -> float:
    return scrape(broker.http).get(f'limits_rejections_count{{limit="{limit}"}}', 0.0)


@pytest.mark.parametrize(("level", "code"), [(5, 0x85), (4, 0x02)])
def test_client_id_over_the_limit_is_refused(broker, raw, uid, still_serves, level, code):
    before = _rejections(broker, "client_id_bytes")
    at_limit = f"{uid}-".ljust(MAX_CLIENT_ID_BYTES, "a")
    raw(level).connect(at_limit, clean_start=False, properties={"session_expiry_interval": 60})
    c = raw(level)
    ack = c.connect(at_limit + "a", clean_start=False, expect_success=False)
    assert ack.reason_code == code
    assert c.wait_closed() == []
    assert _rejections(broker, "client_id_bytes") == before + 1
    still_serves()


def test_a_persistent_session_with_a_long_client_id_cannot_stop_durable_writes(
    broker, raw, paho, uid, still_serves
):
    """The issue's reproduction: an offline session whose id passes the key budget used to
    fail every QoS 1 publish matching its subscription.  Now it never exists."""
    c = raw(5)
    c.connect("x" * 20_000, clean_start=False, expect_success=False)
    away = raw(5)
    away.connect(f"away-{uid}", clean_start=False, properties={"session_expiry_interval": 300})
    away.subscribe(f"durable/{uid}")
    away.disconnect()
    publisher = subscribed(paho, f"pub-{uid}", f"durable/{uid}", 1, v5=True)
    for i in range(3):
        publisher.publish(f"durable/{uid}", f"m{i}".encode(), 1)
    assert [m.payload for m in publisher.expect(3)] == [b"m0", b"m1", b"m2"]
    back = raw(5)
    assert back.connect(f"away-{uid}", clean_start=False).session_present
    still_serves()


@pytest.mark.parametrize(
    ("topic", "limit"),
    [
        ("t/" + "x" * (MAX_TOPIC_BYTES - 1), "topic_bytes"),
        ("/".join(["l"] * (MAX_TOPIC_LEVELS + 1)), "topic_levels"),
    ],
)
@pytest.mark.parametrize("level", [5, 4])
def test_publish_topic_over_the_limit_ends_the_connection(
    broker, raw, uid, still_serves, topic, limit, level
):
    before = _rejections(broker, limit)
    c = raw(level)
    c.connect(f"long-pub-{uid}")
    c.publish(topic, b"p", 0)
    got = c.wait_closed()
    if level == 5:
        assert [type(p) for p in got] == [Disconnect] and got[0].reason_code == 0x90, got
    else:
        assert got == []
    assert _rejections(broker, limit) == before + 1
    still_serves()


def test_publish_topic_at_the_limits_is_delivered(raw, paho, uid):
    topic = f"{uid}/" + "/".join(["l"] * (MAX_TOPIC_LEVELS - 1))
    long_topic = f"{uid}-".ljust(MAX_TOPIC_BYTES, "x")
    sub = subscribed(paho, f"sub-{uid}", "#", 1, v5=True)
    c = raw(5)
    c.connect(f"pub-{uid}")
    c.publish(topic, b"levels", 1)
    c.publish(long_topic, b"bytes", 1)
    got = {m.topic: m.payload for m in sub.expect(2)}
    assert got == {topic: b"levels", long_topic: b"bytes"}


@pytest.mark.parametrize(
    "topic_filter",
    [
        "f/" + "x" * MAX_TOPIC_BYTES,
        "/".join(["+"] * (MAX_TOPIC_LEVELS + 1)),
        "$share/" + "g" * 256 + "/f",
    ],
)
@pytest.mark.parametrize(("level", "code"), [(5, 0x8F), (4, 0x80)])
def test_subscription_over_the_limit_is_refused_and_others_still_subscribe(
    broker, raw, uid, still_serves, topic_filter, level, code
):
    """A refused filter never becomes a route, so route publishing keeps working for the
    SUBSCRIBE that follows (it used to fail every second, cluster-wide)."""
    c = raw(level)
    c.connect(f"long-sub-{uid}")
    assert c.subscribe(topic_filter, f"ok/{uid}") == [code, 0]
    still_serves()
