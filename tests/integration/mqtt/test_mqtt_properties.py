"""MQTT 5 properties: topic aliases both ways, message expiry, pass-through properties."""

from __future__ import annotations

import time

import pytest

from flowmq_wire.mqtt.packets import Disconnect, Puback, Publish, SubscriptionOptions

from .conftest import connected, subscribed

PASSTHROUGH = {
    "PayloadFormatIndicator": 1,
    "ContentType": "application/json; charset=utf-8",
    "ResponseTopic": "replies/here",
    "CorrelationData": b"\x00\xff\x10binary",
    "UserProperty": [("k", "v1"), ("a", "b"), ("k", "v2"), ("ünï", "cødé")],
}


# --- topic aliases: client → server ------------------------------------------------------------
def test_topic_alias_client_to_server_paho(paho, uid):
    topic = f"alias/in/{uid}"
    sub = subscribed(paho, f"sub-{uid}", topic, 1, v5=True)
    pub = connected(paho, f"pub-{uid}", v5=True)
    pub.publish(topic, b"first", 1, properties={"TopicAlias": 1})
    pub.publish("", b"by alias", 1, properties={"TopicAlias": 1})
    got = [(m.topic, m.payload) for m in sub.expect(2)]
    assert got == [(topic, b"first"), (topic, b"by alias")]


def test_topic_alias_can_be_remapped(raw, paho, uid):
    sub = subscribed(paho, f"sub-{uid}", f"remap/{uid}/#", 1, v5=True)
    pub = raw(5)
    pub.connect(f"pub-{uid}")
    pub.publish(f"remap/{uid}/a", b"1", 1, properties={"topic_alias": 3})
    pub.publish(f"remap/{uid}/b", b"2", 1, properties={"topic_alias": 3})
    pub.publish("", b"3", 1, properties={"topic_alias": 3})
    got = [(m.topic, m.payload) for m in sub.expect(3)]
    assert got == [(f"remap/{uid}/a", b"1"), (f"remap/{uid}/b", b"2"), (f"remap/{uid}/b", b"3")]


@pytest.mark.parametrize("alias", [0, "over"])
def test_topic_alias_out_of_range_is_disconnected_0x94(raw, uid, alias):
    c = raw(5)
    ack = c.connect(f"badalias-{uid}")
    maximum = ack.properties.get("topic_alias_maximum", 0)
    value = maximum + 1 if alias == "over" else 0
    c.send(Publish(f"x/{uid}", b"x", 0, properties={"topic_alias": value}))
    got = c.wait_closed()
    assert [type(p) for p in got] == [Disconnect]
    # Over the maximum: 0x94 (MQTT-3.3.2-9/10). Alias 0 is forbidden outright (MQTT-3.3.2-8):
    # 0x94 or a plain protocol error.
    assert got[0].reason_code in ((0x94,) if alias == "over" else (0x94, 0x82))


def test_unknown_topic_alias_is_protocol_error(raw, uid):
    c = raw(5)
    c.connect(f"unknownalias-{uid}")
    c.send(Publish("", b"x", 0, properties={"topic_alias": 2}))
    got = c.wait_closed()
    assert [type(p) for p in got] == [Disconnect] and got[0].reason_code == 0x82


def test_topic_aliases_do_not_outlive_the_connection(raw, uid):
    """MQTT 5 §3.3.2.3.4: alias mappings exist only within one network connection."""
    c = raw(5)
    props = {"session_expiry_interval": 60}
    c.connect(f"aliasconn-{uid}", clean_start=False, properties=props)
    c.publish(f"ac/{uid}", b"x", 1, properties={"topic_alias": 1})
    c.disconnect()
    c = raw(5)
    assert c.connect(f"aliasconn-{uid}", clean_start=False, properties=props).session_present
    c.send(Publish("", b"y", 1, packet_id=1, properties={"topic_alias": 1}))
    got = c.wait_closed()
    assert [type(p) for p in got] == [Disconnect] and got[0].reason_code == 0x82


