"""Retained messages: storage, delivery on subscribe, clearing, retain handling and
retain as published, survival across a broker restart."""

from __future__ import annotations

import json

import pytest

from flowmq_broker.mqtt.retained import decode_retained, encode_retained
from flowmq_core.limits import MAX_TOPIC_BYTES
from flowmq_core.message import Message
from flowmq_core.message_codec import CorruptMessage
from flowmq_wire.mqtt.packets import Puback, Publish, SubscriptionOptions
from tests.fixtures.broker_process import start_broker

from .conftest import ROLES, Paho, RawClient, connected, subscribed


@pytest.mark.parametrize("v5", [False, True], ids=["v311", "v5"])
def test_retained_message_delivered_on_subscribe_with_retain_flag(paho, uid, v5):
    topic = f"ret/{uid}/a"
    pub = connected(paho, f"pub-{uid}", v5=v5)
    pub.publish(topic, b"kept", 1, retain=True)

    sub = subscribed(paho, f"sub-{uid}", f"ret/{uid}/#", 1, v5=v5)
    m = sub.get()
    assert (m.topic, m.payload, m.retain, m.qos) == (topic, b"kept", True, 1)
    sub.expect_none()


@pytest.mark.parametrize("v5", [False, True], ids=["v311", "v5"])
def test_live_delivery_of_retained_publish_clears_retain_flag(paho, uid, v5):
    """To an existing subscription a retained PUBLISH goes out with RETAIN 0 (3.1.1 §3.3.1.3;
    in v5 unless Retain As Published is set)."""
    topic = f"retlive/{uid}"
    sub = subscribed(paho, f"sub-{uid}", topic, 1, v5=v5)
    pub = connected(paho, f"pub-{uid}", v5=v5)
    pub.publish(topic, b"now", 1, retain=True)
    m = sub.get()
    assert (m.payload, m.retain) == (b"now", False)


def test_retained_qos_is_min_of_stored_and_granted(paho, uid):
    pub = connected(paho, f"pub-{uid}")
    pub.publish(f"retq/{uid}/two", b"2", 2, retain=True)
    pub.publish(f"retq/{uid}/zero", b"0", 0, retain=True)
    sub = subscribed(paho, f"sub-{uid}", f"retq/{uid}/+", 1)
    got = {m.payload: (m.qos, m.retain) for m in sub.expect(2)}
    assert got == {b"2": (1, True), b"0": (0, True)}


def test_new_retained_message_replaces_the_old(paho, uid):
    topic = f"retrepl/{uid}"
    pub = connected(paho, f"pub-{uid}")
    pub.publish(topic, b"old", 1, retain=True)
    pub.publish(topic, b"new", 1, retain=True)
    sub = subscribed(paho, f"sub-{uid}", topic, 1)
    assert sub.get().payload == b"new"
    sub.expect_none()


@pytest.mark.parametrize("v5", [False, True], ids=["v311", "v5"])
def test_empty_retained_payload_clears_the_topic(paho, uid, v5):
    topic = f"retclear/{uid}"
    pub = connected(paho, f"pub-{uid}", v5=v5)
    pub.publish(topic, b"to be cleared", 1, retain=True)
    live = subscribed(paho, f"live-{uid}", topic, 1, v5=v5)
    assert live.get().payload == b"to be cleared"
    pub.publish(topic, b"", 1, retain=True)
    # The empty retained PUBLISH is still delivered to current subscribers…
    assert live.get().payload == b""
    # …and nothing is retained any more.
    late = subscribed(paho, f"late-{uid}", topic, 1, v5=v5)
    late.expect_none()


def test_retain_handling_0_1_2(paho, uid):
    topic = f"rh/{uid}"
    pub = connected(paho, f"pub-{uid}")
    pub.publish(topic, b"r", 1, retain=True)
    sub = connected(paho, f"sub-{uid}", v5=True)

    # 0: send at every subscribe, also a repeated one.
    sub.subscribe(topic, 1, retain_handling=0)
    assert sub.get().payload == b"r"
    sub.subscribe(topic, 1, retain_handling=0)
    assert sub.get().payload == b"r"
    sub.unsubscribe(topic)

    # 1: only if the subscription did not exist.
    sub.subscribe(topic, 1, retain_handling=1)
    assert sub.get().payload == b"r"
    sub.subscribe(topic, 1, retain_handling=1)
    sub.expect_none()
    sub.unsubscribe(topic)

    # 2: never at subscribe time.
    sub.subscribe(topic, 1, retain_handling=2)
    sub.expect_none()
    # …but live messages still flow.
    pub.publish(topic, b"live", 1)
    assert sub.get().payload == b"live"


@pytest.mark.parametrize("rap", [False, True])
def test_retain_as_published(paho, uid, rap):
    topic = f"rap/{uid}"
    sub = connected(paho, f"sub-{uid}", v5=True)
    sub.subscribe(topic, 1, retain_as_published=rap)
    pub = connected(paho, f"pub-{uid}")
    pub.publish(topic, b"retained", 1, retain=True)
    pub.publish(topic, b"plain", 1, retain=False)
    got = {m.payload: m.retain for m in sub.expect(2)}
    assert got == {b"retained": rap, b"plain": False}


