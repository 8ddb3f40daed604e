"""QoS 0/1/2 in both directions, acknowledgements, receive maximum, maximum packet size."""

from __future__ import annotations

import time

import pytest

from flowmq_wire.mqtt.codec import encode
from flowmq_wire.mqtt.packets import (
    Connack,
    Disconnect,
    Pingreq,
    Pingresp,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    SubscriptionOptions,
)

from .conftest import Closed, connected, roundtrip, subscribed

MIB = 1024 * 1024


@pytest.mark.parametrize("sub_qos", [0, 1, 2])
@pytest.mark.parametrize(("pub_v5", "sub_v5"), [(True, True), (False, False), (True, False)])
def test_effective_qos_is_the_minimum(paho, uid, sub_qos, pub_v5, sub_v5):
    topic = f"qos/{uid}"
    sub = connected(paho, f"sub-{uid}", v5=sub_v5)
    assert sub.subscribe(topic, sub_qos) == [sub_qos]
    pub = connected(paho, f"pub-{uid}", v5=pub_v5)
    for pub_qos in (0, 1, 2):
        pub.publish(topic, f"q{pub_qos}".encode(), pub_qos)
    got = {m.payload: m.qos for m in sub.expect(3)}
    assert got == {f"q{q}".encode(): min(q, sub_qos) for q in (0, 1, 2)}
    sub.expect_none(0.2)


def test_qos1_and_qos2_publisher_flows_v5(raw, uid):
    topic = f"flows/{uid}"
    sub = raw(5)
    sub.connect(f"sub-{uid}")
    sub.subscribe((topic, SubscriptionOptions(2)))
    pub = raw(5)
    pub.connect(f"pub-{uid}")

    ack = pub.publish(topic, b"one", 1)
    assert ack.reason_code == 0
    # QoS 2: PUBREC, then PUBREL → PUBCOMP, all with the packet id we chose.
    pub.send(Publish(topic, b"two", 2, packet_id=300))
    rec = pub.expect(Pubrec)
    assert (rec.packet_id, rec.reason_code) == (300, 0)
    pub.send(Pubrel(300))
    comp = pub.expect(Pubcomp)
    assert (comp.packet_id, comp.reason_code) == (300, 0)

    one = sub.expect(Publish)
    assert (one.payload, one.qos) == (b"one", 1) and one.packet_id
    sub.send(Puback(one.packet_id))
    two = sub.expect(Publish)
    assert (two.payload, two.qos) == (b"two", 2) and two.packet_id
    sub.send(Pubrec(two.packet_id))
    assert sub.expect(Pubrel).packet_id == two.packet_id
    sub.send(Pubcomp(two.packet_id))
    sub.expect_nothing()


def test_v5_publish_without_subscribers_is_accepted(raw, uid):
    pub = raw(5)
    pub.connect(f"pub-{uid}")
    # 0x10 No matching subscribers, or plain success (the server MAY say which).
    assert pub.publish(f"nobody/{uid}", b"x", 1).reason_code in (0x00, 0x10)
    pub.send(Publish(f"nobody/{uid}", b"x", 2, packet_id=2))
    assert pub.expect(Pubrec).reason_code in (0x00, 0x10)
    pub.send(Pubrel(2))
    assert pub.expect(Pubcomp).reason_code == 0


def test_v5_pubrel_for_unknown_packet_id(raw, uid):
    pub = raw(5)
    pub.connect(f"pub-{uid}")
    pub.send(Pubrel(4242))
    comp = pub.expect(Pubcomp)
    assert (comp.packet_id, comp.reason_code) == (4242, 0x92)


def test_outbound_packet_ids_distinct_while_in_flight(raw, uid):
    topic = f"ids/{uid}"
    sub = raw(5)
    sub.connect(f"sub-{uid}")
    sub.subscribe((topic, SubscriptionOptions(1)))
    pub = raw(5)
    pub.connect(f"pub-{uid}")
    for i in range(20):
        pub.publish(topic, str(i).encode(), 1)
    got = [sub.expect(Publish) for _ in range(20)]
    assert [p.payload for p in got] == [str(i).encode() for i in range(20)]  # in order
    ids = [p.packet_id for p in got]
    assert len(set(ids)) == 20 and all(0 < i < 65536 for i in ids)


