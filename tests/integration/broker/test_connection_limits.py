"""Connection limits of the client listeners (``max_connections`` per listener,
``max_connections_per_address`` per client IP address over all of them; DESIGN.md §13,
docs/operations.md#limits): past either, a new MQTT (TCP or WebSocket), Kafka or AMQP
connection is closed at once, counted in ``limits_rejections_count``, and the clients already
connected — and those from other addresses or on other listeners — keep being served."""

from __future__ import annotations

import queue
from collections.abc import Iterator

import paho.mqtt.client as mqtt
import pika
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from tests.fixtures.broker_process import BrokerProcess, start_broker
from tests.fixtures.brokers import no_broker_tracebacks, uid  # noqa: F401
from tests.integration.amqp.conftest import RawAmqp
from tests.integration.kafka.conftest import RawKafka
from tests.integration.mqtt.conftest import HOST, TIMEOUT, scrape, wait_until

ALL_ROLES = ("--roles", "mqtt,kafka,amqp,admin")
OTHER_ADDRESS = "127.0.0.2"  # loopback too: another client host as far as the broker knows
API_VERSIONS = 18


def _limited(tmp_path_factory, name: str, *args: str) -> Iterator[BrokerProcess]:
    proc = start_broker(tmp_path_factory.mktemp(name) / "data", *ALL_ROLES, *args)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def listener_capped_broker(tmp_path_factory) -> Iterator[BrokerProcess]:
    yield from _limited(tmp_path_factory, "per-listener", "--max-connections", "2")


@pytest.fixture(scope="module")
def address_capped_broker(tmp_path_factory) -> Iterator[BrokerProcess]:
    yield from _limited(tmp_path_factory, "per-address", "--max-connections-per-address", "3")


def _rejections(broker: BrokerProcess, limit: str) -> float:
    return scrape(broker.http).get(f'limits_rejections_count{{limit="{limit}"}}', 0.0)


class Mqtt:
    """A paho v5 client (TCP or WebSocket) from ``source``; ``start`` says whether the broker
    answered CONNECT (True) or closed the connection first (False)."""

    def __init__(self, port: int, client_id: str, *, source: str = "", ws: bool = False) -> None:
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id,
            protocol=mqtt.MQTTv5,
            transport="websockets" if ws else "tcp",
            reconnect_on_failure=False,
        )
        if ws:
            self.client.ws_set_options(path="/mqtt")
        self.port, self.source = port, source
        self.events: queue.Queue[str] = queue.Queue()
        self.messages: queue.Queue[bytes] = queue.Queue()
        self.client.on_connect = lambda *_: self.events.put("connack")
        self.client.on_disconnect = lambda *_: self.events.put("closed")
        self.client.on_message = lambda _c, _u, m: self.messages.put(m.payload)

    def start(self) -> bool:
        self.client.connect(HOST, self.port, bind_address=self.source)
        self.client.loop_start()
        return self.events.get(timeout=TIMEOUT) == "connack"

    def round_trip(self, topic: str) -> None:
        """Subscribe to ``topic``, publish to it, get the message back."""
        self.client.subscribe(topic, 1)
        self.client.publish(topic, b"still served", 1)
        assert self.messages.get(timeout=TIMEOUT) == b"still served"

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def _connected(port: int, client_id: str) -> Mqtt | None:
    client = Mqtt(port, client_id)
    if client.start():
        return client
    client.close()
    return None


def _amqp(port: int) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(HOST, port))


def _kafka_served(client: RawKafka) -> bool:
    return client.request(API_VERSIONS, 3).error_code == 0


def test_a_full_listener_closes_new_connections_and_serves_the_others(
    listener_capped_broker,
    uid,  # noqa: F811 (the imported fixture)
):
    broker = listener_capped_broker
    port = broker.ports["mqtt"]
    before = _rejections(broker, "connections")
    first, second = Mqtt(port, f"first-{uid}"), Mqtt(port, f"second-{uid}")
    assert first.start() and second.start()
    refused = Mqtt(port, f"third-{uid}")
    assert not refused.start()  # closed before any CONNACK
    refused.close()
    assert _rejections(broker, "connections") == before + 1
    first.round_trip(f"listener/{uid}")
    # The other listeners count their own connections.
    kafka = RawKafka(broker.ports["kafka"])
    assert _kafka_served(kafka)
    amqp = _amqp(broker.ports["amqp"])
    assert amqp.is_open
    amqp.close()
    kafka.sock.close()
    # A connection that ends frees its place.
    second.close()
    again = wait_until(lambda: _connected(port, f"again-{uid}"))
    again.round_trip(f"again/{uid}")
    again.close()
    first.close()


def test_an_address_past_its_limit_is_closed_on_every_listener(
    address_capped_broker,
    uid,  # noqa: F811 (the imported fixture)
):
    broker = address_capped_broker
    before = _rejections(broker, "connections_per_address")
    # Three connections from 127.0.0.1, one per protocol: the address's limit.
    mqtt_client = Mqtt(broker.ports["mqtt"], f"kept-{uid}")
    assert mqtt_client.start()
    amqp = _amqp(broker.ports["amqp"])
    kafka = RawKafka(broker.ports["kafka"])
    assert _kafka_served(kafka)
    # A fourth, on any listener, is closed before the protocol says a word.
    refused_mqtt = Mqtt(broker.ports["mqtt"], f"refused-{uid}")
    assert not refused_mqtt.start()
    refused_mqtt.close()
    refused_ws = Mqtt(broker.ports["mqtt_ws"], f"refused-ws-{uid}", ws=True)
    assert not refused_ws.start()
    refused_ws.close()
    assert RawKafka(broker.ports["kafka"]).is_closed()
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        _amqp(broker.ports["amqp"])
    assert RawAmqp(broker.ports["amqp"]).sock.recv(16) == b""
    assert _rejections(broker, "connections_per_address") == before + 5
    # The connections already open keep working, and other addresses still connect.
    mqtt_client.round_trip(f"kept/{uid}")
    assert _kafka_served(kafka)
    channel = amqp.channel()
    channel.queue_declare(f"kept-{uid}", auto_delete=True)
    other = Mqtt(broker.ports["mqtt"], f"other-{uid}", source=OTHER_ADDRESS)
    assert other.start()
    other.round_trip(f"other/{uid}")
    assert _kafka_served(RawKafka(broker.ports["kafka"], source=OTHER_ADDRESS))
    other.close()
    amqp.close()
    kafka.sock.close()
    mqtt_client.close()
