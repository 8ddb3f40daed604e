"""A storage outage (DESIGN.md §13): while the object store is unusable, durable publishes are
refused at once with each protocol's own error — MQTT v5 PUBACK 0x80, Kafka
KAFKA_STORAGE_ERROR, AMQP nack, HTTP 503 — while memory Subscriptions keep flowing; when the
store returns, writes recover by themselves, and exactly the acknowledged messages are stored.

Root ignores chmod, so the objects directory is replaced by a file: every put fails as it
would on a dead disk."""

from __future__ import annotations

import os
import queue
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import paho.mqtt.client as mqtt
import pika
import pika.exceptions
import pytest
from confluent_kafka import KafkaError, Producer
from paho.mqtt.enums import CallbackAPIVersion

from tests.fixtures.broker_process import start_broker
from tests.fixtures.meta_lock import meta_store_locked
from tests.fixtures.waiting import wait_until
from tests.integration.ops.conftest import TIMEOUT, MqttClient, http

pytestmark = pytest.mark.timeout(120)

UNSPECIFIED_ERROR = 0x80


class Publisher:
    """A paho v5 QoS 1 publisher that records each PUBACK's reason code."""

    def __init__(self, port: int) -> None:
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=f"pub-{uuid.uuid4().hex[:8]}",
            protocol=mqtt.MQTTv5,
        )  # fmt: skip
        self.acks: queue.Queue[tuple[int, int]] = queue.Queue()
        connected = threading.Event()
        self.client.on_connect = lambda *a: connected.set()
        self.client.on_publish = lambda _c, _u, mid, code, _p: self.acks.put((mid, code.value))
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        assert connected.wait(TIMEOUT), "no CONNACK"

    def publish(self, topic: str, payload: bytes, retain: bool = False) -> int:
        """The PUBACK reason code."""
        info = self.client.publish(topic, payload, qos=1, retain=retain)
        mid, code = self.acks.get(timeout=TIMEOUT)
        assert mid == info.mid
        return code

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def kafka_produce(port: int, topic: str, value: bytes) -> KafkaError | None:
    """One produce, no retries: the delivery report's error (None: stored)."""
    producer = Producer(
        {"bootstrap.servers": f"127.0.0.1:{port}", "retries": 0, "acks": "all",
         "enable.idempotence": False, "message.timeout.ms": 10_000}
    )  # fmt: skip
    reports: list[KafkaError | None] = []
    producer.produce(topic, value, on_delivery=lambda err, _msg: reports.append(err))
    assert producer.flush(15) == 0
    return reports[0]


def amqp_publish(channel, queue_name: str, body: bytes) -> bool:
    """A publish with confirms: True when acknowledged, False when nacked."""
    try:
        channel.basic_publish("", queue_name, body, pika.BasicProperties(delivery_mode=2))
    except pika.exceptions.NackError:
        return False
    return True


def stream_values(broker, stream: str) -> list[str]:
    status, body = http(
        "GET", f"{broker.http}/api/v1/streams/{stream}/messages?limit=1000", token=broker.token
    )
    assert status == 200, body
    return [record["value"] for record in body["data"]["records"]]


def recovers_with_exactly_the_acknowledged(
    broker, stream: str, publisher: Publisher, channel, queue_name: str
) -> None:
    """After an outage: durable writes recover by themselves, and the stream holds exactly
    what was acknowledged (one MQTT and one Kafka record before the outage, none during)."""
    api = f"{broker.http}/api/v1"
    wait_until(
        lambda: http("POST", f"{api}/topics/{stream}/messages", {"payload": "http-after"},
                     broker.token)[0] == 200,
        20, step=0.2, what="durable writes to recover",
    )  # fmt: skip
    assert publisher.publish(stream, b"mqtt-after") == 0
    assert kafka_produce(broker.ports["kafka"], stream, b"kafka-after") is None
    assert amqp_publish(channel, queue_name, b"amqp-after")
    stored = stream_values(broker, stream)
    assert sorted(stored) == sorted(
        ["mqtt-before", "kafka-before", "http-after", "mqtt-after", "kafka-after"]
    )


