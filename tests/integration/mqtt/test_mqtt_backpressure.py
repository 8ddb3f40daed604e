"""Backpressure within one read (issue #11): a read of QoS 1 PUBLISH packets fanned out to
offline persistent sessions stops at the publish that takes the chunks waiting for a flush
past ``pending_writes_high_water_chunks``; the rest of the read is handled once they are
committed, in order, each PUBLISH acknowledged and stored once.  (Handled to its end, one
read took the chunks waiting past the mark many times over: the MQTT fuzz run's growth.)"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from flowmq_wire.mqtt.packets import Puback, Publish, SubscriptionOptions
from tests.fixtures.brokers import logged_errors
from tests.fixtures.counting import hold_puts
from tests.fixtures.inprocess import broker_config
from tests.fixtures.threaded_broker import ThreadedBroker

from .conftest import TIMEOUT, RawClient, wait_until

MARK = 40  # chunks
SESSIONS = 8  # offline sessions every PUBLISH is stored for: 8 chunks each
PUBLISHES = 30  # in one write: 240 chunks, six times the mark
AWAY = {"session_expiry_interval": 300}


@pytest.fixture
def marked_broker(tmp_path, caplog) -> Iterator[ThreadedBroker]:
    config = broker_config(
        tmp_path / "data",
        node_id="mqtt-pressure",
        roles=["mqtt", "admin"],
        pending_writes_high_water_chunks=MARK,
    )
    tb = ThreadedBroker(config, timeout=TIMEOUT).start()
    yield tb
    errors = logged_errors(caplog)
    tb.stop()
    assert not errors, errors


def test_a_read_of_publishes_to_offline_sessions_stops_at_the_chunk_mark(marked_broker, uid):
    tb = marked_broker
    port = tb.ports["mqtt"]
    topic = f"fan/{uid}"
    away = [f"away-{uid}-{i}" for i in range(SESSIONS)]
    for client_id in away:
        sub = RawClient(port, 5)
        sub.connect(client_id, clean_start=False, properties=AWAY)
        sub.subscribe((topic, SubscriptionOptions(qos=1)))
        sub.disconnect()
    sessions = tb.broker.mqtt.sessions
    wait_until(lambda: tb.call(lambda: not any(sessions[("default", c)].online for c in away)))
    gated = tb.call(lambda: hold_puts(tb.broker.batcher))
    publisher = RawClient(port, 5)
    publisher.connect(f"pub-{uid}")
    publisher.send(*(Publish(topic, b"m%d" % i, 1, packet_id=i + 1) for i in range(PUBLISHES)))

    wait_until(lambda: tb.call(lambda: tb.broker.pressure.held))
    # The PUBLISH that passed the mark is the last one handled: its stores, no more.
    assert tb.call(lambda: tb.broker.batcher.unsettled_chunks) <= MARK + SESSIONS
    publisher.expect_nothing()  # nothing is acknowledged before it is stored

    tb.call(gated.put_gate.set)
    acks = [publisher.expect(Puback) for _ in range(PUBLISHES)]
    assert [(a.packet_id, a.reason_code) for a in acks] == [(i + 1, 0) for i in range(PUBLISHES)]
    assert tb.call(lambda: tb.broker.batcher.unsettled_chunks) == 0
    publisher.close()

    back = RawClient(port, 5)
    assert back.connect(away[0], clean_start=False, properties=AWAY).session_present
    got = []
    while len(got) < PUBLISHES:
        p = back.expect(Publish)
        back.send(Puback(p.packet_id))
        got.append(p.payload)
    assert got == [b"m%d" % i for i in range(PUBLISHES)]
    back.expect_nothing()
    back.close()
