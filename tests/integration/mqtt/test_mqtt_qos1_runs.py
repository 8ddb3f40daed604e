"""QoS 1 a run at a time: many PUBLISH packets (and PUBACKs) in one read, as a busy client
sends them, are routed, acknowledged and released together (docs/mqtt.md "QoS 1 runs").
Whatever the run path does, every client sees what one packet at a time gave it: its own
packet ids, the order, the window, the subscription's QoS and properties, the PUBACK reason."""

from __future__ import annotations

import pytest

from flowmq_wire.mqtt import reason_codes as rc
from flowmq_wire.mqtt.codec import encode
from flowmq_wire.mqtt.packets import Puback, Publish, SubscriptionOptions

N = 40


def _burst(pub, topic: str, payloads: list[bytes], first_id: int = 1, qos: int = 1) -> None:
    """``payloads`` as QoS ``qos`` PUBLISH packets in one write (one read for the broker)."""
    pub.send_raw(
        b"".join(
            encode(Publish(topic, p, qos, packet_id=(first_id + i) if qos else None), pub.level)
            for i, p in enumerate(payloads)
        )
    )


def _pubacks(pub, count: int) -> list[Puback]:
    return [pub.expect(Puback) for _ in range(count)]


def _pair(raw, uid, topic: str, level: int = 5, **sub_properties):  # noqa: ANN001, ANN202
    """A subscriber of ``topic`` at QoS 1 (CONNECT properties ``sub_properties``) and a
    publisher, both connected at protocol ``level``."""
    sub = raw(level)
    sub.connect(f"sub-{uid}", **({"properties": sub_properties} if sub_properties else {}))
    sub.subscribe((topic, SubscriptionOptions(1)))
    pub = raw(level)
    pub.connect(f"pub-{uid}")
    return sub, pub


@pytest.mark.parametrize("level", [4, 5])
def test_a_run_reaches_the_subscriber_in_order_with_its_own_packet_ids(raw, uid, level):
    topic = f"run1/{uid}"
    sub, pub = _pair(raw, uid, topic, level)
    pub.publish(topic, b"first", 1)  # the topic is checked: what follows goes as runs
    assert sub.expect(Publish).payload == b"first"
    # Publisher ids near the top of the range: the subscriber's come from its own session.
    payloads = [f"m{i}".encode() * (i % 7 + 1) for i in range(N)]
    _burst(pub, topic, payloads, first_id=65535 - N)
    acks = _pubacks(pub, N)
    assert [a.packet_id for a in acks] == list(range(65535 - N, 65535))
    assert all(a.reason_code == rc.SUCCESS for a in acks)
    got = [sub.expect(Publish) for _ in range(N)]
    assert [p.payload for p in got] == payloads
    assert all(p.qos == 1 and not p.dup and not p.retain for p in got)
    ids = [p.packet_id for p in got]
    assert len(set(ids)) == N and all(0 < i < 65536 for i in ids)
    assert not set(ids) & set(range(65535 - N, 65535))  # not the publisher's
    sub.send(*(Puback(i) for i in ids))
    sub.expect_nothing()


def test_a_run_past_the_receive_maximum_waits_and_goes_on_as_pubacks_come(raw, uid):
    topic = f"run1win/{uid}"
    sub, pub = _pair(raw, uid, topic, receive_maximum=3)
    pub.publish(topic, b"m0", 1)
    first = sub.expect(Publish)
    _burst(pub, topic, [f"m{i}".encode() for i in range(1, 10)], first_id=100)
    assert len(_pubacks(pub, 9)) == 9  # acknowledged once routed: queued counts as routed
    window = [first, sub.expect(Publish), sub.expect(Publish)]
    sub.expect_nothing()  # three in flight: the rest wait in the session
    received = list(window)
    while len(received) < 10:
        sub.send(*(Puback(p.packet_id) for p in window))  # a run of PUBACKs, one read
        window = [sub.expect(Publish) for _ in range(min(3, 10 - len(received)))]
        received += window
        sub.expect_nothing()
    assert [p.payload for p in received] == [f"m{i}".encode() for i in range(10)]
    sub.send(*(Puback(p.packet_id) for p in window))
    sub.expect_nothing()


def test_subscribers_of_other_shapes_get_what_they_asked_for(raw, uid):
    """One run, several subscribers: a 3.1.1 one at QoS 1 (the packets as they came), a
    QoS 0 subscription, a v5 one (another protocol level), a v5 one with a subscription
    identifier, and one with a filter that overlaps another of its own."""
    topic = f"run1shape/{uid}/t"
    plain = raw(4)
    plain.connect(f"plain-{uid}")
    plain.subscribe((topic, SubscriptionOptions(1)))
    qos0 = raw(4)
    qos0.connect(f"qos0-{uid}")
    qos0.subscribe((topic, SubscriptionOptions(0)))
    v5 = raw(5)
    v5.connect(f"v5-{uid}")
    v5.subscribe((topic, SubscriptionOptions(1)))
    ided = raw(5)
    ided.connect(f"ided-{uid}")
    ided.subscribe((topic, SubscriptionOptions(1)), sub_id=9)
    both = raw(5)
    both.connect(f"both-{uid}")
    both.subscribe((topic, SubscriptionOptions(0)), (f"run1shape/{uid}/+", SubscriptionOptions(1)))
    pub = raw(4)
    pub.connect(f"pub-{uid}")
    pub.publish(topic, b"x", 1)
    for c in (plain, qos0, v5, ided, both):
        c.expect(Publish)
    payloads = [f"p{i}".encode() for i in range(N)]
    _burst(pub, topic, payloads)
    assert len(_pubacks(pub, N)) == N
    clients = {"plain": plain, "qos0": qos0, "v5": v5, "ided": ided, "both": both}
    got = {name: [c.expect(Publish) for _ in range(N)] for name, c in clients.items()}
    for packets in got.values():
        assert [p.payload for p in packets] == payloads
    assert all(p.qos == 1 for p in got["plain"] + got["v5"] + got["ided"] + got["both"])
    assert all(p.qos == 0 and p.packet_id is None for p in got["qos0"])
    assert all(p.properties.get("subscription_identifier") == [9] for p in got["ided"])
    for name in ("plain", "v5", "ided", "both"):
        clients[name].send(*(Puback(p.packet_id) for p in got[name]))
        clients[name].expect_nothing()