# --- topic aliases: server → client ----------------------------------------------------------
def _resolve(publishes: list[Publish], maximum: int) -> list[str]:
    """The topics a conforming client resolves, checking every alias is within ``maximum``."""
    aliases: dict[int, str] = {}
    topics = []
    for p in publishes:
        alias = p.properties.get("topic_alias")
        if alias is not None:
            assert 1 <= alias <= maximum, f"alias {alias} beyond the announced {maximum}"
            if p.topic:
                aliases[alias] = p.topic
            else:
                assert alias in aliases, f"alias {alias} used before it was set"
        else:
            assert p.topic, "empty topic without an alias"
        topics.append(p.topic or aliases[alias])
    return topics


def test_server_uses_topic_aliases_when_client_allows(raw, uid):
    sub = raw(5)
    sub.connect(f"sub-{uid}", properties={"topic_alias_maximum": 5})
    sub.subscribe((f"ta/{uid}/#", SubscriptionOptions(1)))
    pub = raw(5)
    pub.connect(f"pub-{uid}")
    sent = [f"ta/{uid}/a", f"ta/{uid}/a", f"ta/{uid}/b", f"ta/{uid}/a", f"ta/{uid}/b"]
    for i, topic in enumerate(sent):
        pub.publish(topic, str(i).encode(), 1)
    got = []
    for _ in sent:
        p = sub.expect(Publish)
        sub.send(Puback(p.packet_id))
        got.append(p)
    assert [p.payload for p in got] == [str(i).encode() for i in range(len(sent))]
    # The second PUBLISH on a topic has an empty topic name and the alias.
    assert got[0].topic == sent[0] and "topic_alias" in got[0].properties
    assert (
        got[1].topic == "" and got[1].properties["topic_alias"] == got[0].properties["topic_alias"]
    )
    assert got[2].properties["topic_alias"] != got[0].properties["topic_alias"]
    assert _resolve(got, 5) == sent


def test_server_topic_aliases_respect_a_small_maximum(raw, uid):
    sub = raw(5)
    sub.connect(f"sub-{uid}", properties={"topic_alias_maximum": 1})
    sub.subscribe(f"tamax/{uid}/#")
    pub = raw(5)
    pub.connect(f"pub-{uid}")
    sent = [f"tamax/{uid}/{t}" for t in "abcabca"]
    for topic in sent:
        pub.publish(topic, b"x")
    got = [sub.expect(Publish) for _ in sent]
    assert _resolve(got, 1) == sent


def test_server_does_not_use_aliases_unless_allowed(raw, uid):
    sub = raw(5)
    sub.connect(f"sub-{uid}")  # no Topic Alias Maximum: 0
    sub.subscribe(f"noalias/{uid}")
    pub = raw(5)
    pub.connect(f"pub-{uid}")
    for _ in range(3):
        pub.publish(f"noalias/{uid}", b"x")
    for _ in range(3):
        p = sub.expect(Publish)
        assert p.topic == f"noalias/{uid}" and "topic_alias" not in p.properties


def test_server_aliases_restart_with_each_connection(raw, uid):
    props = {"topic_alias_maximum": 5, "session_expiry_interval": 60}
    topic = f"tarec/{uid}"
    sub = raw(5)
    sub.connect(f"sub-{uid}", clean_start=False, properties=props)
    sub.subscribe(topic)
    pub = raw(5)
    pub.connect(f"pub-{uid}")
    pub.publish(topic, b"1")
    assert sub.expect(Publish).topic == topic
    sub.disconnect()
    sub = raw(5)
    sub.connect(f"sub-{uid}", clean_start=False, properties=props)
    pub.publish(topic, b"2")
    p = sub.expect(Publish)
    assert p.topic == topic, "an alias from the previous connection was used"