def test_qos2_duplicate_publish_before_pubrel_is_delivered_once(paho, raw, uid):
    topic = f"dupq2/{uid}"
    sub = subscribed(paho, f"sub-{uid}", topic, 2)
    pub = raw(5)
    pub.connect(f"pub-{uid}")
    pub.send(Publish(topic, b"d", 2, packet_id=5))
    pub.expect(Pubrec)
    pub.send(Publish(topic, b"d", 2, dup=True, packet_id=5))
    pub.expect(Pubrec)
    pub.send(Pubrel(5))
    pub.expect(Pubcomp)
    assert sub.get().payload == b"d"
    sub.expect_none()


# --- receive maximum ------------------------------------------------------------------------
def _receive_maximum_pair(raw, uid: str, topic: str, receive_maximum: int, qos: int):
    """A v5 subscriber to ``topic`` at ``qos`` with ``receive_maximum``, and a v5 publisher."""
    sub = raw(5)
    sub.connect(f"sub-{uid}", properties={"receive_maximum": receive_maximum})
    sub.subscribe((topic, SubscriptionOptions(qos)))
    pub = raw(5)
    pub.connect(f"pub-{uid}")
    return sub, pub


def test_receive_maximum_limits_unacknowledged_deliveries(raw, uid):
    topic = f"recvmax/{uid}"
    sub, pub = _receive_maximum_pair(raw, uid, topic, 2, qos=1)
    for i in range(5):
        pub.publish(topic, f"m{i}".encode(), 1)

    first = [sub.expect(Publish), sub.expect(Publish)]
    assert [p.payload for p in first] == [b"m0", b"m1"]
    sub.expect_nothing()  # window of 2 is full
    sub.send(Puback(first[0].packet_id))
    third = sub.expect(Publish)
    assert third.payload == b"m2"
    sub.expect_nothing()
    sub.send(Puback(first[1].packet_id), Puback(third.packet_id))
    rest = [sub.expect(Publish), sub.expect(Publish)]
    assert [p.payload for p in rest] == [b"m3", b"m4"]
    sub.send(*(Puback(p.packet_id) for p in rest))
    sub.expect_nothing()


def test_receive_maximum_with_paho_manual_ack(paho, uid):
    topic = f"recvmaxpaho/{uid}"
    sub = paho(f"sub-{uid}", v5=True, manual_ack=True)
    sub.connect(properties={"ReceiveMaximum": 2})
    sub.subscribe(topic, 1)
    pub = connected(paho, f"pub-{uid}")
    for i in range(4):
        pub.publish(topic, f"m{i}".encode(), 1)
    got = sub.expect(2)
    sub.expect_none()
    for m in got:
        sub.client.ack(m.mid, m.qos)
    got += sub.expect(2)
    assert [m.payload for m in got] == [b"m0", b"m1", b"m2", b"m3"]
    for m in got[2:]:
        sub.client.ack(m.mid, m.qos)


def test_receive_maximum_counts_qos2_until_pubcomp(raw, uid):
    topic = f"recvmax2/{uid}"
    sub, pub = _receive_maximum_pair(raw, uid, topic, 1, qos=2)
    for i in range(2):
        pub.send(Publish(topic, f"m{i}".encode(), 2, packet_id=i + 1))
        pub.expect(Pubrec)
        pub.send(Pubrel(i + 1))
        pub.expect(Pubcomp)
    p = sub.expect(Publish)
    sub.send(Pubrec(p.packet_id))
    sub.expect(Pubrel)
    sub.expect_nothing()  # still in flight until PUBCOMP (MQTT 5 §4.9)
    sub.send(Pubcomp(p.packet_id))
    assert sub.expect(Publish).payload == b"m1"


# --- maximum packet size ------------------------------------------------------------------------
def test_client_maximum_packet_size_is_respected(raw, uid):
    topic = f"maxpkt/{uid}"
    sub = raw(5)
    sub.connect(f"sub-{uid}", properties={"maximum_packet_size": 200})
    sub.subscribe((topic, SubscriptionOptions(1)))
    pub = raw(5)
    pub.connect(f"pub-{uid}")
    pub.publish(topic, b"small-1", 1)
    pub.publish(topic, b"L" * 500, 1)
    pub.publish(topic, b"small-2", 1)
    got = []
    for _ in range(2):
        p = sub.expect(Publish)
        got.append(p.payload)
        sub.send(Puback(p.packet_id))
    assert got == [b"small-1", b"small-2"]
    sub.expect_nothing()


