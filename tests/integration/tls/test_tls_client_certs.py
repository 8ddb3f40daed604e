"""``tls_ca``: every TLS client must present a certificate the CA signed, else its handshake
fails; ``tls_cert_as_username``: the certificate's subject CN is the user, logged in without
a password (MQTT in place of the CONNECT user name, Kafka as the SSL principal) and refused
when it names no user.  The broker refuses anonymous clients, so only the certificate can
have let them in."""

from __future__ import annotations

import logging
import socket
import ssl
import urllib.error
import urllib.request

import paho.mqtt.client as mqtt
import pika
import pytest

from tests.integration.tls.conftest import HOST, TIMEOUT, client_context, mqtt_connack

ck = pytest.importorskip("confluent_kafka")

V311, V5 = mqtt.MQTTv311, mqtt.MQTTv5

_QUIET = logging.getLogger("librdkafka-in-tls-tests")
_QUIET.addHandler(logging.NullHandler())
_QUIET.propagate = False


@pytest.mark.parametrize("protocol", [V311, V5], ids=["v311", "v5"])
def test_mqtt_client_without_a_certificate_is_refused(mtls_broker, pki, protocol):
    port = mtls_broker.ports["mqtt_tls"]
    assert mqtt_connack(port, pki, protocol, None, "alice", "wonderland") is None


def test_mqtt_certificate_of_another_ca_is_refused(mtls_broker, pki):
    port = mtls_broker.ports["mqtt_tls"]
    assert mqtt_connack(port, pki, V5, pki.stranger) is None  # CN alice, the wrong CA


@pytest.mark.parametrize("protocol", [V311, V5], ids=["v311", "v5"])
@pytest.mark.parametrize(
    ("username", "password"),
    [(None, None), ("mallory", "not a password")],
    ids=["no-credentials", "other-credentials"],
)
def test_mqtt_certificate_cn_is_the_user(mtls_broker, pki, protocol, username, password):
    port = mtls_broker.ports["mqtt_tls"]
    alice = pki.clients["alice"]
    assert mqtt_connack(port, pki, protocol, alice, username, password) == 0


@pytest.mark.parametrize("protocol", [V311, V5], ids=["v311", "v5"])
def test_mqtt_certificate_cn_that_is_no_user_is_refused(mtls_broker, pki, protocol):
    port = mtls_broker.ports["mqtt_tls"]
    # 0x86 bad user name or password (3.1.1: return code 4)
    assert mqtt_connack(port, pki, protocol, pki.clients["mallory"], "alice", "wonderland") == 0x86


def test_https_needs_a_client_certificate(mtls_broker, pki):
    url = f"https://localhost:{mtls_broker.ports['http_tls']}/metrics"
    with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
        urllib.request.urlopen(url, timeout=TIMEOUT, context=client_context(pki)).read()
    alice = client_context(pki, pki.clients["alice"])
    with urllib.request.urlopen(url, timeout=TIMEOUT, context=alice) as response:
        assert response.status == 200


def test_kafka_certificate_cn_is_the_principal(mtls_broker, pki, uid):
    """Anonymous Kafka clients are closed before any request but SASL's: a produce over SSL
    with alice's certificate and no SASL succeeds only as her."""
    alice = pki.clients["alice"]
    conf = {
        "bootstrap.servers": f"{HOST}:{mtls_broker.ports['kafka_tls']}",
        "security.protocol": "SSL",
        "ssl.ca.location": str(pki.ca),
        "ssl.certificate.location": str(alice.cert),
        "ssl.key.location": str(alice.key),
        "logger": _QUIET,
        "message.timeout.ms": 15000,
    }
    producer = ck.Producer(conf)
    reports: list = []
    producer.produce(f"cn-{uid}", value=b"from alice", on_delivery=lambda e, m: reports.append(e))
    assert producer.flush(20) == 0
    assert reports == [None]


def test_kafka_certificate_cn_that_is_no_user_is_closed(mtls_broker, pki):
    """Closed once the handshake is done, before any request (a client that the mapping
    let through would be waited on for its first request)."""
    context = client_context(pki, pki.clients["mallory"])
    port = mtls_broker.ports["kafka_tls"]
    with (
        socket.create_connection((HOST, port), timeout=TIMEOUT) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        try:
            assert tls.recv(1) == b""
        except (ssl.SSLError, ConnectionResetError):
            pass  # closed without a TLS close_notify: closed all the same


def _amqp_with_certificate(broker, pki, name: str) -> pika.BlockingConnection:
    """pika over amqps with ``name``'s client certificate and SASL EXTERNAL, no password."""
    return pika.BlockingConnection(
        pika.ConnectionParameters(
            HOST,
            broker.ports["amqp_tls"],
            credentials=pika.credentials.ExternalCredentials(),
            ssl_options=pika.SSLOptions(client_context(pki, pki.clients[name]), "localhost"),
            connection_attempts=1,
            blocked_connection_timeout=TIMEOUT,
        )
    )


def test_amqp_certificate_cn_is_the_login_with_external(mtls_broker, pki, uid):
    connection = _amqp_with_certificate(mtls_broker, pki, "alice")
    try:
        channel = connection.channel()
        channel.confirm_delivery()  # the get below must not race the durable write
        queue = f"cn-{uid}"
        channel.queue_declare(queue, durable=True)
        channel.basic_publish("", queue, b"from alice")
        method, _, body = channel.basic_get(queue, auto_ack=True)
        assert method is not None and body == b"from alice"
    finally:
        connection.close()


def test_amqp_certificate_cn_that_is_no_user_is_refused(mtls_broker, pki):
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        _amqp_with_certificate(mtls_broker, pki, "mallory")
