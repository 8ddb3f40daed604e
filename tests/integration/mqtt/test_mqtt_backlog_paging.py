"""A reconnecting persistent session gets CONNACK at once, then its stored backlog a page at a
time as its window frees (issue #11).  Before, the reconnect read the whole backlog into the
session's memory before CONNACK: the peak of the broker's memory with a large one, and a late
CONNACK.  The backlog keeps its order before what is published during the drain, and what
the client acknowledged leaves the store as it goes, what it did not survives a crash."""

from __future__ import annotations

from flowmq_broker.mqtt.offline import PAGE_MESSAGES
from flowmq_broker.queues import session_queue_name
from flowmq_core.message import Message
from flowmq_wire.mqtt.packets import Puback, Publish, SubscriptionOptions
from tests.fixtures.broker_process import start_broker

from .conftest import ROLES, RawClient, wait_until

AWAY = {"session_expiry_interval": 600}
BACKLOG = 4 * PAGE_MESSAGES
WINDOW = 10
BURST = 500  # QoS 1 PUBLISH packets sent before their PUBACKs are read


def _away(port: int, client_id: str, topic: str) -> None:
    """A persistent session subscribed to ``topic`` at QoS 1, left offline."""
    sub = RawClient(port, 5)
    sub.connect(client_id, clean_start=False, properties=AWAY)
    sub.subscribe((topic, SubscriptionOptions(qos=1)))
    sub.disconnect()


def _publish(publisher: RawClient, topic: str, payloads: list[bytes]) -> None:
    """Publish ``payloads`` at QoS 1, ``BURST`` at a time; each PUBACKed with success."""
    for start in range(0, len(payloads), BURST):
        burst = payloads[start : start + BURST]
        ids = [publisher.packet_id() for _ in burst]
        publisher.send(
            *(Publish(topic, p, 1, packet_id=i) for p, i in zip(burst, ids, strict=True))
        )
        acks = [publisher.expect(Puback) for _ in burst]
        assert [(a.packet_id, a.reason_code) for a in acks] == [(i, 0) for i in ids]


def _receive(client: RawClient, count: int, ack: bool = True) -> list[Publish]:
    got = []
    for _ in range(count):
        p = client.expect(Publish, timeout=30)
        if ack:
            client.send(Puback(p.packet_id))
        got.append(p)
    return got


def test_a_reconnect_holds_a_page_or_two_of_its_backlog_and_keeps_the_order(inproc_broker, uid):
    tb = inproc_broker
    port = tb.ports["mqtt"]
    client_id, topic = f"long-{uid}", f"long/{uid}"
    _away(port, client_id, topic)
    session = tb.call(lambda: tb.broker.mqtt.sessions[("default", client_id)])
    wait_until(lambda: not session.online)
    publisher = RawClient(port, 5)
    publisher.connect(f"pub-{uid}")
    stored = [b"stored-%d" % i for i in range(BACKLOG)]
    _publish(publisher, topic, stored)

    back = RawClient(port, 5)
    connack = back.connect(
        client_id, clean_start=False, properties={**AWAY, "receive_maximum": WINDOW}
    )
    assert connack.session_present
    got = _receive(back, WINDOW, ack=False)  # the window is full: nothing more is sent

    def in_memory() -> int:
        return tb.call(lambda: len(session.queue) + len(session.inflight))

    # The broker read what fills the window and a page to send next, not the backlog (the
    # old reconnect held all of it here, before CONNACK).
    assert in_memory() <= 2 * PAGE_MESSAGES
    # Published during the drain: stored behind the backlog, sent after it.
    live = [b"live-%d" % i for i in range(20)]
    _publish(publisher, topic, live)
    for p in got:
        back.send(Puback(p.packet_id))
    most = 0
    while len(got) < BACKLOG + len(live):
        got += _receive(back, min(BURST, BACKLOG + len(live) - len(got)))
        most = max(most, in_memory())
    assert most <= 2 * PAGE_MESSAGES + WINDOW
    assert [p.payload for p in got] == stored + live
    back.expect_nothing()
    # Drained: a new message goes out from memory at once.
    assert publisher.publish(topic, b"after", 1).reason_code == 0
    p = back.expect(Publish)
    assert p.payload == b"after"
    back.send(Puback(p.packet_id))
    back.close()
    publisher.close()


