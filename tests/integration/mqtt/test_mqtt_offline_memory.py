"""An offline persistent session holds no copy of its stored backlog (issue #11): what a
reconnect took from the store and did not send before the client left again stays in the
store only, and the next connect takes it again, in order, nothing lost or doubled.  A will
fanned out to offline sessions costs no task per store while the stores wait for a flush."""

from __future__ import annotations

import asyncio

from flowmq_broker.mqtt.delivery import message_from
from flowmq_wire.mqtt.packets import Connect, Pingreq, Puback, Publish, SubscriptionOptions
from tests.fixtures.counting import hold_puts, hold_queue_gets

from .conftest import RawClient, wait_until

BACKLOG = 20
AWAY = {"session_expiry_interval": 300}


def _session(tb, client_id: str):
    return tb.call(lambda: tb.broker.mqtt.sessions.get(("default", client_id)))


def _away_with_backlog(tb, client_id: str, topic: str) -> RawClient:
    """A persistent session subscribed to ``topic`` and offline, with ``BACKLOG`` QoS 1
    messages stored for it; the publisher, still connected."""
    port = tb.ports["mqtt"]
    sub = RawClient(port, 5)
    sub.connect(client_id, clean_start=False, properties=AWAY)
    sub.subscribe((topic, SubscriptionOptions(qos=1)))
    sub.disconnect()
    wait_until(lambda: not _session(tb, client_id).online)
    publisher = RawClient(port, 5)
    publisher.connect(f"pub-{client_id}")
    for i in range(BACKLOG):
        assert publisher.publish(topic, b"m%d" % i, 1).reason_code == 0
    return publisher


def _acked_payloads(client: RawClient, count: int) -> list[bytes]:
    """The payloads of the next ``count`` PUBLISH packets, each acknowledged."""
    got = []
    for _ in range(count):
        p = client.expect(Publish)
        client.send(Puback(p.packet_id))
        got.append(p.payload)
    return got


def test_a_session_gone_offline_again_keeps_its_backlog_in_the_store_only(inproc_broker, uid):
    port = inproc_broker.ports["mqtt"]
    client_id, topic = f"away-{uid}", f"away/{uid}"
    _away_with_backlog(inproc_broker, client_id, topic).close()

    # Back with a window of one: the backlog is taken, one message goes out, then it leaves.
    slow = RawClient(port, 5)
    slow.connect(client_id, clean_start=False, properties={**AWAY, "receive_maximum": 1})
    first = slow.expect(Publish)
    assert first.payload == b"m0"
    session = _session(inproc_broker, client_id)

    def held() -> tuple[int, int]:
        return inproc_broker.call(lambda: (len(session.queue), len(session.inflight)))

    assert held() == (BACKLOG - 1, 1)
    slow.kill()
    wait_until(lambda: not session.online)
    assert held() == (0, 1)  # the rest in the store only; the one sent is resent as it was

    back = RawClient(port, 5)
    assert back.connect(client_id, clean_start=False, properties=AWAY).session_present
    got = []
    while len(got) < BACKLOG:
        p = back.expect(Publish)
        back.send(Puback(p.packet_id))
        got.append(p)
    assert got[0].dup and got[0].packet_id == first.packet_id
    assert [p.payload for p in got] == [b"m%d" % i for i in range(BACKLOG)]
    back.expect_nothing()
    back.close()


def test_a_will_fanned_out_to_offline_sessions_starts_no_task_per_store(inproc_broker, uid):
    port = inproc_broker.ports["mqtt"]
    topic = f"gone/{uid}"
    away = [f"away-{uid}-{i}" for i in range(20)]
    for client_id in away:
        sub = RawClient(port, 5)
        sub.connect(client_id, clean_start=False, properties=AWAY)
        sub.subscribe((f"gone/{uid}/#", SubscriptionOptions(qos=1)))
        sub.disconnect()
    wait_until(lambda: not any(_session(inproc_broker, c).online for c in away))
    publisher = RawClient(port, 5)
    publisher.connect(f"pub-{uid}")
    connection = _session(inproc_broker, f"pub-{uid}").connection

    def publish_will() -> int:
        """The will as the broker publishes it; the tasks that started meanwhile."""
        before = len(asyncio.all_tasks())
        will = message_from(f"{topic}/will", b"bye", 1, False, None, f"pub-{uid}")
        connection.server_publish("default", will)
        return len(asyncio.all_tasks()) - before

    assert inproc_broker.call(publish_will) == 0
    publisher.close()
    back = RawClient(port, 5)
    assert back.connect(away[-1], clean_start=False, properties=AWAY).session_present
    assert back.expect(Publish).payload == b"bye"  # stored all the same
    back.close()


