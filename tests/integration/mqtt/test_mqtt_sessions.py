"""Clean session / clean start, session expiry, offline queueing, redelivery, QoS 2 resumption."""

from __future__ import annotations

import socket

import pytest

from flowmq_wire.mqtt.packets import (
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    SubscriptionOptions,
)

from .conftest import QUIET, connected, http, subscribed, wait_until

PERSIST_V5 = {"session_expiry_interval": 300}


# --- persistent sessions -----------------------------------------------------------------------
@pytest.mark.parametrize("v5", [False, True], ids=["v311", "v5"])
def test_persistent_session_keeps_subscriptions_and_queues_offline_messages(paho, uid, v5):
    topic = f"persist/{uid}"
    persist = {"SessionExpiryInterval": 300} if v5 else None

    sub = paho(f"sub-{uid}", v5=v5, clean=False)
    assert sub.connect(clean_start=True, properties=persist)[0] is False
    assert sub.subscribe(topic, 2) == [2]
    sub.close()

    pub = connected(paho, f"pub-{uid}", v5=v5)
    pub.publish(topic, b"q1", 1)
    pub.publish(topic, b"q2", 2)

    sub = paho(f"sub-{uid}", v5=v5, clean=False)
    session_present, _, _ = sub.connect(clean_start=False, properties=persist)
    assert session_present is True
    got = {(m.payload, m.qos) for m in sub.expect(2)}
    assert got == {(b"q1", 1), (b"q2", 2)}
    # The subscription survived the reconnect: no SUBSCRIBE needed for new messages.
    pub.publish(topic, b"live", 1)
    assert sub.get().payload == b"live"
    sub.expect_none()


@pytest.mark.parametrize("v5", [False, True], ids=["v311", "v5"])
def test_clean_start_discards_the_session(paho, uid, v5):
    topic = f"clean/{uid}"
    persist = {"SessionExpiryInterval": 300} if v5 else None
    sub = paho(f"sub-{uid}", v5=v5, clean=False)
    sub.connect(clean_start=False, properties=persist)
    assert sub.subscribe(topic, 1) == [1]
    sub.close()

    pub = connected(paho, f"pub-{uid}", v5=v5)
    pub.publish(topic, b"while offline", 1)

    sub = paho(f"sub-{uid}", v5=v5, clean=True)
    assert sub.connect(clean_start=True, properties=persist)[0] is False
    sub.expect_none()  # queued messages went with the session
    pub.publish(topic, b"after clean start", 1)
    sub.expect_none()  # …and so did its subscriptions


def test_v5_session_without_expiry_ends_with_the_connection(paho, uid):
    sub = paho(f"sub-{uid}", v5=True)
    sub.connect(clean_start=False)  # Session Expiry Interval absent = 0
    sub.subscribe(f"noexpiry/{uid}", 1)
    sub.close()
    again = paho(f"sub-{uid}", v5=True)
    assert again.connect(clean_start=False)[0] is False


def test_v5_session_expiry_interval_elapsing_discards_the_session(broker, paho, uid):
    topic = f"expiring/{uid}"
    sub = paho(f"sub-{uid}", v5=True)
    sub.connect(clean_start=False, properties={"SessionExpiryInterval": 1})
    sub.subscribe(topic, 1)
    sub.close()

    def subscribed() -> bool:
        _, body = http(broker.http, "GET", "/api/v1/subscriptions", broker.token)
        return any(s["topic_filter"] == topic for s in body["data"])

    # Still there right after the disconnect…
    assert subscribed()
    # …gone once the interval has passed (polled, bounded).
    wait_until(lambda: not subscribed(), timeout=4)
    again = paho(f"sub-{uid}", v5=True)
    assert again.connect(clean_start=False, properties={"SessionExpiryInterval": 1})[0] is False
    pub = connected(paho, f"pub-{uid}")
    pub.publish(topic, b"x", 1)
    again.expect_none()


def test_v5_reconnect_within_expiry_keeps_the_session(paho, uid):
    sub = paho(f"sub-{uid}", v5=True)
    sub.connect(clean_start=False, properties={"SessionExpiryInterval": 2})
    sub.subscribe(f"within/{uid}", 1)
    sub.close()
    again = paho(f"sub-{uid}", v5=True)
    assert again.connect(clean_start=False, properties={"SessionExpiryInterval": 2})[0] is True