def test_oversize_qos1_drop_does_not_hold_an_inflight_slot(raw, uid):
    """A QoS 1 message too large for the client is discarded *as if delivered*
    (MQTT-3.1.2-25): it must not keep one of the client's Receive Maximum slots."""
    topic = f"maxpktwin/{uid}"
    sub = raw(5)
    sub.connect(f"sub-{uid}", properties={"maximum_packet_size": 200, "receive_maximum": 1})
    sub.subscribe((topic, SubscriptionOptions(1)))
    pub = raw(5)
    pub.connect(f"pub-{uid}")
    pub.publish(topic, b"L" * 500, 1)
    pub.publish(topic, b"small", 1)
    p = sub.expect(Publish)
    assert p.payload == b"small"
    sub.send(Puback(p.packet_id))
    sub.expect_nothing()


def test_client_maximum_packet_size_counts_properties(raw, uid):
    """The limit is on the whole packet: a payload that fits alone but not with its
    properties (user properties here) is not sent either."""
    topic = f"maxpktprops/{uid}"
    sub = raw(5)
    sub.connect(f"sub-{uid}", properties={"maximum_packet_size": 150})
    sub.subscribe(topic)
    pub = raw(5)
    pub.connect(f"pub-{uid}")
    pub.publish(topic, b"p" * 60, properties={"user_property": [("k" * 50, "v" * 50)]})
    pub.publish(topic, b"fits")
    assert sub.expect(Publish).payload == b"fits"
    sub.expect_nothing()


@pytest.mark.parametrize("level", [4, 5])
def test_packet_over_server_maximum_is_refused(broker, raw, uid, level):
    c = raw(level)
    ack = c.connect(f"big-{uid}")
    if level == 5:
        assert ack.properties["maximum_packet_size"] == MIB
    c.send(Publish(f"big/{uid}", b"x" * (MIB + 10), 0))
    got = c.wait_closed()
    if level == 5:
        assert [type(p) for p in got] == [Disconnect] and got[0].reason_code == 0x95
    else:
        assert got == []
    roundtrip(broker.ports["mqtt"])


def test_packet_just_under_server_maximum_is_accepted(paho, raw, uid):
    topic = f"nearmax/{uid}"
    sub = subscribed(paho, f"sub-{uid}", topic, 1, v5=True)
    pub = raw(5)
    pub.connect(f"pub-{uid}")
    payload = b"y" * (MIB - 1000)
    assert pub.publish(topic, payload, 1).reason_code == 0
    assert sub.get().payload == payload


def test_oversize_connect_is_refused(broker, raw):
    c = raw(5)
    # Declares a remaining length over 1 MiB: refused from the fixed header alone.
    c.send_raw(b"\x10\xff\xff\x7f")
    got = c.wait_closed()
    assert all(isinstance(p, Connack) and p.reason_code == 0x95 for p in got), got
    roundtrip(broker.ports["mqtt"])


def test_server_receive_maximum_enforced(raw, uid):
    """More unacknowledged QoS 2 PUBLISH than the server's Receive Maximum → DISCONNECT 0x93."""
    c = raw(5)
    ack = c.connect(f"flood-{uid}")
    maximum = ack.properties["receive_maximum"]
    assert 0 < maximum < 65535
    c.send_raw(
        b"".join(
            encode(Publish(f"flood/{uid}", b"x", 2, packet_id=i + 1), 5) for i in range(maximum + 1)
        )
    )
    got = c.wait_closed(timeout=10)
    recs = [p for p in got if isinstance(p, Pubrec)]
    assert len(recs) == maximum
    assert isinstance(got[-1], Disconnect) and got[-1].reason_code == 0x93