def test_a_stored_message_goes_out_with_its_subscription_identifier(inproc_broker, uid):
    """Taken from the store, a message is queued as read unless it carries identifiers:
    those it goes out with, and no other."""
    port = inproc_broker.ports["mqtt"]
    topic = f"ids/{uid}"
    clients = {f"ids-{uid}": 7, f"plain-{uid}": None}
    for client_id, sub_id in clients.items():
        sub = RawClient(port, 5)
        sub.connect(client_id, clean_start=False, properties=AWAY)
        sub.subscribe((topic, SubscriptionOptions(qos=1)), sub_id=sub_id)
        sub.disconnect()
    wait_until(lambda: not any(_session(inproc_broker, c).online for c in clients))
    publisher = RawClient(port, 5)
    publisher.connect(f"pub-{uid}")
    assert publisher.publish(topic, b"kept", 1).reason_code == 0
    publisher.close()
    for client_id, sub_id in clients.items():
        back = RawClient(port, 5)
        assert back.connect(client_id, clean_start=False, properties=AWAY).session_present
        got = back.expect(Publish)
        assert got.payload == b"kept"
        assert got.properties.get("subscription_identifier") == ([sub_id] if sub_id else None)
        back.send(Puback(got.packet_id))
        back.close()


def test_a_client_closed_before_connack_leaves_its_backlog_in_the_store_only(inproc_broker, uid):
    """A resumed CONNECT whose client is closed before CONNACK (here: more packets than
    ``mqtt_max_held_packets`` behind it), while a store for its session is still on its way,
    leaves nothing of the backlog in the offline session's memory and the session not
    draining; the next connect gets all of it, the late store too, in order."""
    tb = inproc_broker
    port = tb.ports["mqtt"]
    client_id, topic = f"gone-{uid}", f"gone/{uid}"
    key = ("default", client_id)
    publisher = _away_with_backlog(tb, client_id, topic)
    gated = tb.call(lambda: hold_puts(tb.broker.batcher))
    publisher.send(Publish(topic, b"last", 1, packet_id=BACKLOG + 1))  # its store is held
    session = _session(tb, client_id)
    wait_until(lambda: tb.call(lambda: bool(session.pending_stores)))

    too_much = RawClient(port, 5)
    held = tb.call(lambda: tb.broker.mqtt.max_held_packets)
    too_much.send(
        Connect(client_id, False, 60, properties=AWAY, protocol_level=5),
        *([Pingreq()] * (held + 1)),
    )
    too_much.wait_closed()
    tb.call(gated.put_gate.set)
    assert publisher.expect(Puback).packet_id == BACKLOG + 1
    wait_until(lambda: tb.call(lambda: not tb.broker.mqtt.connecting(key)))
    assert tb.call(lambda: (session.online, session.draining, len(session.queue))) == (
        False,
        False,
        0,
    )
    publisher.close()

    back = RawClient(port, 5)
    assert back.connect(client_id, clean_start=False, properties=AWAY).session_present
    got = _acked_payloads(back, BACKLOG + 1)
    assert got == [b"m%d" % i for i in range(BACKLOG)] + [b"last"]
    back.expect_nothing()
    back.close()


def test_a_reconnect_while_the_last_connections_page_is_read_gets_the_backlog(inproc_broker, uid):
    """The client leaves while a page of its backlog is being read for it and comes back
    before the read ends: that page is dropped (read for a connection gone), and the new
    connection's drain starts once it is (before, it waited for a wake-up that never came,
    and the backlog stayed stored: the pause test lost 325 acknowledged messages so)."""
    tb = inproc_broker
    port = tb.ports["mqtt"]
    client_id, topic = f"again-{uid}", f"again/{uid}"
    _away_with_backlog(tb, client_id, topic).close()
    engine = tb.broker.queues.engine
    gated = tb.call(lambda: hold_queue_gets(engine))
    first = RawClient(port, 5)
    assert first.connect(client_id, clean_start=False, properties=AWAY).session_present
    wait_until(lambda: tb.call(gated.get_waiting.is_set))  # its first page is on its way
    first.kill()
    session = _session(tb, client_id)
    wait_until(lambda: not session.online)
    back = RawClient(port, 5)
    assert back.connect(client_id, clean_start=False, properties=AWAY).session_present
    tb.call(gated.get_gate.set)
    got = _acked_payloads(back, BACKLOG)
    assert got == [b"m%d" % i for i in range(BACKLOG)]
    back.expect_nothing()
    back.close()