def amqp_stored(channel, queue_name: str) -> list[bytes]:
    """The bodies in ``queue_name``, taken."""
    bodies = []
    while (got := channel.basic_get(queue_name, auto_ack=True))[0] is not None:
        bodies.append(got[2])
    return bodies


def test_durable_writes_fail_fast_during_an_object_store_outage_and_recover(tmp_path):
    objects = tmp_path / "objects"
    broker = start_broker(tmp_path / "data", "--objects", objects.as_uri())
    api = f"{broker.http}/api/v1"
    stream, queue_name = "outage", "outage-q"
    assert http("POST", f"{api}/streams", {"name": stream}, broker.token)[0] == 201
    publisher = Publisher(broker.ports["mqtt"])
    subscriber = MqttClient(broker.ports["mqtt"], "live-sub")
    subscriber.subscribe("live/#", qos=0)
    connection = pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", broker.ports["amqp"])
    )
    channel = connection.channel()
    channel.queue_declare(queue_name, durable=True)
    channel.confirm_delivery()
    try:
        assert publisher.publish(stream, b"mqtt-before") == 0
        assert kafka_produce(broker.ports["kafka"], stream, b"kafka-before") is None
        assert amqp_publish(channel, queue_name, b"amqp-before")

        moved = tmp_path / "objects.moved"
        os.rename(objects, moved)
        objects.write_text("not a directory")

        started = time.monotonic()
        status, body = http("POST", f"{api}/topics/{stream}/messages", {"payload": "http-down"},
                            broker.token)  # fmt: skip
        assert status == 503 and body["error"]["code"] == "store_unavailable", body
        assert publisher.publish(stream, b"mqtt-down") == UNSPECIFIED_ERROR
        error = kafka_produce(broker.ports["kafka"], stream, b"kafka-down")
        assert error is not None and error.code() == KafkaError.KAFKA_STORAGE_ERROR
        assert not amqp_publish(channel, queue_name, b"amqp-down")
        # Refused fast: no protocol waited for a store timeout.
        assert time.monotonic() - started < 10
        # Memory Subscriptions keep flowing.
        subscriber.client.publish("live/ping", b"still here", qos=0)
        assert subscriber.messages.get(timeout=TIMEOUT).payload == b"still here"
        assert http("GET", f"{api}/ready")[0] == 503

        objects.unlink()
        os.rename(moved, objects)
        recovers_with_exactly_the_acknowledged(broker, stream, publisher, channel, queue_name)
        assert amqp_stored(channel, queue_name) == [b"amqp-before", b"amqp-after"]
    finally:
        connection.close()
        subscriber.close()
        publisher.close()
        assert broker.stop() == 0


def test_a_retained_message_that_could_not_be_stored_is_not_retained(tmp_path):
    """The retained cache follows the store: a replacement refused by a failing object store
    (payloads over 64 KiB live there) leaves the previous retained message in place."""
    objects = tmp_path / "objects"
    broker = start_broker(tmp_path / "data", "--objects", objects.as_uri())
    publisher = Publisher(broker.ports["mqtt"])
    try:
        assert publisher.publish("state/door", b"v1", retain=True) < 0x80  # 0x10: no subscriber

        moved = tmp_path / "objects.moved"
        os.rename(objects, moved)
        objects.write_text("not a directory")
        assert publisher.publish("state/door", b"v2" * 40_000, retain=True) == UNSPECIFIED_ERROR

        subscriber = MqttClient(broker.ports["mqtt"], "late-sub")
        try:
            subscriber.subscribe("state/door", qos=1)
            assert publisher.publish("state/door", b"marker") < 0x80
            first = subscriber.messages.get(timeout=TIMEOUT)
            assert (first.payload, first.retain) == (b"v1", True)
            assert subscriber.messages.get(timeout=TIMEOUT).payload == b"marker"
        finally:
            subscriber.close()
    finally:
        publisher.close()
        assert broker.stop() == 0


