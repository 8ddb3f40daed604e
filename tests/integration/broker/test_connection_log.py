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
