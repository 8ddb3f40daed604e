"""Subscription options, identifiers, overlapping and shared subscriptions, `$` topics,
unsubscribe, filter validation."""

from __future__ import annotations

import pytest

from flowmq_wire.mqtt.packets import (
    Disconnect,
    Publish,
    Suback,
    Subscribe,
    SubscriptionOptions,
    Unsuback,
    Unsubscribe,
)

from .conftest import QUIET, Closed, connected, subscribed


# --- no local ------------------------------------------------------------------------------
def test_no_local(paho, uid):
    topic = f"nolocal/{uid}"
    me = connected(paho, f"me-{uid}", v5=True)
    me.subscribe(topic, 1, no_local=True)
    other = subscribed(paho, f"other-{uid}", topic, 1, v5=True)

    me.publish(topic, b"mine", 1)
    assert other.get().payload == b"mine"  # others get it
    me.expect_none()  # not echoed back to its publisher
    other.publish(topic, b"theirs", 1)
    assert me.get().payload == b"theirs"


def test_without_no_local_own_messages_come_back(paho, uid):
    topic = f"local/{uid}"
    me = connected(paho, f"me-{uid}", v5=True)
    me.subscribe(topic, 1, no_local=False)
    me.publish(topic, b"echo", 1)
    assert me.get().payload == b"echo"


def test_no_local_only_on_the_subscription_that_set_it(paho, uid):
    me = connected(paho, f"me-{uid}", v5=True)
    me.subscribe(f"nl/{uid}/a", 1, no_local=True)
    me.subscribe(f"nl/{uid}/+", 1, no_local=False)
    me.publish(f"nl/{uid}/a", b"x", 1)
    m = me.get()  # delivered through the second subscription
    assert m.payload == b"x"
    me.expect_none()


# --- subscription identifiers ---------------------------------------------------------------
def test_subscription_identifier_in_publish(paho, uid):
    sub = connected(paho, f"sub-{uid}", v5=True)
    sub.subscribe(f"sid/{uid}/a", 1, sub_id=42)
    sub.subscribe(f"sid/{uid}/b", 1)  # no identifier
    pub = connected(paho, f"pub-{uid}")
    pub.publish(f"sid/{uid}/a", b"a", 1)
    pub.publish(f"sid/{uid}/b", b"b", 1)
    got = {m.payload: m.properties for m in sub.expect(2)}
    assert got[b"a"].SubscriptionIdentifier == [42]
    assert not hasattr(got[b"b"], "SubscriptionIdentifier")


def test_overlapping_subscriptions_deliver_once_with_all_identifiers(paho, uid):
    sub = connected(paho, f"sub-{uid}", v5=True)
    sub.subscribe(f"ovl/{uid}/+", 0, sub_id=5)
    sub.subscribe(f"ovl/{uid}/#", 2, sub_id=9)
    pub = connected(paho, f"pub-{uid}")
    pub.publish(f"ovl/{uid}/x", b"both", 2)
    m = sub.get()
    assert m.payload == b"both"
    assert sorted(m.properties.SubscriptionIdentifier) == [5, 9]
    assert m.qos == 2  # the maximum of the matching subscriptions' QoS (MQTT 5 §3.3.4)
    sub.expect_none()


def test_subscription_identifier_replaced_on_resubscribe(paho, uid):
    sub = connected(paho, f"sub-{uid}", v5=True)
    sub.subscribe(f"resid/{uid}", 1, sub_id=1)
    sub.subscribe(f"resid/{uid}", 1, sub_id=2)
    pub = connected(paho, f"pub-{uid}")
    pub.publish(f"resid/{uid}", b"x", 1)
    m = sub.get()
    assert m.properties.SubscriptionIdentifier == [2]
    sub.expect_none()


def test_subscription_identifier_on_retained_delivery(paho, uid):
    pub = connected(paho, f"pub-{uid}")
    pub.publish(f"sidret/{uid}", b"r", 1, retain=True)
    sub = connected(paho, f"sub-{uid}", v5=True)
    sub.subscribe(f"sidret/{uid}", 1, sub_id=77)
    m = sub.get()
    assert m.retain and m.properties.SubscriptionIdentifier == [77]


def test_overlapping_subscriptions_v311_one_copy_at_max_qos(paho, uid):
    sub = subscribed(paho, f"sub-{uid}", f"ovl4/{uid}/+", 0, v5=False)
    sub.subscribe(f"ovl4/{uid}/#", 1)
    pub = connected(paho, f"pub-{uid}", v5=False)
    pub.publish(f"ovl4/{uid}/x", b"x", 1)
    m = sub.get()
    assert (m.payload, m.qos) == (b"x", 1)
    sub.expect_none()


