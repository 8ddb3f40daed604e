"""SIGKILL of the broker after confirms: on restart every confirmed message is consumed, and
none acknowledged before the crash is delivered again (leases of the dead broker expire and
its in-flight messages come back, marked redelivered)."""

from __future__ import annotations

import pika
import pytest

from tests.fixtures.broker_process import start_broker
from tests.integration.amqp.conftest import connect, drain

pytestmark = pytest.mark.timeout(90)


def test_confirmed_messages_survive_sigkill(tmp_path) -> None:
    data_dir = tmp_path / "data"
    proc = start_broker(data_dir)
    try:
        conn = connect(proc.ports["amqp"])
        ch = conn.channel()
        ch.queue_declare("crash", durable=True)
        ch.confirm_delivery()
        for i in range(200):
            ch.basic_publish("", "crash", b"c%d" % i, pika.BasicProperties(delivery_mode=2))
        acked = []
        for _ in range(50):  # Basic.Get: nothing else gets claimed (and requeued) meanwhile
            method, _, body = ch.basic_get("crash")
            ch.basic_ack(method.delivery_tag)
            acked.append(body)
        consumer = conn.channel()
        consumer.basic_qos(prefetch_count=20)
        held = [body for _, _, body in drain(consumer, "crash", 20, ack=False)]
        assert len(acked) == 50 and len(held) == 20
        conn.process_data_events(0.5)  # the acks reach the meta store within a round
    finally:
        proc.proc.kill()
        proc.proc.wait(10)
    proc = start_broker(data_dir)
    try:
        ch = connect(proc.ports["amqp"]).channel()
        # The dead broker's leases (10 s) must run out before its 20 come back.
        got = drain(ch, "crash", 150, timeout=30)
        bodies = [body for _, _, body in got]
        assert sorted(bodies) == sorted({b"c%d" % i for i in range(200)} - set(acked))
        assert not set(bodies) & set(acked)
        redelivered = {body for m, _, body in got if m.redelivered}
        # Everything delivered and unacked comes back marked; the broker also leases up to a
        # second prefetch window ahead (flowmq_queue.engine.AHEAD), which comes back too.
        assert set(held) <= redelivered and len(redelivered) <= 2 * 20
    finally:
        proc.stop()