# --- message expiry -------------------------------------------------------------------------
def test_message_expiry_offline_queue_and_retained(paho, raw, uid):
    topic = f"expiry/{uid}"
    props = {"session_expiry_interval": 60}
    sub = raw(5)
    sub.connect(f"sub-{uid}", clean_start=False, properties=props)
    sub.subscribe((topic, SubscriptionOptions(1)))
    sub.disconnect()

    pub = connected(paho, f"pub-{uid}", v5=True)
    pub.publish(topic, b"short", 1, properties={"MessageExpiryInterval": 1})
    pub.publish(topic, b"long", 1, properties={"MessageExpiryInterval": 60})
    pub.publish(topic, b"forever", 1)
    pub.publish(f"{topic}/ret", b"short retained", 1, True, {"MessageExpiryInterval": 1})
    pub.publish(f"{topic}/ret2", b"long retained", 1, True, {"MessageExpiryInterval": 60})

    time.sleep(2.0)  # let the 1 s messages expire: the behaviour under test is time itself

    sub = raw(5)
    assert sub.connect(f"sub-{uid}", clean_start=False, properties=props).session_present
    got = {}
    for _ in range(2):
        p = sub.expect(Publish)
        sub.send(Puback(p.packet_id))
        got[p.payload] = p.properties.get("message_expiry_interval")
    sub.expect_nothing()
    assert set(got) == {b"long", b"forever"}
    assert got[b"forever"] is None
    assert 55 <= got[b"long"] <= 59, got  # decremented by the time it waited

    late = raw(5)
    late.connect(f"late-{uid}")
    late.subscribe((f"{topic}/+", SubscriptionOptions(1)))
    p = late.expect(Publish)
    assert p.payload == b"long retained"
    assert 55 <= p.properties["message_expiry_interval"] <= 59
    late.expect_nothing()


def test_live_message_carries_its_expiry(paho, uid):
    topic = f"liveexp/{uid}"
    sub = subscribed(paho, f"sub-{uid}", topic, 1, v5=True)
    pub = connected(paho, f"pub-{uid}", v5=True)
    pub.publish(topic, b"x", 1, properties={"MessageExpiryInterval": 30})
    m = sub.get()
    assert 29 <= m.properties.MessageExpiryInterval <= 30


# --- pass-through properties ---------------------------------------------------------------
@pytest.mark.parametrize("qos", [0, 1, 2])
def test_properties_pass_through_v5_to_v5(paho, uid, qos):
    topic = f"props/{uid}"
    sub = subscribed(paho, f"sub-{uid}", topic, 2, v5=True)
    pub = connected(paho, f"pub-{uid}", v5=True)
    pub.publish(topic, b'{"a": 1}', qos, properties=PASSTHROUGH)
    m = sub.get()
    assert m.payload == b'{"a": 1}'
    for name, value in PASSTHROUGH.items():
        assert getattr(m.properties, name) == value, name


def test_properties_pass_through_offline_queue(paho, raw, uid):
    topic = f"propsq/{uid}"
    persist = {"SessionExpiryInterval": 60}
    sub = paho(f"sub-{uid}", v5=True)
    sub.connect(clean_start=False, properties=persist)
    sub.subscribe(topic, 1)
    sub.close()
    pub = connected(paho, f"pub-{uid}", v5=True)
    pub.publish(topic, b"queued", 1, properties=PASSTHROUGH)
    sub = paho(f"sub-{uid}", v5=True)
    sub.connect(clean_start=False, properties=persist)
    m = sub.get()
    for name, value in PASSTHROUGH.items():
        assert getattr(m.properties, name) == value, name


def test_payload_format_indicator_zero_is_kept_distinct(raw, uid):
    topic = f"pfi/{uid}"
    sub = raw(5)
    sub.connect(f"sub-{uid}")
    sub.subscribe(topic)
    pub = raw(5)
    pub.connect(f"pub-{uid}")
    pub.publish(topic, b"\xff\xfe", properties={"payload_format_indicator": 0})
    pub.publish(topic, b"plain")
    a, b = sub.expect(Publish), sub.expect(Publish)
    assert a.properties.get("payload_format_indicator", 0) == 0 and a.payload == b"\xff\xfe"
    assert "payload_format_indicator" not in b.properties


def test_v5_publish_to_v311_subscriber_is_plain(paho, uid):
    topic = f"props4/{uid}"
    sub = subscribed(paho, f"sub-{uid}", topic, 1, v5=False)
    pub = connected(paho, f"pub-{uid}", v5=True)
    pub.publish(topic, b"payload", 1, properties=PASSTHROUGH)
    m = sub.get()
    assert (m.topic, m.payload, m.qos) == (topic, b"payload", 1)