def test_resubscribe_replaces_options(paho, uid):
    topic = f"resub/{uid}"
    sub = connected(paho, f"sub-{uid}", v5=True)
    assert sub.subscribe(topic, 2) == [2]
    assert sub.subscribe(topic, 0) == [0]
    pub = connected(paho, f"pub-{uid}")
    pub.publish(topic, b"x", 2)
    m = sub.get()
    assert m.qos == 0  # the new subscription's QoS, one copy
    sub.expect_none()


# --- shared subscriptions -------------------------------------------------------------------
@pytest.mark.parametrize("v5", [False, True], ids=["v311", "v5"])
def test_shared_subscription_delivers_each_message_to_one_member(paho, uid, v5):
    group_filter = f"$share/workers/jobs/{uid}/#"
    members = [paho(f"m{i}-{uid}", v5=v5) for i in range(2)]
    for m in members:
        m.connect()
        assert m.subscribe(group_filter, 1) == [1]
    plain = subscribed(paho, f"plain-{uid}", f"jobs/{uid}/#", 1, v5=v5)

    pub = connected(paho, f"pub-{uid}", v5=True)
    n = 20
    for i in range(n):
        pub.publish(f"jobs/{uid}/{i % 3}", str(i).encode(), 1)

    assert sorted(int(m.payload) for m in plain.expect(n)) == list(range(n))
    got = [[int(x.payload) for x in member.drain()] for member in members]
    assert sorted(got[0] + got[1]) == list(range(n)), got  # each exactly once
    assert got[0] and got[1], f"one member got everything: {got}"
    for member in members:
        for x in member.drain(0.05):
            raise AssertionError(f"late duplicate {x.payload!r}")


def test_two_shared_groups_each_get_every_message(paho, uid):
    subs = {}
    for group in ("g1", "g2"):
        c = paho(f"{group}-{uid}", v5=True)
        c.connect()
        c.subscribe(f"$share/{group}/sg/{uid}", 1)
        subs[group] = c
    pub = connected(paho, f"pub-{uid}")
    for i in range(4):
        pub.publish(f"sg/{uid}", str(i).encode(), 1)
    for c in subs.values():
        assert sorted(m.payload for m in c.expect(4)) == [b"0", b"1", b"2", b"3"]


def test_shared_member_leaving_leaves_the_rest(paho, uid):
    a = subscribed(paho, f"a-{uid}", f"$share/g/leave/{uid}", 1, v5=True)
    b = subscribed(paho, f"b-{uid}", f"$share/g/leave/{uid}", 1, v5=True)
    assert a.unsubscribe(f"$share/g/leave/{uid}") == [0]
    pub = connected(paho, f"pub-{uid}")
    for i in range(4):
        pub.publish(f"leave/{uid}", str(i).encode(), 1)
    assert len(b.expect(4)) == 4
    a.expect_none()


def test_a_leaving_members_unacknowledged_messages_go_to_another_member(raw, paho, uid):
    """MQTT 5 §4.8.2: when a member's session ends with QoS 1 messages it never acknowledged,
    the Server SHOULD send them to another member."""
    group_filter = f"$share/g/orphan/{uid}"
    silent = raw(5)
    silent.connect(f"silent-{uid}")
    silent.subscribe((group_filter, SubscriptionOptions(1)))
    pub = connected(paho, f"pub-{uid}")
    for i in range(4):  # the only member yet: it gets all four, and acknowledges none
        pub.publish(f"orphan/{uid}", str(i).encode(), 1)
    assert [silent.expect(Publish).payload for _ in range(4)] == [b"0", b"1", b"2", b"3"]
    other = subscribed(paho, f"other-{uid}", group_filter, 1, v5=True)
    silent.kill()  # its session (expiry 0) ends with the connection
    assert sorted(m.payload for m in other.expect(4)) == [b"0", b"1", b"2", b"3"]
    other.expect_none()


def test_shared_subscription_with_no_local_is_protocol_error(raw, uid):
    """MQTT 5 §3.8.3.1: No Local on a shared subscription is a Protocol Error."""
    c = raw(5)
    c.connect(f"nlshared-{uid}")
    c.send(Subscribe(1, [(f"$share/g/x/{uid}", SubscriptionOptions(1, no_local=True))]))
    got = c.wait_closed()
    assert isinstance(got[-1], Disconnect) and got[-1].reason_code == 0x82


