"""Secure defaults (DESIGN.md §12, Mosquitto 2.0's model), with real clients over real
sockets: the client listeners and the HTTP API bind ``bind`` (127.0.0.1 unless configured);
anonymous clients are allowed while ``allow_anonymous`` is unset only if ``bind`` is a
loopback address; set explicitly, it wins."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import paho.mqtt.client as mqtt
import pika
import pytest

from tests.fixtures.broker_process import BrokerProcess, start_broker
from tests.integration.broker.test_users import connect_result
from tests.integration.kafka.conftest import RawKafka, confluent_conf
from tests.integration.kafka.test_kafka_protocol import API_VERSIONS, METADATA

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import AdminClient  # noqa: E402

HOST = "127.0.0.1"
CLIENT_PORTS = ("mqtt", "kafka", "amqp", "http")


def _non_loopback_address() -> str | None:
    """An address of this host other than loopback (the one its default route uses)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: nothing is sent
        except OSError:
            return None
        address = probe.getsockname()[0]
    return None if address.startswith("127.") or address == "0.0.0.0" else address


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=5):
            return True
    except OSError:
        return False


def _start(tmp_path_factory, name: str, *args: str) -> BrokerProcess:
    return start_broker(tmp_path_factory.mktemp(name) / "data", *args)


@pytest.fixture(scope="module")
def default_broker(tmp_path_factory) -> Iterator[BrokerProcess]:
    broker = _start(tmp_path_factory, "default")
    yield broker
    broker.stop()


@pytest.fixture(scope="module")
def open_bind_broker(tmp_path_factory) -> Iterator[BrokerProcess]:
    """Bound to every interface, ``allow_anonymous`` not set."""
    broker = _start(tmp_path_factory, "open-bind", "--bind", "0.0.0.0")
    yield broker
    broker.stop()


@pytest.fixture(scope="module")
def open_anonymous_broker(tmp_path_factory) -> Iterator[BrokerProcess]:
    """Bound to every interface, anonymous clients allowed explicitly."""
    broker = _start(tmp_path_factory, "open-anon", "--bind", "0.0.0.0", "--allow-anonymous", "true")
    yield broker
    broker.stop()


# --- the clients ------------------------------------------------------------------------------
def mqtt_connack(port: int, protocol: int) -> int:
    """The CONNACK an anonymous paho client gets (paho reports 3.1.1 return codes 4 and 5
    as the v5 codes 0x86 and 0x87)."""
    return connect_result(port, protocol, None, None)


def amqp_anonymous(port: int) -> None:
    """pika's defaults (``guest``/``guest``: an AMQP client's anonymous login)."""
    conn = pika.BlockingConnection(pika.ConnectionParameters(HOST, port))
    try:
        conn.channel().queue_declare("", exclusive=True)
    finally:
        conn.close()


def kafka_list_topics(broker: BrokerProcess) -> None:
    """librdkafka without SASL: raises ``KafkaException`` when the broker will not serve it."""
    admin = AdminClient(confluent_conf(broker, socket_timeout_ms=3000))
    admin.list_topics(timeout=5)


def kafka_metadata_closes(broker: BrokerProcess) -> bool:
    """Only ApiVersions and SASL are served before authentication: Metadata closes."""
    raw = RawKafka(broker.ports["kafka"])
    try:
        assert raw.request(API_VERSIONS, 3).error_code == 0
        raw.send(
            METADATA,
            12,
            topics=None,
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=False,
        )
        return raw.is_closed()
    finally:
        raw.close()


# --- bind ---------------------------------------------------------------------------------------
def test_default_bind_is_loopback_only(default_broker):
    address = _non_loopback_address()
    if address is None:
        pytest.skip("this host has no address but loopback")
    for name in CLIENT_PORTS:
        port = default_broker.ports[name]
        assert _reachable(HOST, port), name
        assert not _reachable(address, port), f"{name} port reachable on {address}"


def test_bind_all_interfaces_reaches_every_address(open_bind_broker):
    address = _non_loopback_address()
    if address is None:
        pytest.skip("this host has no address but loopback")
    for name in CLIENT_PORTS:
        assert _reachable(address, open_bind_broker.ports[name]), name


def test_start_up_log_names_the_anonymous_mode(default_broker, open_bind_broker):
    def mode(broker: BrokerProcess) -> str:
        return next(line for line in broker.output if "anonymous clients" in line)

    assert "bind 127.0.0.1; anonymous clients allowed (bind is loopback" in mode(default_broker)
    assert "bind 0.0.0.0; anonymous clients refused (bind is not loopback" in mode(open_bind_broker)


# --- anonymous clients --------------------------------------------------------------------------
def test_loopback_broker_allows_anonymous_clients(default_broker):
    assert mqtt_connack(default_broker.ports["mqtt"], mqtt.MQTTv311) == 0
    assert mqtt_connack(default_broker.ports["mqtt"], mqtt.MQTTv5) == 0
    amqp_anonymous(default_broker.ports["amqp"])
    kafka_list_topics(default_broker)


def test_broker_bound_elsewhere_refuses_anonymous_mqtt(open_bind_broker):
    assert mqtt_connack(open_bind_broker.ports["mqtt"], mqtt.MQTTv311) == 0x87  # return code 5
    assert mqtt_connack(open_bind_broker.ports["mqtt"], mqtt.MQTTv5) == 0x87  # Not authorized


def test_broker_bound_elsewhere_refuses_anonymous_amqp(open_bind_broker):
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as refused:
        amqp_anonymous(open_bind_broker.ports["amqp"])
    assert "(403) 'ACCESS_REFUSED" in str(refused.value)


def test_broker_bound_elsewhere_refuses_anonymous_kafka(open_bind_broker):
    assert kafka_metadata_closes(open_bind_broker)
    with pytest.raises(ck.KafkaException):
        kafka_list_topics(open_bind_broker)


def test_explicit_allow_anonymous_opens_a_broker_bound_elsewhere(open_anonymous_broker):
    broker = open_anonymous_broker
    assert mqtt_connack(broker.ports["mqtt"], mqtt.MQTTv311) == 0
    assert mqtt_connack(broker.ports["mqtt"], mqtt.MQTTv5) == 0
    amqp_anonymous(broker.ports["amqp"])
    kafka_list_topics(broker)
    assert not kafka_metadata_closes(broker)