def test_durable_writes_through_a_locked_meta_store_are_bounded_and_recover(tmp_path):
    """Another process holds the SQLite meta store's write lock (``BEGIN EXCLUSIVE``): the
    broker reports itself not ready, every durable publish is refused with its protocol's
    error within the meta store's bound on waiting for the lock (5 s) instead of hanging,
    and once the lock is gone writes recover by themselves with exactly the acknowledged
    messages stored."""
    broker = start_broker(tmp_path / "data")
    api = f"{broker.http}/api/v1"
    stream, queue_name = "locked", "locked-q"
    assert http("POST", f"{api}/streams", {"name": stream}, broker.token)[0] == 201
    publisher = Publisher(broker.ports["mqtt"])
    connection = pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", broker.ports["amqp"])
    )
    channel = connection.channel()
    channel.queue_declare(queue_name, durable=True)
    channel.confirm_delivery()

    def timed(publish: Callable[[], Any]) -> Any:
        started = time.monotonic()
        outcome = publish()
        assert time.monotonic() - started < 8, f"{outcome} after {time.monotonic() - started} s"
        return outcome

    try:
        assert publisher.publish(stream, b"mqtt-before") == 0
        assert kafka_produce(broker.ports["kafka"], stream, b"kafka-before") is None
        with meta_store_locked(tmp_path / "data" / "meta.db"):
            status, body = http("GET", f"{api}/ready")
            assert status == 503 and not body["error"]["details"]["checks"]["meta"]["ok"], body
            assert timed(lambda: publisher.publish(stream, b"mqtt-locked")) == UNSPECIFIED_ERROR
            error = timed(lambda: kafka_produce(broker.ports["kafka"], stream, b"kafka-locked"))
            assert error is not None and error.code() == KafkaError.KAFKA_STORAGE_ERROR
            assert not timed(lambda: amqp_publish(channel, queue_name, b"amqp-locked"))
            status, body = timed(
                lambda: http("POST", f"{api}/topics/{stream}/messages",
                             {"payload": "http-locked"}, broker.token)
            )  # fmt: skip
            assert status == 503 and body["error"]["code"] == "store_unavailable", body

        recovers_with_exactly_the_acknowledged(broker, stream, publisher, channel, queue_name)
        assert http("GET", f"{api}/ready")[0] == 200
        assert amqp_stored(channel, queue_name) == [b"amqp-after"]
    finally:
        connection.close()
        publisher.close()
        assert broker.stop() == 0


def test_a_persistent_sessions_suback_waits_for_its_record(tmp_path):
    """A SUBACK tells a persistent session's client its subscription outlives the connection,
    so it goes out only once the session's record (with the new filter) is committed.  With
    the meta store locked past its bound the client gets DISCONNECT 0x80, not a SUBACK; once
    the lock is gone a SUBSCRIBE is answered, and a restarted broker still routes to it."""
    data = tmp_path / "data"
    broker = start_broker(data)
    subscriber = MqttClient(broker.ports["mqtt"], "kept-subscriber", session_expiry=3600)
    try:
        with meta_store_locked(data / "meta.db"):
            subscriber.client.subscribe("kept/locked", 1)
            assert subscriber.disconnects.get(timeout=TIMEOUT) == UNSPECIFIED_ERROR
            assert not subscriber._subscribed.is_set(), "SUBACK before the record was stored"
        subscriber.client.loop_stop()
        subscriber = MqttClient(broker.ports["mqtt"], "kept-subscriber", session_expiry=3600)
        subscriber.subscribe("kept/after")
        subscriber.close()
        assert broker.stop() == 0

        broker = start_broker(data)
        subscriber = MqttClient(broker.ports["mqtt"], "kept-subscriber", session_expiry=3600)
        assert subscriber.session_present
        publisher = Publisher(broker.ports["mqtt"])
        assert publisher.publish("kept/after", b"still routed") == 0
        publisher.close()
        assert subscriber.messages.get(timeout=TIMEOUT).payload == b"still routed"
    finally:
        subscriber.close()
        assert broker.stop() == 0
