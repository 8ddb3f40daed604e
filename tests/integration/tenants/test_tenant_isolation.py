"""Namespaces are tenants (DESIGN.md §12): alice (namespace ``a``) and bob (namespace ``b``)
use the same topic, stream, queue and group names through MQTT, Kafka and AMQP, and never
see each other's messages, topics or groups.

Each case fails if its protocol ignores the user's namespace: both users then share one
namespace (``default``), and each receives the other's message too.
"""

from __future__ import annotations

import queue
import threading
import time

import paho.mqtt.client as mqtt
import pika
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from tests.fixtures.broker_process import BrokerProcess
from tests.integration.tenants.conftest import USERS, http

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import AdminClient  # noqa: E402

TIMEOUT = 10.0


# --- MQTT ---------------------------------------------------------------------------------
class Mqtt:
    """A paho v5 client logged in as ``user``; received messages land in a queue."""

    def __init__(self, broker: BrokerProcess, user: str, client_id: str) -> None:
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5
        )
        self.client.username_pw_set(user, USERS[user][0])
        self.messages: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
        connected, subscribed = threading.Event(), threading.Event()
        self.codes: list[int] = []

        def on_connect(client, userdata, flags, reason_code, properties):
            self.codes.append(reason_code.value)
            connected.set()

        self.client.on_connect = on_connect
        self.client.on_subscribe = lambda *a: subscribed.set()
        self.client.on_message = lambda _c, _u, m: self.messages.put(m)
        self.client.connect("127.0.0.1", broker.ports["mqtt"])
        self.client.loop_start()
        assert connected.wait(TIMEOUT) and self.codes == [0], self.codes
        self._subscribed = subscribed

    def subscribe(self, topic_filter: str) -> None:
        self._subscribed.clear()
        self.client.subscribe(topic_filter, qos=1)
        assert self._subscribed.wait(TIMEOUT)

    def publish(self, topic: str, payload: bytes) -> None:
        self.client.publish(topic, payload, qos=1).wait_for_publish(TIMEOUT)

    def received(self, quiet: float = 1.0) -> list[bytes]:
        """Every payload received until ``quiet`` seconds pass without one."""
        out = []
        while True:
            try:
                out.append(self.messages.get(timeout=quiet).payload)
            except queue.Empty:
                return out

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def test_mqtt_same_topic_two_tenants(tenants_broker, uid):
    alice = Mqtt(tenants_broker, "alice", f"alice-{uid}")
    bob = Mqtt(tenants_broker, "bob", f"bob-{uid}")
    try:
        alice.subscribe("t/1")
        bob.subscribe("t/1")
        alice.publish("t/1", b"from alice")
        bob.publish("t/1", b"from bob")
        assert alice.received() == [b"from alice"]
        assert bob.received() == [b"from bob"]
    finally:
        alice.close()
        bob.close()


# --- Kafka --------------------------------------------------------------------------------
def kafka_conf(broker: BrokerProcess, user: str, **extra) -> dict:
    return {
        "bootstrap.servers": f"127.0.0.1:{broker.ports['kafka']}",
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": user,
        "sasl.password": USERS[user][0],
        "topic.metadata.refresh.interval.ms": 2000,
        "socket.connection.setup.timeout.ms": 5000,
        **extra,
    }


def kafka_produce(broker: BrokerProcess, user: str, topic: str, value: bytes) -> None:
    producer = ck.Producer(kafka_conf(broker, user, **{"acks": "all"}))
    producer.produce(topic, value)
    assert producer.flush(15) == 0


def kafka_consume(broker: BrokerProcess, user: str, topic: str, group: str) -> list[bytes]:
    """Everything ``user`` reads of ``topic`` from the start, as group ``group``."""
    conf = kafka_conf(broker, user, **{"group.id": group, "auto.offset.reset": "earliest"})
    consumer = ck.Consumer(conf)
    got: list[bytes] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 20
        quiet_until = None
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                got.append(message.value())
                quiet_until = time.monotonic() + 2
            elif quiet_until is not None and time.monotonic() > quiet_until:
                break
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    return got


def test_kafka_same_topic_and_group_two_tenants(tenants_broker, uid):
    """Topic ``orders`` and group ``billing`` in each namespace: each user reads its own
    record only, commits in its own group, and Metadata lists its own topics only."""
    kafka_produce(tenants_broker, "alice", "orders", b"order of alice")
    kafka_produce(tenants_broker, "bob", "orders", b"order of bob")
    kafka_produce(tenants_broker, "bob", f"only-b-{uid}", b"x")

    assert kafka_consume(tenants_broker, "alice", "orders", "billing") == [b"order of alice"]
    assert kafka_consume(tenants_broker, "bob", "orders", "billing") == [b"order of bob"]

    for namespace in ("a", "b"):
        status, answer = http(
            tenants_broker,
            "GET",
            f"/streams/orders?namespace={namespace}",
            token=tenants_broker.token,
        )
        assert status == 200 and answer["data"]["messages"] == 1, answer
        status, answer = http(
            tenants_broker,
            "GET",
            f"/groups/billing?namespace={namespace}",
            token=tenants_broker.token,
        )
        assert status == 200, answer
        assert [(o["stream"], o["committed_offset"]) for o in answer["data"]["offsets"]] == [
            ("orders", 1)
        ], answer
    status, answer = http(tenants_broker, "GET", "/streams/orders", token=tenants_broker.token)
    assert status == 404, "a Kafka user's topic landed in the default namespace"

    seen = AdminClient(kafka_conf(tenants_broker, "alice")).list_topics(timeout=10).topics
    assert "orders" in seen and f"only-b-{uid}" not in seen, sorted(seen)
    seen = AdminClient(kafka_conf(tenants_broker, "bob")).list_topics(timeout=10).topics
    assert {"orders", f"only-b-{uid}"} <= set(seen), sorted(seen)


# --- AMQP ---------------------------------------------------------------------------------
def amqp(broker: BrokerProcess, user: str, vhost: str) -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters(
            "127.0.0.1",
            broker.ports["amqp"],
            virtual_host=vhost,
            credentials=pika.PlainCredentials(user, USERS[user][0]),
            connection_attempts=1,
            socket_timeout=TIMEOUT,
        )
    )


def test_amqp_same_queue_two_vhosts(tenants_broker):
    with amqp(tenants_broker, "alice", "a") as alice, amqp(tenants_broker, "bob", "b") as bob:
        a, b = alice.channel(), bob.channel()
        a.queue_declare("q")
        b.queue_declare("q")
        a.basic_publish("", "q", b"for a")
        b.basic_publish("", "q", b"for b")
        for channel, expected in ((a, b"for a"), (b, b"for b")):
            deadline = time.monotonic() + TIMEOUT
            got = []
            while time.monotonic() < deadline and not got:
                _, _, body = channel.basic_get("q", auto_ack=True)
                if body is not None:
                    got.append(body)
            assert got == [expected]
            assert channel.basic_get("q", auto_ack=True)[2] is None


def test_amqp_user_cannot_open_another_vhost(tenants_broker):
    with pytest.raises(pika.exceptions.AMQPConnectionError) as refused:
        amqp(tenants_broker, "alice", "b")
    assert "530" in repr(refused.value) or "NOT_ALLOWED" in repr(refused.value), refused.value
