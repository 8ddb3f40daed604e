"""Operators can follow clients in the log (as Mosquitto's "New client connected" and
RabbitMQ's "accepting AMQP connection"): each accepted connection and its end are one info
line naming the client's address and user (and for MQTT its client id and protocol)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pika
import pytest

from tests.fixtures.inprocess import broker_config
from tests.fixtures.threaded_broker import ThreadedBroker
from tests.fixtures.waiting import wait_until

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def threaded(tmp_path) -> Iterator[ThreadedBroker]:
    broker = ThreadedBroker(broker_config(tmp_path / "data", node_id="log-node")).start()
    yield broker
    broker.stop()


def lines(caplog, logger: str) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.name == logger and r.levelno == logging.INFO
    ]


def test_amqp_connections_are_logged_when_opened_and_closed(threaded, caplog) -> None:
    caplog.set_level(logging.INFO, logger="flowmq_broker.amqp.connection")
    connection = pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", threaded.ports["amqp"])
    )
    port = connection._impl._transport._sock.getsockname()[1]
    peer = f"127.0.0.1:{port}"
    connection.close()
    wait_until(
        lambda: any("closed" in line and peer in line for line in lines(caplog, "flowmq_broker.amqp.connection")),
        10, what="the close line",
    )  # fmt: skip
    logged = [line for line in lines(caplog, "flowmq_broker.amqp.connection") if peer in line]
    assert logged == [
        f"AMQP connection {peer}: anonymous opened vhost /",
        f"AMQP connection {peer} (anonymous, vhost /) closed",
    ]


def test_mqtt_connects_and_disconnects_are_logged_with_client_id_and_reason(
    threaded, caplog
) -> None:
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    logger = "flowmq_broker.mqtt.connection"
    caplog.set_level(logging.INFO, logger=logger)
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="log-me", protocol=mqtt.MQTTv5)
    client.connect("127.0.0.1", threaded.ports["mqtt"], keepalive=30)
    client.loop_start()
    wait_until(client.is_connected, 10, what="CONNACK")
    peer = f"127.0.0.1:{client.socket().getsockname()[1]}"
    client.disconnect()
    client.loop_stop()
    wait_until(lambda: any("disconnected" in line for line in lines(caplog, logger)), 10,
               what="the disconnect line")  # fmt: skip
    assert [line for line in lines(caplog, logger) if line.startswith("mqtt log-me:")] == [
        f"mqtt log-me: connected from {peer} (MQTT 5.0, anonymous, new session, keep alive 30 s)",
        f"mqtt log-me: disconnected from {peer} (DISCONNECT from the client)",
    ]