def test_a_run_to_a_subscriber_with_a_maximum_packet_size_drops_only_the_larger(raw, uid):
    topic = f"run1max/{uid}"
    sub, pub = _pair(raw, uid, topic, maximum_packet_size=100)
    pub.publish(topic, b"x", 1)
    sub.send(Puback(sub.expect(Publish).packet_id))
    payloads = [(b"big" * 40 if i % 3 == 0 else f"s{i}".encode()) for i in range(N)]
    _burst(pub, topic, payloads)
    assert len(_pubacks(pub, N)) == N
    small = [p for p in payloads if len(p) < 100]
    got = [sub.expect(Publish) for _ in small]
    assert [p.payload for p in got] == small
    sub.send(*(Puback(p.packet_id) for p in got))
    sub.expect_nothing()
    pub.publish(topic, b"after", 1)  # the dropped ones hold no place in the window
    assert sub.expect(Publish).payload == b"after"


def test_a_v5_run_without_subscribers_is_told_so(raw, uid):
    topic = f"run1none/{uid}"
    pub = raw(5)
    pub.connect(f"pub-{uid}")
    assert pub.publish(topic, b"x", 1).reason_code == rc.NO_MATCHING_SUBSCRIBERS
    _burst(pub, topic, [b"y"] * N, first_id=10)
    acks = _pubacks(pub, N)
    assert [a.packet_id for a in acks] == list(range(10, 10 + N))
    assert all(a.reason_code == rc.NO_MATCHING_SUBSCRIBERS for a in acks)


def test_qos0_and_qos1_mixed_in_one_read_keep_their_order(raw, uid):
    topic = f"run1mix/{uid}"
    sub, pub = _pair(raw, uid, topic, 4)
    pub.publish(topic, b"q1", 1)
    pub.publish(topic, b"q0", 0)
    assert [sub.expect(Publish).payload for _ in range(2)] == [b"q1", b"q0"]
    packets = [
        Publish(topic, f"{i}".encode(), i % 3 % 2, packet_id=(i + 1) if i % 3 % 2 else None)
        for i in range(N)
    ]
    pub.send(*packets)
    got = [sub.expect(Publish) for _ in range(N)]
    assert [p.payload for p in got] == [p.payload for p in packets]
    assert [p.qos for p in got] == [p.qos for p in packets]
    acks = _pubacks(pub, sum(1 for p in packets if p.qos))
    assert [a.packet_id for a in acks] == [p.packet_id for p in packets if p.qos]


def test_pubacks_keep_the_publish_order_behind_a_stored_message(raw, uid):
    """A message for a persistent session is acknowledged once stored; a run on another topic
    read after it is acknowledged after it (MQTT-4.6.0-2), not at once."""
    stored_topic, run_topic = f"run1dur/{uid}/kept", f"run1dur/{uid}/plain"
    keeper = raw(5)
    keeper.connect(f"keeper-{uid}", clean_start=False, properties={"session_expiry_interval": 60})
    keeper.subscribe((stored_topic, SubscriptionOptions(1)))
    sub, pub = _pair(raw, uid, run_topic)
    pub.publish(run_topic, b"x", 1)
    sub.expect(Publish)
    packets = [Publish(stored_topic, b"s", 1, packet_id=1)] + [
        Publish(run_topic, f"{i}".encode(), 1, packet_id=i + 2) for i in range(N)
    ]
    pub.send(*packets)
    acks = _pubacks(pub, N + 1)
    assert [a.packet_id for a in acks] == [p.packet_id for p in packets]
    assert keeper.expect(Publish).payload == b"s"
    assert [sub.expect(Publish).payload for _ in range(N)] == [p.payload for p in packets[1:]]


def test_a_run_in_flight_is_sent_again_to_the_client_that_takes_the_session_over(raw, uid):
    """A run's messages in flight are kept as they came (no message made for each): a client
    that takes the session over gets them again, DUP set, under the same packet ids."""
    topic = f"run1resume/{uid}"
    first = raw(4)
    first.connect(f"sub-{uid}")
    first.subscribe((topic, SubscriptionOptions(1)))
    pub = raw(4)
    pub.connect(f"pub-{uid}")
    pub.publish(topic, b"first", 1)
    acked = first.expect(Publish)
    first.send(Puback(acked.packet_id))
    payloads = [f"r{i}".encode() for i in range(N)]
    _burst(pub, topic, payloads)
    assert len(_pubacks(pub, N)) == N
    sent = [first.expect(Publish) for _ in range(N)]  # and never acknowledged
    again = raw(4)
    assert again.connect(f"sub-{uid}", clean_start=False).session_present
    resent = [again.expect(Publish) for _ in range(N)]
    assert [(p.packet_id, p.payload) for p in resent] == [(p.packet_id, p.payload) for p in sent]
    assert all(p.dup and p.qos == 1 and p.topic == topic for p in resent)
    again.send(*(Puback(p.packet_id) for p in resent))
    pub.publish(topic, b"after", 1)
    assert again.expect(Publish).payload == b"after"
