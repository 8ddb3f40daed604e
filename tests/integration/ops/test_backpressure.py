"""Backpressure instead of growth (DESIGN.md §13): while durable writes lag — the object
store's PUT held here on an event the test controls — and the batcher's pending bytes pass
``pending_writes_high_water``, publishers on every protocol are paused: the MQTT and AMQP
connections that publish durable messages are no longer read, Kafka's Produce answers carry
``throttle_time_ms`` and its connection is not read, HTTP publish answers 503 with
Retry-After; the broker's pending bytes stay bounded however much the clients want to send;
a subscriber-only connection and a memory-only publisher keep flowing.  When the store drains
everything resumes and every acknowledged message is stored."""

from __future__ import annotations

import logging
import threading
import time
import urllib.error
import urllib.request

import pika
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from flowmq_broker.amqp.connection import AmqpConnection
from flowmq_broker.kafka.connection import KafkaConnection
from flowmq_broker.mqtt.connection import MqttConnection
from tests.fixtures.counting import hold_puts
from tests.fixtures.inprocess import TOKEN, broker_config
from tests.fixtures.threaded_broker import ThreadedBroker
from tests.fixtures.waiting import wait_until
from tests.integration.ops.conftest import TIMEOUT, MqttClient, http

pytestmark = pytest.mark.timeout(180)

HIGH_WATER = 256 * 1024
RECORD = b"k" * 16 * 1024
RECORDS = 1536  # 24 MiB the Kafka producer wants to send while the store is held
# Past the high-water mark: at most what the paused connections had already sent (one read,
# one Kafka request each) besides the flush held at the store.
BOUND = HIGH_WATER + 4 * 1024 * 1024


def held_kinds(tb: ThreadedBroker) -> dict[type, list[object]]:
    kinds: dict[type, list[object]] = {}
    for conn in tb.call(lambda: tb.broker.pressure.held):
        kinds.setdefault(type(conn), []).append(conn)
    return kinds


def reading(tb: ThreadedBroker, client_id: str) -> bool:
    """Whether the broker reads the MQTT connection of ``client_id``."""

    def find() -> bool:
        conn = next(c for c in tb.broker.mqtt.connections if c.client_id == client_id)
        return conn.transport.is_reading()

    return tb.call(find)


