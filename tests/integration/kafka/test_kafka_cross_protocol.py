"""One routing engine for every protocol (DESIGN.md §3): MQTT into a Stream read by Kafka,
and a Kafka produce reaching an MQTT subscriber."""

from __future__ import annotations

import json
import queue
import time
import urllib.request

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.integration.kafka.conftest import confluent_conf
from tests.integration.kafka.test_kafka_clients import create, produce_all, read_partition

ck = pytest.importorskip("confluent_kafka")


def admin_post(broker, path: str, body: dict) -> dict:
    request = urllib.request.Request(
        broker.http + path,
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {broker.token}", "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def mqtt_client(broker, client_id: str, inbox: queue.Queue | None = None) -> mqtt.Client:
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
    subscribed: queue.Queue = queue.Queue()
    if inbox is not None:
        client.on_message = lambda c, u, msg: inbox.put(msg)
    client.on_subscribe = lambda c, u, mid, codes, props: subscribed.put(mid)
    client.connect("127.0.0.1", broker.ports["mqtt"])
    client.loop_start()
    client._test_subscribed = subscribed  # type: ignore[attr-defined]
    return client


def test_mqtt_publish_is_read_by_a_kafka_consumer_with_topic_and_user_properties(
    broker, uid
) -> None:
    stream = f"telemetry-{uid}"
    admin_post(
        broker, "/api/v1/streams", {"name": stream, "topic_filters": ["sensors/+/telemetry"]}
    )
    client = mqtt_client(broker, f"dev-1-{uid}")
    try:
        props = Properties(PacketTypes.PUBLISH)
        props.UserProperty = [("site", "lab"), ("unit", "C")]
        info = client.publish("sensors/dev-1/telemetry", b"21.5", qos=1, properties=props)
        info.wait_for_publish(10)
        assert info.is_published()
    finally:
        client.loop_stop()
        client.disconnect()
    (record,) = read_partition(broker, stream, 0, 1)
    assert record.value() == b"21.5"
    assert record.headers() == [
        ("flowmq.topic", b"sensors/dev-1/telemetry"),
        ("site", b"lab"),
        ("unit", b"C"),
    ]


def test_kafka_produce_reaches_an_mqtt_subscriber(broker, uid) -> None:
    topic = "commands.broadcast"
    create(broker, topic)
    inbox: queue.Queue = queue.Queue()
    client = mqtt_client(broker, f"listener-{uid}", inbox)
    try:
        _, mid = client.subscribe("commands/#", qos=1)
        assert client._test_subscribed.get(timeout=10) == mid  # type: ignore[attr-defined]
        producer = ck.Producer(confluent_conf(broker, acks="all", linger_ms=0))
        for codec_value in (b"reboot", b"update"):
            producer.produce(topic, value=codec_value, key=b"all", headers=[("origin", b"ops")])
        assert producer.flush(10) == 0
        got = [inbox.get(timeout=10) for _ in range(2)]
        assert [(m.topic, m.payload) for m in got] == [
            ("commands/broadcast", b"reboot"),
            ("commands/broadcast", b"update"),
        ]
        assert ("origin", "ops") in got[0].properties.UserProperty
        time.sleep(0.2)
        assert inbox.empty()
    finally:
        client.loop_stop()
        client.disconnect()
    # The Stream itself holds each record once: routing never writes it into T twice.
    stored = read_partition(broker, topic, 0, 3, timeout=2)
    assert [m.value() for m in stored] == [b"reboot", b"update"]


def test_compressed_kafka_batches_are_decoded_for_mqtt(broker, uid) -> None:
    topic = f"zipped.{uid}"
    create(broker, topic)
    inbox: queue.Queue = queue.Queue()
    client = mqtt_client(broker, f"zip-{uid}", inbox)
    try:
        _, mid = client.subscribe(f"zipped/{uid}", qos=0)
        assert client._test_subscribed.get(timeout=10) == mid  # type: ignore[attr-defined]
        produce_all(
            broker, topic, [(0, None, b"z%d" % i) for i in range(20)], compression_type="zstd"
        )
        got = [inbox.get(timeout=10).payload for _ in range(20)]
        assert got == [b"z%d" % i for i in range(20)]
    finally:
        client.loop_stop()
        client.disconnect()


def test_a_produce_whose_copy_is_refused_is_not_acknowledged(broker, uid) -> None:
    """Acknowledge what is stored (DESIGN.md §13): records that reach their Stream but not
    a Queue matching the same topic (here: the Queue is full) get KAFKA_STORAGE_ERROR, so
    the producer retries instead of trusting a copy that is not there."""
    topic = f"full.copy.{uid}"
    create(broker, topic)
    admin_post(
        broker,
        "/api/v1/queues",
        {"name": f"full-{uid}", "topic_filter": f"full/copy/{uid}", "max_size_mb": 1},
    )
    producer = ck.Producer(confluent_conf(broker, acks="all", linger_ms=0, retries=0))
    reports: list = []
    for _ in range(2):
        producer.produce(topic, value=b"x" * 600_000, on_delivery=lambda e, m: reports.append(e))
        assert producer.flush(15) == 0
    first, second = reports
    assert first is None
    assert second is not None and second.code() == ck.KafkaError.KAFKA_STORAGE_ERROR