# --- slow QoS 1 subscribers and publisher back-pressure -----------------------------------------
@pytest.mark.parametrize("persistent", [False, True], ids=["clean", "persistent"])
def test_publisher_not_blocked_after_slow_subscriber_leaves(raw, uid, persistent):
    """A QoS 1 subscriber that stops acknowledging may slow its publishers down (back-pressure),
    but once it is gone — its session discarded, or kept offline with its queue bounded — the
    publisher must be served again."""
    topic = f"slowq1/{uid}"
    slow = raw(5)
    props = {"receive_maximum": 1}
    if persistent:
        props["session_expiry_interval"] = 60
    slow.connect(f"slow-{uid}", properties=props)
    slow.subscribe((topic, SubscriptionOptions(1)))

    pub = raw(5)
    pub.connect(f"pub-{uid}")
    n = 1500

    def burst(first: int, last: int) -> None:
        pub.send_raw(
            b"".join(
                encode(Publish(topic, b"x" * 10, 1, packet_id=i + 1), 5) for i in range(first, last)
            )
        )

    # Within the server's Receive Maximum (1024 unacknowledged): a persistent session's
    # messages are acknowledged once stored, not at once.
    burst(0, 1000)
    acked: set[int] = set()
    while len(acked) < 500:
        acked.add(pub.expect(Puback, timeout=5).packet_id)
    burst(1000, n)
    assert slow.expect(Publish).packet_id  # one in flight, never acknowledged
    slow.kill()

    while len(acked) < n:
        try:
            acked.add(pub.expect(Puback, timeout=5).packet_id)
        except TimeoutError:
            raise AssertionError(
                f"publisher stuck: {len(acked)} of {n} PUBLISH acknowledged, "
                "none more within 5 s after the slow subscriber left"
            ) from None
    assert pub.publish(f"other/{uid}", b"after", 1).reason_code in (0x00, 0x10)


def test_paused_publisher_is_not_disconnected_for_keep_alive(raw, uid):
    """While the broker holds a publisher back (it stops reading its socket because a
    subscriber lags behind), the publisher's PINGREQs sit unread in the socket: the broker must
    not then count the publisher as silent and disconnect it for keep alive (0x8D).

    Two controls keep this from passing vacuously: the publisher really is held back (no
    PINGRESP while the subscriber lags, every one once it leaves), and a client as silent as
    the held publisher looks, but not held back, is disconnected in the same time."""
    topic = f"pausedka/{uid}"
    slow = raw(5)
    slow.connect(f"slow-{uid}", properties={"receive_maximum": 1})
    slow.subscribe((topic, SubscriptionOptions(1)))
    idle = raw(5)
    idle.connect(f"idle-{uid}", keep_alive=1)
    pub = raw(5)
    pub.connect(f"pub-{uid}", keep_alive=1)
    n = 1500
    pub.send_raw(b"".join(encode(Publish(topic, b"x", 1, packet_id=i + 1), 5) for i in range(n)))
    assert slow.expect(Publish).packet_id  # one in flight, never acknowledged
    seen: list = []
    pings = 0
    start = time.monotonic()
    while time.monotonic() - start < 3.0:  # twice the 1.5 s the broker allows a silent client
        time.sleep(0.5)  # deliberate: the client's own ping pacing
        try:
            pub.send(Pingreq())
            pings += 1
            while True:
                seen.append(pub.recv(0.01))
        except TimeoutError:
            pass
        except (Closed, OSError):
            closing = [p for p in seen if isinstance(p, Disconnect)]
            raise AssertionError(
                f"paused publisher disconnected after {time.monotonic() - start:.1f} s: "
                f"{closing or 'connection closed'}"
            ) from None
    assert not [p for p in seen if isinstance(p, Disconnect)]
    assert not [p for p in seen if isinstance(p, Pingresp)], "the publisher was not held back"
    assert [p.reason_code for p in idle.wait_closed()] == [0x8D]

    slow.kill()  # the lagging subscriber leaves: the publisher is read again, PINGREQs included
    acked = {p.packet_id for p in seen if isinstance(p, Puback)}
    answered = 0
    while len(acked) < n or answered < pings:
        p = pub.recv()
        if isinstance(p, Puback):
            acked.add(p.packet_id)
        else:
            assert isinstance(p, Pingresp), p
            answered += 1