def test_publishers_on_every_protocol_pause_while_durable_writes_lag_and_resume(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="flowmq_commit.batcher")
    tb = ThreadedBroker(
        broker_config(tmp_path / "data", node_id="bp", pending_writes_high_water=HIGH_WATER)
    ).start()
    api = f"http://127.0.0.1:{tb.ports['http']}/api/v1"
    producer = consumer = connection = gated = None
    clients: list[MqttClient] = []
    try:
        assert http("POST", f"{api}/streams", {"name": "bp"}, TOKEN)[0] == 201
        subscriber = MqttClient(tb.ports["mqtt"], "live-sub", v5=True)
        clients.append(subscriber)
        subscriber.subscribe("live/#", qos=0)
        talker = MqttClient(tb.ports["mqtt"], "talker")
        clients.append(talker)
        publisher = MqttClient(tb.ports["mqtt"], "durable-pub")
        clients.append(publisher)
        acked: list[int] = []
        publisher.client.on_publish = lambda _c, _u, mid, code, _p: acked.append(mid)
        connection = pika.BlockingConnection(
            pika.ConnectionParameters("127.0.0.1", tb.ports["amqp"])
        )
        channel = connection.channel()
        channel.queue_declare("bp-q", durable=True)
        channel.confirm_delivery()
        assert channel.basic_publish("", "bp-q", b"amqp-before") is None

        # The object store's PUTs now wait for ``gate``.
        gated = tb.call(lambda: hold_puts(tb.broker.batcher))
        tb.call(lambda: setattr(tb.broker.batcher, "pressure_log_quiet_s", 2.0))
        # An HTTP publish taken before the pressure: its flush is the one held at the PUT, so
        # everything after it waits in the batcher (however the clients pipeline).
        plug: list[int] = []
        plug_thread = threading.Thread(
            target=lambda: plug.append(
                http("POST", f"{api}/topics/bp/messages", {"payload": "plug"}, TOKEN)[0]
            )
        )
        plug_thread.start()
        wait_until(lambda: gated.put_waiting.is_set(), TIMEOUT, what="a flush held")

        throttles: list[int] = []
        delivered: list[int] = []
        errors: list[object] = []

        def report(err, msg) -> None:
            if err is not None:
                errors.append(err)
            else:
                delivered.append(msg.offset())

        producer = Producer(
            {"bootstrap.servers": f"127.0.0.1:{tb.ports['kafka']}", "acks": "all",
             "linger.ms": 5, "message.timeout.ms": 120_000, "enable.idempotence": False,
             "throttle_cb": lambda event: throttles.append(event.throttle_time)}
        )  # fmt: skip
        for _ in range(RECORDS):
            producer.produce("bp", RECORD, on_delivery=report)
            producer.poll(0)

        wait_until(lambda: tb.call(lambda: tb.broker.pressure.active), TIMEOUT, what="pressure")
        wait_until(lambda: KafkaConnection in held_kinds(tb), TIMEOUT, what="Kafka paused")

        # MQTT: a QoS 1 PUBLISH to the Stream pauses its connection; what it sends next (even
        # QoS 0 to memory subscribers) is not read, while another client's flows.
        mid = publisher.client.publish("bp", b"mqtt-durable", qos=1).mid
        wait_until(lambda: MqttConnection in held_kinds(tb), TIMEOUT, what="MQTT paused")
        publisher.client.publish("live/paused", b"from the paused publisher", qos=0)
        for n in range(2):  # two round trips: the paused publisher's message would be first
            talker.client.publish("live/talk", f"flowing {n}".encode(), qos=0)
            got = subscriber.messages.get(timeout=TIMEOUT)
            assert (got.topic, got.payload) == ("live/talk", f"flowing {n}".encode())
        assert mid not in acked
        assert not reading(tb, "durable-pub")
        assert reading(tb, "live-sub") and reading(tb, "talker")

        # AMQP: a publish with confirms pauses its connection; no confirm meanwhile.
        amqp_result: list[object] = []
        amqp_thread = threading.Thread(
            target=lambda: amqp_result.append(channel.basic_publish("", "bp-q", b"amqp-held"))
        )
        amqp_thread.start()
        wait_until(lambda: AmqpConnection in held_kinds(tb), TIMEOUT, what="AMQP paused")
        assert amqp_thread.is_alive() and not amqp_result

        # HTTP publish is refused with a hint when to come back.
        request = urllib.request.Request(
            f"{api}/topics/bp/messages", data=b'{"payload": "http"}', method="POST",
            headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        )  # fmt: skip
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=TIMEOUT)
        assert refused.value.code == 503 and refused.value.headers["Retry-After"] == "1"

        # Memory stays bounded although the Kafka producer still has most of its records.
        peak = 0
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            peak = max(peak, tb.call(lambda: tb.broker.batcher.pending_bytes))
            producer.poll(0.05)
        assert HIGH_WATER < peak <= BOUND, peak
        assert len(producer) > RECORDS // 2 and not delivered

        # The store drains: everything resumes, nothing acknowledged is lost.
        tb.call(gated.put_gate.set)
        assert producer.flush(60) == 0
        assert not errors and len(delivered) == RECORDS
        assert throttles and max(throttles) > 0
        wait_until(lambda: mid in acked, TIMEOUT, what="PUBACK after the drain")
        got = subscriber.messages.get(timeout=TIMEOUT)
        assert (got.topic, got.payload) == ("live/paused", b"from the paused publisher")
        amqp_thread.join(TIMEOUT)
        assert amqp_result == [None]  # confirmed (a nack raises)
        wait_until(lambda: not tb.call(lambda: tb.broker.pressure.active), TIMEOUT)
        assert tb.call(lambda: tb.broker.pressure.held) == []

        # One line when the pause starts, one when it ends, however often the 24 MiB that
        # followed took the backlog over the mark again (pauses close together are one).
        def lines() -> list[str]:
            return [r.getMessage() for r in caplog.records if r.name == "flowmq_commit.batcher"]

        wait_until(lambda: any("publishers resumed" in line for line in lines()), TIMEOUT)
        assert sum("publishers paused" in line for line in lines()) == 1, lines()
        assert sum("publishers resumed" in line for line in lines()) == 1, lines()

        consumer = Consumer(
            {"bootstrap.servers": f"127.0.0.1:{tb.ports['kafka']}", "group.id": "bp-check"}
        )
        low, high = consumer.get_watermark_offsets(TopicPartition("bp", 0), timeout=TIMEOUT)
        plug_thread.join(TIMEOUT)
        assert plug == [200]
        assert (low, high) == (0, RECORDS + 2)  # every Kafka record, the MQTT and HTTP ones
        assert sorted(delivered) == sorted(set(delivered))
        bodies = []
        while (got_amqp := channel.basic_get("bp-q", auto_ack=True))[0] is not None:
            bodies.append(got_amqp[2])
        assert bodies == [b"amqp-before", b"amqp-held"]
    finally:
        if gated is not None:  # a failed test must not leave the broker's stop waiting
            tb.call(gated.put_gate.set)
        if consumer is not None:
            consumer.close()
        if connection is not None and connection.is_open:
            connection.close()
        for client in clients:
            client.close()
        tb.stop()


def test_publishers_pause_while_resident_memory_is_over_memory_limit(tmp_path):
    """``memory_limit`` below what the process holds: the MQTT publisher of a durable message
    is no longer read, so its next PUBLISH is not acknowledged, and HTTP publish answers 503;
    raised past it, the publisher resumes and both messages are stored."""
    tb = ThreadedBroker(broker_config(tmp_path / "data", node_id="mem", memory_limit=1)).start()
    api = f"http://127.0.0.1:{tb.ports['http']}/api/v1"
    publisher = None
    try:
        assert http("POST", f"{api}/streams", {"name": "mem"}, TOKEN)[0] == 201
        wait_until(lambda: tb.call(lambda: tb.broker.pressure.active), TIMEOUT, what="pressure")
        publisher = MqttClient(tb.ports["mqtt"], "mem-pub")
        acked: list[int] = []
        publisher.client.on_publish = lambda _c, _u, mid, code, _p: acked.append(mid)
        first = publisher.client.publish("mem", b"first", qos=1).mid
        wait_until(lambda: first in acked, TIMEOUT, what="the first PUBACK")
        assert not reading(tb, "mem-pub")
        second = publisher.client.publish("mem", b"second", qos=1)
        status, body = http("POST", f"{api}/topics/mem/messages", {"payload": "http"}, TOKEN)
        assert status == 503 and body["error"]["code"] == "overloaded", body
        assert second.mid not in acked

        tb.call(lambda: setattr(tb.broker.memory_budget, "limit", 1 << 50))
        wait_until(lambda: second.mid in acked, TIMEOUT, what="the second PUBACK")
        assert reading(tb, "mem-pub") and tb.call(lambda: tb.broker.pressure.held) == []
        status, body = http("GET", f"{api}/streams/mem/messages?limit=10", token=TOKEN)
        assert [r["value"] for r in body["data"]["records"]] == ["first", "second"]
    finally:
        if publisher is not None:
            publisher.close()
        tb.stop()