def test_a_crash_mid_drain_loses_nothing_unacknowledged_and_resends_little_acknowledged(
    tmp_path, uid
):
    """Read and acknowledged half way, the broker is killed: the restarted one sends the rest
    in order, and of what the client acknowledged at most the last pages' worth again."""
    data = tmp_path / "data"
    client_id, topic = f"crash-{uid}", f"crash/{uid}"
    stored = [b"m%d" % i for i in range(BACKLOG)]
    proc = start_broker(data, *ROLES)
    try:
        port = proc.ports["mqtt"]
        _away(port, client_id, topic)
        publisher = RawClient(port, 5)
        publisher.connect(f"pub-{uid}")
        _publish(publisher, topic, stored)
        publisher.close()
        back = RawClient(port, 5)
        properties = {**AWAY, "receive_maximum": 100}
        assert back.connect(client_id, clean_start=False, properties=properties).session_present
        acked = BACKLOG // 2
        got = _receive(back, acked)
        assert [p.payload for p in got] == stored[:acked]
    finally:
        proc.proc.kill()  # no clean shutdown: only what is durable survives
        proc.proc.wait(10)

    proc = start_broker(data, *ROLES)
    try:
        again = RawClient(proc.ports["mqtt"], 5)
        assert again.connect(client_id, clean_start=False, properties=AWAY).session_present
        first = again.expect(Publish, timeout=30)
        start = stored.index(first.payload)
        # The acknowledged ones were dropped from the store as the drain went on.
        assert 0 < start <= acked
        again.send(Puback(first.packet_id))
        rest = _receive(again, BACKLOG - start - 1)
        assert [first.payload] + [p.payload for p in rest] == stored[start:]
        again.expect_nothing()
        again.close()
        assert "Traceback" not in "".join(proc.output)
    finally:
        proc.stop()


def test_an_idle_sessions_purge_leaves_what_was_read_while_it_ran(inproc_broker, uid):
    """The purge of a connected, idle session's queue drops what the session held when it
    began, not what a drain read into it meanwhile (a reconnect to the same node): those
    messages are not sent yet, and dropped from the store they were lost if the client left
    again before they went out."""
    tb = inproc_broker
    client_id = f"idle-{uid}"
    client = RawClient(tb.ports["mqtt"], 5)
    client.connect(client_id, clean_start=False, properties=AWAY)
    client.subscribe((f"idle/{uid}", SubscriptionOptions(qos=1)))
    offline = tb.broker.mqtt.offline
    engine = offline.engine
    session = tb.call(lambda: tb.broker.mqtt.sessions[("default", client_id)])
    queue = session_queue_name(client_id)
    read_meanwhile: list[int] = []
    count = engine.ready_count

    async def count_then_read(namespace: str, name: str) -> int:
        ready = await count(namespace, name)
        # Stored for the session after the count (by another node, around a takeover), and
        # read by its drain into what it holds, before the purge.
        message = Message(f"idle/{uid}", b"not sent yet", qos=1)
        stored = await engine.enqueue(namespace, name, message, offline.options)
        offline._held.setdefault(session, set()).add(stored.seq)
        read_meanwhile.append(stored.seq)
        return ready

    # What the session holds (its copies: none left to purge here).
    tb.call(lambda: offline._held.setdefault(session, set()))
    engine.ready_count = count_then_read
    try:
        assert tb.run(offline._purge_if_all_held(session))
    finally:
        del engine.ready_count
    left = tb.run(engine.peek("default", queue, 10))
    assert [(seq, message.payload) for seq, _, message in left] == [
        (read_meanwhile[0], b"not sent yet")
    ]
    assert tb.call(lambda: offline._held.get(session)) == set(read_meanwhile)
    client.disconnect()
