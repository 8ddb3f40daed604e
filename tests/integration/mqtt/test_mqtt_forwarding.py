"""How a plain QoS 0 PUBLISH (no retain, no properties) travels (flowmq_broker.mqtt.delivery):
by its topic's route plan, as the very bytes it came in to subscribers of the publisher's
protocol level, encoded once for the other level; a subscriber that needs a PUBLISH of its
own (v5 subscription identifier) gets one.  The plan follows every subscription change."""

from __future__ import annotations

from flowmq_wire.mqtt.codec import encode
from flowmq_wire.mqtt.packets import Publish, SubscriptionOptions, Unsuback, Unsubscribe

from .conftest import RawClient, http, wait_until


def _subscriber(port: int, level: int, client_id: str, topic: str, **kwargs) -> RawClient:
    c = RawClient(port, level)
    c.connect(client_id)
    assert c.subscribe(topic, **kwargs) == [0]
    return c


def test_plain_qos0_reaches_each_protocol_level_as_it_should(broker, uid):
    port = broker.ports["mqtt"]
    topic = f"fwd/{uid}"
    v4 = _subscriber(port, 4, f"v4-{uid}", topic)
    v5 = _subscriber(port, 5, f"v5-{uid}", topic)
    v5_id = _subscriber(port, 5, f"v5id-{uid}", topic, sub_id=7)
    pub = RawClient(port, 4)
    pub.connect(f"pub-{uid}")
    sent = Publish(topic, b"payload")
    for _ in range(3):  # the first checks the topic; the next go by the remembered plan
        pub.send(sent)
        assert v4.recv() == sent
        assert v5.recv() == sent
        got = v5_id.recv()
        assert (got.topic, got.payload) == (topic, b"payload")
        assert got.properties["subscription_identifier"] == [7]
    # What the v3.1.1 subscriber read is byte for byte what the publisher wrote.
    pub.send(sent)
    v4.sock.settimeout(5)
    assert v4.sock.recv(1024) == encode(sent, 4)
    for c in (pub, v4, v5, v5_id):
        c.close()


def test_the_route_plan_follows_subscription_changes(broker, uid):
    port = broker.ports["mqtt"]
    topic = f"plan/{uid}"
    pub = RawClient(port, 5)
    pub.connect(f"pub-{uid}")
    pub.publish(topic, b"nobody")  # planned: no subscriber
    sub = RawClient(port, 5)
    sub.connect(f"sub-{uid}")
    assert sub.subscribe(topic) == [0]
    pub.publish(topic, b"one")
    assert sub.recv().payload == b"one"
    # A second filter of the same client matching too: still one delivery.
    assert sub.subscribe("plan/+") == [0]
    pub.publish(topic, b"two")
    assert sub.recv().payload == b"two"
    sub.expect_nothing()
    # The publisher subscribes with No Local: its own messages are not sent back to it.
    assert pub.subscribe((topic, SubscriptionOptions(no_local=True))) == [0]
    pub.publish(topic, b"three")
    assert sub.recv().payload == b"three"
    pub.expect_nothing()
    sub.send(Unsubscribe(2001, [topic, "plan/+"]))
    assert sub.expect(Unsuback).reason_codes == [0, 0]
    pub.publish(topic, b"gone")
    sub.expect_nothing()
    pub.close()
    sub.close()


def test_a_stream_made_later_gets_the_next_plain_qos0_messages(broker, uid):
    """A topic planned for subscribers only is planned again once a Stream binds it."""
    port = broker.ports["mqtt"]
    topic = f"later/{uid}"
    sub = _subscriber(port, 4, f"sub-{uid}", topic)
    pub = RawClient(port, 4)
    pub.connect(f"pub-{uid}")
    for payload in (b"before", b"before again"):
        pub.publish(topic, payload)
        assert sub.recv().payload == payload
    stream = f"later-{uid}"
    status, body = http(
        broker.http,
        "POST",
        "/api/v1/streams",
        broker.token,
        {"name": stream, "topic_filters": [topic]},
    )
    assert status == 201, body
    pub.publish(topic, b"after")
    assert sub.recv().payload == b"after"

    def stored() -> list[str]:
        status, body = http(broker.http, "GET", f"/api/v1/streams/{stream}/messages", broker.token)
        assert status == 200, body
        return [r["value"] for r in body["data"]["records"]]

    assert wait_until(stored) == ["after"]
    pub.close()
    sub.close()