def test_retained_not_sent_to_shared_subscription(paho, uid):
    """MQTT 5 §4.8.2: retained messages are not sent when a shared subscription is made."""
    topic = f"retshared/{uid}"
    pub = connected(paho, f"pub-{uid}")
    pub.publish(topic, b"r", 1, retain=True)
    sub = subscribed(paho, f"sub-{uid}", f"$share/g/{topic}", 1, v5=True)
    sub.expect_none()


def test_retained_messages_are_not_matched_across_dollar_topics(paho, uid):
    pub = connected(paho, f"pub-{uid}")
    pub.publish(f"$ret{uid}/x", b"dollar", 1, retain=True)
    pub.publish(f"plain{uid}/x", b"plain", 1, retain=True)
    sub = subscribed(paho, f"sub-{uid}", "+/x", 1)
    got = [m.payload for m in sub.drain()]
    assert b"dollar" not in got and b"plain" in got


def test_retained_properties_are_kept(paho, uid):
    topic = f"retprops/{uid}"
    pub = connected(paho, f"pub-{uid}", v5=True)
    pub.publish(
        topic,
        b"{}",
        1,
        retain=True,
        properties={
            "ContentType": "application/json",
            "PayloadFormatIndicator": 1,
            "ResponseTopic": "reply/to",
            "CorrelationData": b"\x00\x01",
            "UserProperty": [("a", "1"), ("a", "2")],
        },
    )
    sub = subscribed(paho, f"sub-{uid}", topic, 1, v5=True)
    m = sub.get()
    p = m.properties
    assert m.retain
    assert p.ContentType == "application/json"
    assert p.PayloadFormatIndicator == 1
    assert p.ResponseTopic == "reply/to"
    assert p.CorrelationData == b"\x00\x01"
    assert p.UserProperty == [("a", "1"), ("a", "2")]


def test_retained_survive_a_broker_restart(tmp_path, uid):
    data = tmp_path / "data"
    small, large = b"small retained", bytes(range(256)) * 400  # 100 kB: the object-store path
    proc = start_broker(data, *ROLES)
    try:
        pub = Paho(proc.ports["mqtt"], f"pub-{uid}")
        pub.connect()
        pub.publish("keep/small", small, 1, retain=True)
        pub.publish("keep/large", large, 2, retain=True)
        pub.publish("keep/cleared", b"gone", 1, retain=True)
        pub.publish("keep/cleared", b"", 1, retain=True)
        pub.close()
    finally:
        proc.stop()

    proc = start_broker(data, *ROLES)
    try:
        sub = Paho(proc.ports["mqtt"], f"sub-{uid}")
        sub.connect()
        sub.subscribe("keep/#", 2)
        got = {m.topic: (m.payload, m.qos, m.retain) for m in sub.expect(2)}
        assert got == {"keep/small": (small, 1, True), "keep/large": (large, 2, True)}
        sub.expect_none()
        sub.close()
        assert "Traceback" not in "".join(proc.output)
    finally:
        proc.stop()


def test_raw_retained_delivery_sets_retain_bit(broker, raw, uid):
    topic = f"rawret/{uid}"
    pub = raw(4)
    pub.connect(f"pub-{uid}")
    pub.publish(topic, b"r", 1, retain=True)
    sub = RawClient(broker.ports["mqtt"], 4)
    try:
        sub.connect(f"sub-{uid}")
        sub.subscribe((topic, SubscriptionOptions(0)))
        p = sub.expect(Publish)
        assert (p.payload, p.retain, p.qos) == (b"r", True, 0)
    finally:
        sub.close()


def test_retained_message_on_the_longest_topic_survives_restart(fresh_broker, tmp_path):
    """A retained message on a topic at the length limit is kept like any other."""
    topic = "long/".ljust(MAX_TOPIC_BYTES, "x")
    publisher = RawClient(fresh_broker.ports["mqtt"], 5)
    publisher.connect("long-pub")
    publisher.send(Publish(topic, b"kept", qos=1, retain=True, packet_id=1))
    assert publisher.expect(Puback).reason_code in (0x00, 0x10)
    publisher.close()
    data_dir = fresh_broker.data_dir
    fresh_broker.stop()
    restarted = start_broker(data_dir, *ROLES)
    try:
        subscriber = RawClient(restarted.ports["mqtt"], 5)
        subscriber.connect("long-sub")
        subscriber.subscribe("long/#")
        message = subscriber.expect(Publish)
        assert (message.topic, message.payload, message.retain) == (topic, b"kept", True)
        subscriber.close()
    finally:
        restarted.stop()


def test_stored_form_inline_and_in_an_object() -> None:
    message = Message("t/1", b"data", 1, False, properties={"origin": "c1", "response_topic": "r"})
    kept = Message("t/1", b"data", 1, True, timestamp_ms=message.timestamp_ms)
    kept.properties = {"response_topic": "r"}  # the publisher's origin is not stored
    assert decode_retained(encode_retained(message)) == (kept, None)
    stored, object_key = decode_retained(encode_retained(message, "retained/abc"))
    assert object_key == "retained/abc" and stored.payload == b""
    stored.payload = b"data"
    assert stored == kept


def test_a_value_in_the_old_json_form_is_reported() -> None:
    with pytest.raises(CorruptMessage):
        decode_retained(json.dumps({"topic": "t", "qos": 0, "payload": "eA=="}).encode())
