"""Routing MQTT PUBLISH into a durable destination (a Stream): the message is appended there,
and a QoS 1/2 PUBLISH is acknowledged only once the append is durable (in-process broker, so
the test can read the Stream's high watermark the moment the acknowledgement arrives); and a
connected persistent session's durable Queue."""

from __future__ import annotations

from flowmq_broker.queues import session_queue_name
from flowmq_core.message import Message
from flowmq_wire.mqtt.packets import Publish, Pubrec

from .conftest import Paho, RawClient, http, wait_until

NS = "default"


def _hwm(broker, stream: str) -> int:
    streams = broker.broker.streams
    return broker.call_async(lambda: streams.high_watermark(NS, stream, 0))


def _records(broker, stream: str) -> bytes:
    streams = broker.broker.streams
    result = broker.call_async(lambda: streams.fetch(NS, stream, 0, 0, 1 << 20))
    return bytes(result.records)


def test_publish_into_stream_is_acknowledged_after_durable_append(inproc_broker):
    tb = inproc_broker
    status, body = http(
        tb.http,
        "POST",
        "/api/v1/streams",
        tb.token,
        {"name": "mqtt-durable", "topic_filters": ["durable/#"], "partitions": 1},
    )
    assert status == 201, body
    port = tb.ports["mqtt"]
    live = Paho(port, "live", v5=True)
    pub = RawClient(port, 5)
    pub4 = RawClient(port, 4)
    try:
        live.connect()
        live.subscribe("durable/#", 1)
        pub.connect("durable-pub")
        pub4.connect("durable-pub4")

        # QoS 1: PUBACK success (a destination matched), and the record is already there.
        ack = pub.publish("durable/a", b"payload-one", 1)
        assert ack.reason_code == 0
        assert _hwm(tb, "mqtt-durable") == 1

        # QoS 2: PUBREC after the append.
        pub.send(Publish("durable/b", b"payload-two", 2, packet_id=50))
        rec = pub.expect(Pubrec)
        assert (rec.packet_id, rec.reason_code) == (50, 0)
        assert _hwm(tb, "mqtt-durable") == 2

        # 3.1.1 likewise.
        pub4.publish("durable/c", b"payload-three", 1)
        assert _hwm(tb, "mqtt-durable") == 3

        # QoS 0 is appended too (no acknowledgement to wait for).
        pub.publish("durable/d", b"payload-four", 0)
        wait_until(lambda: _hwm(tb, "mqtt-durable") == 4)

        records = _records(tb, "mqtt-durable")
        for payload in (b"payload-one", b"payload-two", b"payload-three", b"payload-four"):
            assert payload in records
        assert b"durable/a" in records  # the canonical topic travels with the record

        # …and the memory-push subscriber got every message as well.
        got = sorted(m.payload for m in live.expect(4))
        assert got == sorted([b"payload-one", b"payload-two", b"payload-three", b"payload-four"])
    finally:
        live.close()
        pub.close()
        pub4.close()


def test_a_message_another_broker_stored_for_a_connected_session_reaches_it(inproc_broker):
    """Around a takeover (or a broker declared dead while paused) two brokers hold a session
    for a moment, and one stores a message in its Queue while the client is connected to the
    other: the connected side sends it once the client is idle, before it drops the copies."""
    tb = inproc_broker
    sub = Paho(tb.ports["mqtt"], "held-elsewhere", v5=True, clean=False)
    pub = Paho(tb.ports["mqtt"], "publisher-here", v5=True)
    try:
        sub.connect(clean_start=True, properties={"SessionExpiryInterval": 300})
        sub.subscribe("elsewhere/#", 1)
        # One message through this broker: the session has a copy stored, to drop once the
        # client acknowledged it (about a second later).
        pub.connect()
        assert pub.publish("elsewhere/0", b"through-this-broker", 1) == 0
        queues = tb.broker.queues
        stored = Message("elsewhere/1", b"stored-by-another-broker", qos=1)

        async def store_elsewhere() -> None:
            name = session_queue_name("held-elsewhere")
            await queues.engine.enqueue(NS, name, stored, queues.session_options)

        tb.call_async(store_elsewhere)
        got = [sub.messages.get(timeout=10) for _ in range(2)]
        assert [(m.topic, m.payload) for m in got] == [
            ("elsewhere/0", b"through-this-broker"),
            ("elsewhere/1", b"stored-by-another-broker"),
        ]
    finally:
        for client in (sub, pub):
            client.client.disconnect()
            client.client.loop_stop()
