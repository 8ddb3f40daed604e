"""Every listener also speaks TLS once a certificate is configured: MQTT (paho 3.1.1 and 5),
Kafka's SSL security protocol (confluent-kafka), AMQP (pika) and HTTPS, each with the
client trusting only the test CA; and a broker without TLS settings opens no TLS port."""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
import urllib.request

import paho.mqtt.client as mqtt
import pika
import pytest

from tests.fixtures.broker_process import start_broker
from tests.fixtures.cli import flowmq_user
from tests.integration.tls.conftest import HOST, TIMEOUT, client_context, mqtt_tls_client, tls_args

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import AdminClient  # noqa: E402

TLS_KEYS = {"mqtt_tls", "kafka_tls", "amqp_tls", "http_tls"}

_QUIET = logging.getLogger("librdkafka-in-tls-tests")
_QUIET.addHandler(logging.NullHandler())
_QUIET.propagate = False


def test_tls_ports_open_only_with_a_certificate(tls_broker, tmp_path):
    assert tls_broker.ports.keys() >= TLS_KEYS
    assert len({tls_broker.ports[key] for key in TLS_KEYS}) == 4
    plain = start_broker(tmp_path / "data")
    try:
        assert not [key for key in plain.ports if key.endswith("_tls")], plain.ports
    finally:
        plain.stop()


@pytest.mark.parametrize("protocol", [mqtt.MQTTv311, mqtt.MQTTv5], ids=["v311", "v5"])
def test_mqtt_publish_subscribe_over_tls(tls_broker, pki, protocol, uid):
    port = tls_broker.ports["mqtt_tls"]
    topic = f"tls/{uid}"
    received: queue.Queue[bytes] = queue.Queue()
    subscribed = threading.Event()
    sub = mqtt_tls_client(pki, protocol)
    sub.on_message = lambda client, userdata, message: received.put(message.payload)
    sub.on_subscribe = lambda *args: subscribed.set()
    sub.connect(HOST, port)
    sub.loop_start()
    pub = mqtt_tls_client(pki, protocol)
    try:
        sub.subscribe(topic, qos=1)
        assert subscribed.wait(TIMEOUT), "no SUBACK"
        pub.connect(HOST, port)
        pub.loop_start()
        pub.publish(topic, b"over tls", qos=1).wait_for_publish(TIMEOUT)
        assert received.get(timeout=TIMEOUT) == b"over tls"
    finally:
        for client in (pub, sub):
            client.disconnect()
            client.loop_stop()


def ssl_conf(broker, pki, **extra) -> dict:
    conf = {
        "bootstrap.servers": f"{HOST}:{broker.ports['kafka_tls']}",
        "security.protocol": "SSL",
        "ssl.ca.location": str(pki.ca),
        "logger": _QUIET,
        "socket.connection.setup.timeout.ms": 5000,
    }
    conf.update({k.replace("_", "."): v for k, v in extra.items()})
    return conf


def test_kafka_metadata_advertises_the_port_of_the_clients_security_protocol(tls_broker, pki):
    over_tls = AdminClient(ssl_conf(tls_broker, pki)).list_topics(timeout=TIMEOUT)
    assert {b.port for b in over_tls.brokers.values()} == {tls_broker.ports["kafka_tls"]}
    plain_conf = {"bootstrap.servers": f"{HOST}:{tls_broker.ports['kafka']}", "logger": _QUIET}
    plain = AdminClient(plain_conf).list_topics(timeout=TIMEOUT)
    assert {b.port for b in plain.brokers.values()} == {tls_broker.ports["kafka"]}