# --- $ topics -------------------------------------------------------------------------------
def test_dollar_topics_not_matched_by_leading_wildcards(paho, uid):
    """`#` and `+/...` do not match a topic starting with `$` (like `$SYS/...`); a filter
    naming the `$` level does. (A `$internal` topic rather than `$SYS` itself: many brokers
    keep `$SYS` for their own messages.)"""
    hash_sub = subscribed(paho, f"hash-{uid}", "#", 0, v5=True)
    plus_sub = subscribed(paho, f"plus-{uid}", f"+/{uid}", 0, v5=True)
    dollar_sub = subscribed(paho, f"dollar-{uid}", "$internal/#", 0, v5=True)

    pub = connected(paho, f"pub-{uid}", v5=True)
    pub.publish(f"$internal/{uid}", b"system", 1)
    pub.publish(f"plain/{uid}", b"plain", 1)

    def mine(c):
        return [m.payload for m in c.drain() if uid in m.topic]

    assert mine(hash_sub) == [b"plain"]
    assert mine(plus_sub) == [b"plain"]
    assert mine(dollar_sub) == [b"system"]


# --- unsubscribe ----------------------------------------------------------------------------
def test_unsubscribe_v5_reason_codes_and_effect(paho, uid):
    topic = f"unsub/{uid}"
    sub = subscribed(paho, f"sub-{uid}", topic, 1, v5=True)
    assert sub.unsubscribe(topic, f"never/{uid}") == [0x00, 0x11]
    pub = connected(paho, f"pub-{uid}")
    pub.publish(topic, b"x", 1)
    sub.expect_none()


def test_unsubscribe_v311(raw, uid):
    topic = f"unsub4/{uid}"
    c = raw(4)
    c.connect(f"sub-{uid}")
    c.subscribe(topic)
    pid = c.packet_id()
    c.send(Unsubscribe(pid, [topic]))
    assert c.expect(Unsuback).packet_id == pid
    c.publish(topic, b"x")
    c.expect_nothing()


def test_unsubscribe_keeps_other_subscriptions(paho, uid):
    sub = subscribed(paho, f"sub-{uid}", f"keep/{uid}/a", 1, v5=True)
    sub.subscribe(f"keep/{uid}/b", 1)
    sub.unsubscribe(f"keep/{uid}/a")
    pub = connected(paho, f"pub-{uid}")
    pub.publish(f"keep/{uid}/a", b"a", 1)
    pub.publish(f"keep/{uid}/b", b"b", 1)
    assert sub.get().payload == b"b"
    sub.expect_none()


# --- filters --------------------------------------------------------------------------------
@pytest.mark.parametrize("level", [4, 5])
def test_invalid_filters_are_refused(raw, uid, level):
    """An invalid filter is refused: per entry in the SUBACK (0x8F v5, 0x80 3.1.1), the valid
    entries of the same SUBSCRIBE being granted — or, as Mosquitto does, by treating the
    packet as malformed and closing the connection (v5: DISCONNECT first)."""
    c = raw(level)
    c.connect(f"filters-{uid}")
    c.send(
        Subscribe(
            1,
            [
                (f"ok/{uid}/#", SubscriptionOptions(1)),
                (f"bad/#/{uid}", SubscriptionOptions(1)),
                (f"bad/a+/{uid}", SubscriptionOptions(1)),
                ("$share/onlygroup", SubscriptionOptions(1)),  # no filter after the group
                (f"$share/g+/x/{uid}", SubscriptionOptions(1)),  # wildcard in the group name
                (f"ok/+/{uid}", SubscriptionOptions(2)),
            ],
        )
    )
    try:
        answer = c.recv()
    except Closed:
        assert level == 4
        return
    if isinstance(answer, Disconnect):
        assert level == 5 and answer.reason_code in (0x81, 0x82, 0x8F)
        c.wait_closed()
        return
    assert isinstance(answer, Suback), answer
    bad = 0x8F if level == 5 else 0x80
    assert answer.reason_codes == [1, bad, bad, bad, bad, 2]
    # The valid ones work.
    c.publish(f"ok/{uid}/x", b"x")
    assert c.expect(Publish).payload == b"x"


def test_wildcard_matching(paho, uid):
    sub = subscribed(paho, f"sub-{uid}", f"wc/{uid}/+/end", 0, v5=True)
    sub.subscribe(f"wc/{uid}/deep/#", 0)
    pub = connected(paho, f"pub-{uid}")
    for t in ("a/end", "a/b/end", "deep", "deep/x/y", "a/end/more"):
        pub.publish(f"wc/{uid}/{t}", t.encode(), 1)
    got = sorted(m.payload for m in sub.drain(QUIET))
    # "deep" matches deep/# (# includes the parent level).
    assert got == sorted([b"a/end", b"deep", b"deep/x/y"])