# --- redelivery ----------------------------------------------------------------------------
@pytest.mark.parametrize("level", [4, 5])
def test_unacknowledged_qos1_redelivered_with_dup_on_reconnect(raw, uid, level):
    topic = f"redeliver/{uid}"
    props = PERSIST_V5 if level == 5 else None
    sub = raw(level)
    sub.connect(f"sub-{uid}", clean_start=False, properties=props)
    assert sub.subscribe((topic, SubscriptionOptions(1))) == [1]

    pub = raw(5)
    pub.connect(f"pub-{uid}")
    pub.publish(topic, b"m1", 1)
    pub.publish(topic, b"m2", 1)

    first = [sub.expect(Publish), sub.expect(Publish)]
    assert [p.payload for p in first] == [b"m1", b"m2"]
    assert all(not p.dup and p.qos == 1 for p in first)
    sub.send(Puback(first[0].packet_id))  # m1 acknowledged, m2 not
    sub.kill()

    sub = raw(level)
    ack = sub.connect(f"sub-{uid}", clean_start=False, properties=props)
    assert ack.session_present is True
    again = sub.expect(Publish)
    assert (again.payload, again.dup, again.qos) == (b"m2", True, 1)
    assert again.packet_id == first[1].packet_id  # same packet identifier (MQTT-4.4.0-1)
    sub.expect_nothing()  # m1 is not redelivered
    sub.send(Puback(again.packet_id))
    sub.close()

    sub = raw(level)
    sub.connect(f"sub-{uid}", clean_start=False, properties=props)
    sub.expect_nothing()  # nothing left in flight


def test_paho_manual_ack_redelivery(paho, uid):
    """paho with manual_ack: a message not acked before the connection dies comes back."""
    topic = f"manual/{uid}"
    persist = {"SessionExpiryInterval": 300}
    sub = paho(f"sub-{uid}", v5=True, manual_ack=True)
    sub.connect(clean_start=False, properties=persist)
    sub.subscribe(topic, 1)
    pub = connected(paho, f"pub-{uid}")
    pub.publish(topic, b"unacked", 1)
    m = sub.get()
    assert m.payload == b"unacked" and not m.dup
    # Die without acknowledging.
    sub.client.socket().shutdown(socket.SHUT_RDWR)
    sub.wait_disconnect()
    sub.client.loop_stop()

    sub2 = paho(f"sub-{uid}", v5=True, manual_ack=True)
    assert sub2.connect(clean_start=False, properties=persist)[0] is True
    m2 = sub2.get()
    assert (m2.payload, m2.dup) == (b"unacked", True)
    sub2.client.ack(m2.mid, m2.qos)


# --- QoS 2 across a client crash ---------------------------------------------------------------
def _qos2_publish_then_die(raw, level: int, client_id: str, publish: Publish) -> Pubrec:
    """A publisher with a session that outlives the connection sends the QoS 2 ``publish``,
    gets its PUBREC and dies before PUBREL (RST, no DISCONNECT); return the PUBREC."""
    pub = raw(level)
    pub.connect(client_id, clean_start=False, properties=PERSIST_V5 if level == 5 else None)
    pub.send(publish)
    rec = pub.expect(Pubrec)
    pub.kill()
    return rec


@pytest.mark.parametrize("level", [4, 5])
def test_qos2_inbound_exactly_once_across_publisher_kill(paho, raw, uid, level):
    topic = f"exactly/{uid}"
    props = PERSIST_V5 if level == 5 else None
    sub = subscribed(paho, f"sub-{uid}", topic, 2, v5=True)

    once = Publish(topic, b"once", 2, packet_id=7)
    assert _qos2_publish_then_die(raw, level, f"pub-{uid}", once).packet_id == 7

    pub = raw(level)
    ack = pub.connect(f"pub-{uid}", clean_start=False, properties=props)
    assert ack.session_present is True
    # The client does not know whether PUBREC got through: it resends the PUBLISH, then PUBREL.
    pub.send(Publish(topic, b"once", 2, dup=True, packet_id=7))
    assert pub.expect(Pubrec).packet_id == 7
    pub.send(Pubrel(7))
    comp = pub.expect(Pubcomp)
    assert (comp.packet_id, comp.reason_code) == (7, 0)

    m = sub.get()
    assert (m.payload, m.qos) == (b"once", 2)
    sub.expect_none(QUIET + 0.1)  # exactly once


@pytest.mark.parametrize("level", [4, 5])
def test_qos2_inbound_pubrel_only_after_reconnect(paho, raw, uid, level):
    """Killed after PUBREC, the client resends only PUBREL: the message is delivered once."""
    topic = f"relonly/{uid}"
    props = PERSIST_V5 if level == 5 else None
    sub = subscribed(paho, f"sub-{uid}", topic, 2, v5=True)
    _qos2_publish_then_die(raw, level, f"pub-{uid}", Publish(topic, b"one", 2, packet_id=9))
    pub = raw(level)
    pub.connect(f"pub-{uid}", clean_start=False, properties=props)
    pub.send(Pubrel(9))
    comp = pub.expect(Pubcomp)
    assert (comp.packet_id, comp.reason_code) == (9, 0)
    assert sub.get().payload == b"one"
    sub.expect_none()


