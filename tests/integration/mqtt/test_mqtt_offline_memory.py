"""An offline persistent session holds no copy of its stored backlog (issue #11): what a
reconnect took from the store and did not send before the client left again stays in the
store only, and the next connect takes it again, in order, nothing lost or doubled."""

from __future__ import annotations

from flowmq_wire.mqtt.packets import Puback, Publish, SubscriptionOptions

from .conftest import RawClient, wait_until

BACKLOG = 20
AWAY = {"session_expiry_interval": 300}


def _session(tb, client_id: str):
    return tb.call(lambda: tb.broker.mqtt.sessions.get(("default", client_id)))


def test_a_session_gone_offline_again_keeps_its_backlog_in_the_store_only(inproc_broker, uid):
    port = inproc_broker.ports["mqtt"]
    client_id, topic = f"away-{uid}", f"away/{uid}"
    sub = RawClient(port, 5)
    sub.connect(client_id, clean_start=False, properties=AWAY)
    sub.subscribe((topic, SubscriptionOptions(qos=1)))
    sub.disconnect()
    wait_until(lambda: not _session(inproc_broker, client_id).online)
    publisher = RawClient(port, 5)
    publisher.connect(f"pub-{uid}")
    for i in range(BACKLOG):
        assert publisher.publish(topic, b"m%d" % i, 1).reason_code == 0
    publisher.close()

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
