"""Messages crossing protocols through the routing engine: MQTT -> Queue -> AMQP,
AMQP -> MQTT, HTTP publish -> Queue, AMQP -> Stream."""

from __future__ import annotations

import json
import queue
import threading
import urllib.request

import paho.mqtt.client as mqtt
import pika
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from flowmq_kas3 import decode_batches
from flowmq_meta.catalog import STREAM, Destination
from tests.integration.amqp.conftest import HOST, TIMEOUT, connect, drain

pytestmark = pytest.mark.timeout(60)


def paho_client(port: int) -> mqtt.Client:
    client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    connected = threading.Event()
    client.on_connect = lambda *a: connected.set()
    client.connect(HOST, port)
    client.loop_start()
    assert connected.wait(TIMEOUT)
    return client


def test_mqtt_publish_into_queue_consumed_over_amqp(broker, amqp, uid) -> None:
    ch = amqp().channel()
    q = f"sensors-{uid}"
    ch.queue_declare(q, durable=True)
    ch.queue_bind(q, "amq.topic", f"sensors.{uid}.#")
    client = paho_client(broker.ports["mqtt"])
    try:
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        props = Properties(PacketTypes.PUBLISH)
        props.ContentType = "application/json"
        props.UserProperty = [("unit", "celsius")]
        info = client.publish(f"sensors/{uid}/room1", b'{"t": 21}', qos=1, properties=props)
        info.wait_for_publish(TIMEOUT)
    finally:
        client.disconnect()
        client.loop_stop()
    ((method, got, body),) = drain(ch, q, 1)
    assert body == b'{"t": 21}'
    assert method.exchange == "amq.topic" and method.routing_key == f"sensors.{uid}.room1"
    assert got.content_type == "application/json"
    assert got.headers == {"unit": "celsius"}
    assert got.delivery_mode == 2


def test_amqp_publish_reaches_mqtt_subscriber(broker, amqp, uid) -> None:
    received: queue.Queue = queue.Queue()
    client = paho_client(broker.ports["mqtt"])
    subscribed = threading.Event()
    client.on_subscribe = lambda *a: subscribed.set()
    client.on_message = lambda _c, _u, m: received.put(m)
    try:
        client.subscribe(f"events/{uid}/+", qos=1)
        assert subscribed.wait(TIMEOUT)
        ch = amqp().channel()
        ch.basic_publish(
            "amq.topic",
            f"events.{uid}.login",
            b"hello mqtt",
            pika.BasicProperties(content_type="text/plain", headers={"user": "ann"}),
        )
        m = received.get(timeout=TIMEOUT)
        assert m.topic == f"events/{uid}/login" and m.payload == b"hello mqtt"
        assert m.properties.ContentType == "text/plain"
        assert ("user", "ann") in m.properties.UserProperty
    finally:
        client.disconnect()
        client.loop_stop()


def test_http_publish_into_queue(broker, amqp, uid) -> None:
    ch = amqp().channel()
    q = f"http-{uid}"
    ch.queue_declare(q, durable=True)
    req = urllib.request.Request(
        f"{broker.http}/api/v1/topics/{q}/messages",
        data=json.dumps({"payload": "from http"}).encode(),
        method="POST",
        headers={"Authorization": f"Bearer {broker.token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=TIMEOUT) as r:
        answer = json.loads(r.read())
    assert answer["success"], answer
    ((_, _, body),) = drain(ch, q, 1)
    assert body == b"from http"


def test_amqp_publish_into_stream(inproc, uid) -> None:
    broker = inproc.broker
    stream = f"clicks-{uid}"
    inproc.run(
        broker.catalog.create_destination(
            Destination(STREAM, "default", stream, [f"clicks/{uid}/#"], {"partitions": 1})
        )
    )
    inproc.run(broker.metadata_changed())
    ch = connect(broker.ports["amqp"]).channel()
    ch.confirm_delivery()
    for i in range(3):
        ch.basic_publish("amq.topic", f"clicks.{uid}.page", b"click%d" % i)
    result = inproc.run(broker.streams.fetch("default", stream, 0, 0, 1 << 20))
    records = decode_batches(bytes(result.records))
    assert result.high_watermark == 3
    assert [r.value for r in records] == [b"click0", b"click1", b"click2"]
    assert ("flowmq.topic", f"clicks/{uid}/page".encode()) in records[0].headers