@pytest.mark.parametrize("level", [4, 5])
def test_qos2_outbound_resumes_with_pubrel_after_subscriber_kill(raw, uid, level):
    topic = f"outq2/{uid}"
    props = PERSIST_V5 if level == 5 else None
    sub = raw(level)
    sub.connect(f"sub-{uid}", clean_start=False, properties=props)
    assert sub.subscribe((topic, SubscriptionOptions(2))) == [2]
    pub = raw(5)
    pub.connect(f"pub-{uid}")
    pub.send(Publish(topic, b"q2", 2, packet_id=1))
    pub.expect(Pubrec)
    pub.send(Pubrel(1))
    pub.expect(Pubcomp)

    p = sub.expect(Publish)
    assert (p.payload, p.qos) == (b"q2", 2)
    sub.send(Pubrec(p.packet_id))
    assert sub.expect(Pubrel).packet_id == p.packet_id
    sub.kill()  # dies before PUBCOMP

    sub = raw(level)
    assert sub.connect(f"sub-{uid}", clean_start=False, properties=props).session_present
    rel = sub.expect(Pubrel)  # the flow resumes at PUBREL, the PUBLISH is not sent again
    assert rel.packet_id == p.packet_id
    sub.expect_nothing()
    sub.send(Pubcomp(p.packet_id))
    sub.close()

    sub = raw(level)
    sub.connect(f"sub-{uid}", clean_start=False, properties=props)
    sub.expect_nothing()


@pytest.mark.parametrize("level", [4, 5])
def test_qos2_outbound_publish_resent_if_pubrec_never_sent(raw, uid, level):
    topic = f"outq2b/{uid}"
    props = PERSIST_V5 if level == 5 else None
    sub = raw(level)
    sub.connect(f"sub-{uid}", clean_start=False, properties=props)
    sub.subscribe((topic, SubscriptionOptions(2)))
    pub = raw(5)
    pub.connect(f"pub-{uid}")
    pub.send(Publish(topic, b"again", 2, packet_id=1))
    pub.expect(Pubrec)
    pub.send(Pubrel(1))
    p = sub.expect(Publish)
    sub.kill()  # dies before PUBREC
    sub = raw(level)
    sub.connect(f"sub-{uid}", clean_start=False, properties=props)
    again = sub.expect(Publish)
    assert (again.payload, again.dup, again.packet_id) == (b"again", True, p.packet_id)
    sub.send(Pubrec(again.packet_id))
    assert sub.expect(Pubrel).packet_id == again.packet_id
    sub.send(Pubcomp(again.packet_id))
    sub.expect_nothing()


@pytest.mark.parametrize("qos", [1, 2])
def test_redelivery_respects_the_new_receive_maximum(raw, uid, qos):
    """Messages resent on reconnect count against the Receive Maximum of the *new* connection
    (MQTT-3.3.4-7), and each is resent with its original packet identifier and DUP
    (MQTT-4.4.0-1) — with a new identifier a QoS 2 receiver would take it for a new message."""
    topic = f"resendmax/{uid}"
    sub = raw(5)
    sub.connect(f"sub-{uid}", clean_start=False, properties={**PERSIST_V5, "receive_maximum": 10})
    sub.subscribe((topic, SubscriptionOptions(qos)))
    pub = raw(5)
    pub.connect(f"pub-{uid}")
    for i in range(3):
        pub.publish(topic, f"m{i}".encode(), 1)
    original = [sub.expect(Publish) for _ in range(3)]
    assert [p.payload for p in original] == [b"m0", b"m1", b"m2"]
    sub.kill()  # none acknowledged

    sub = raw(5)
    sub.connect(f"sub-{uid}", clean_start=False, properties={**PERSIST_V5, "receive_maximum": 1})
    for before in original:
        again = sub.expect(Publish)
        assert (again.payload, again.dup, again.packet_id) == (
            before.payload,
            True,
            before.packet_id,
        )
        sub.expect_nothing()  # the window of 1 is full
        if qos == 1:
            sub.send(Puback(again.packet_id))
        else:
            sub.send(Pubrec(again.packet_id))
            assert sub.expect(Pubrel).packet_id == again.packet_id
            sub.send(Pubcomp(again.packet_id))
    sub.expect_nothing()


def test_offline_queue_and_live_messages_keep_publish_order(raw, uid):
    """Messages queued while away and messages published after the reconnect reach the
    subscriber in the order they were published (MQTT 5 §4.6, per topic and QoS)."""
    topic = f"order/{uid}"
    props = {**PERSIST_V5, "receive_maximum": 3}
    sub = raw(5)
    sub.connect(f"sub-{uid}", clean_start=False, properties=props)
    sub.subscribe((topic, SubscriptionOptions(1)))
    sub.disconnect()
    pub = raw(5)
    pub.connect(f"pub-{uid}")
    for i in range(10):
        pub.publish(topic, str(i).encode(), 1)

    sub = raw(5)
    sub.connect(f"sub-{uid}", clean_start=False, properties=props)
    got = []
    for i in range(10, 15):
        pub.publish(topic, str(i).encode(), 1)
        p = sub.expect(Publish)
        got.append(int(p.payload))
        sub.send(Puback(p.packet_id))
    while len(got) < 15:
        p = sub.expect(Publish)
        got.append(int(p.payload))
        sub.send(Puback(p.packet_id))
    assert got == list(range(15))