def test_kafka_ssl_produce_and_consume_in_a_group(tls_broker, pki, uid):
    """librdkafka reconnects to the advertised brokers (Metadata) and to the group's
    coordinator (FindCoordinator) with SSL: both must be the TLS port."""
    topic = f"tls-{uid}"
    producer = ck.Producer(ssl_conf(tls_broker, pki, acks="all", message_timeout_ms=15000))
    reports: list = []
    for i in range(10):
        producer.produce(topic, value=b"m%d" % i, on_delivery=lambda e, m: reports.append(e))
    assert producer.flush(20) == 0
    assert reports == [None] * 10
    consumer = ck.Consumer(
        ssl_conf(tls_broker, pki, group_id=f"g-{uid}", auto_offset_reset="earliest")
    )
    consumer.subscribe([topic])
    values = []
    deadline = time.monotonic() + 20
    try:
        while len(values) < 10 and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None:
                assert message.error() is None, message.error()
                values.append(message.value())
        consumer.commit(asynchronous=False)  # through the coordinator, over TLS
    finally:
        consumer.close()
    assert values == [b"m%d" % i for i in range(10)]


def test_amqp_publish_and_get_over_tls(tls_broker, pki, uid):
    params = pika.ConnectionParameters(
        HOST,
        tls_broker.ports["amqp_tls"],
        ssl_options=pika.SSLOptions(client_context(pki), "localhost"),
    )
    with pika.BlockingConnection(params) as connection:
        channel = connection.channel()
        queue_name = f"tls-{uid}"
        channel.queue_declare(queue_name)
        channel.basic_publish("", queue_name, b"over amqps")
        _, _, body = channel.basic_get(queue_name, auto_ack=True)
        assert body == b"over amqps"


def test_admin_api_over_https(tls_broker, pki):
    request = urllib.request.Request(
        f"https://localhost:{tls_broker.ports['http_tls']}/api/v1/cluster/nodes",
        headers={"Authorization": f"Bearer {tls_broker.token}"},
    )
    with urllib.request.urlopen(request, timeout=TIMEOUT, context=client_context(pki)) as r:
        assert r.status == 200
        nodes = json.load(r)["data"]
    assert nodes[0]["ports"]["kafka_tls"] == tls_broker.ports["kafka_tls"]


@pytest.fixture(scope="module")
def sasl_ssl_broker(pki, tmp_path_factory):
    """TLS, one user, anonymous clients refused: Kafka's SASL_SSL security protocol."""
    data_dir = tmp_path_factory.mktemp("sasl-ssl") / "data"
    added = flowmq_user(data_dir, "add", "kafka-app", "--password", "scram-secret")
    assert added.returncode == 0, added.stderr
    proc = start_broker(
        data_dir, *tls_args(pki), "--allow-anonymous", "false", "--acl-default", "allow"
    )
    yield proc
    proc.stop()


def sasl_ssl_conf(broker, pki, mechanism: str, password: str, **extra) -> dict:
    return ssl_conf(
        broker,
        pki,
        security_protocol="SASL_SSL",
        sasl_mechanism=mechanism,
        sasl_username="kafka-app",
        sasl_password=password,
        **extra,
    )


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_kafka_sasl_ssl_with_scram_produces(sasl_ssl_broker, pki, uid, mechanism):
    topic = f"sasl-ssl-{uid}-{mechanism[-3:]}"
    conf = sasl_ssl_conf(
        sasl_ssl_broker, pki, mechanism, "scram-secret", acks="all", message_timeout_ms=15000
    )
    producer = ck.Producer(conf)
    reports: list = []
    producer.produce(topic, value=b"over SASL_SSL", on_delivery=lambda e, m: reports.append(e))
    assert producer.flush(20) == 0
    assert reports == [None]


def test_kafka_sasl_ssl_with_a_wrong_scram_password_is_refused(sasl_ssl_broker, pki, uid):
    """Last of the module's SASL_SSL tests: librdkafka retries at once, and the broker then
    refuses this address for a minute (the failed-login rate limit)."""
    errors: list = []
    conf = sasl_ssl_conf(sasl_ssl_broker, pki, "SCRAM-SHA-256", "wrong", message_timeout_ms=5000)
    refused = ck.Producer({**conf, "error_cb": errors.append})
    refused.produce(f"sasl-ssl-{uid}", value=b"never")
    refused.flush(8)
    assert any(e.code() == ck.KafkaError._AUTHENTICATION for e in errors), errors
