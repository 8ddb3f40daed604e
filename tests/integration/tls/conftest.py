"""TLS listeners with real clients: a test PKI made per module (tests/fixtures/tls.py), and
brokers started with it.

- ``tls_broker``: ``--tls-cert``/``--tls-key`` only: every listener also on TLS, any client
  that trusts the CA may connect.
- ``mtls_broker``: also ``--tls-ca`` (client certificates required and verified) and
  ``--tls-cert-as-username true``, anonymous clients refused; ``alice`` is a user,
  ``mallory`` has a certificate from the CA but is no user.
"""

from __future__ import annotations

import ssl
import threading
import time
from collections.abc import Iterator

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from tests.fixtures.broker_process import BrokerProcess, start_broker
from tests.fixtures.brokers import no_broker_tracebacks, uid  # noqa: F401
from tests.fixtures.cli import flowmq_user
from tests.fixtures.tls import KeyPair, Pki, make_pki

HOST = "127.0.0.1"
TIMEOUT = 10.0


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def tls_args(pki: Pki) -> list[str]:
    return ["--tls-cert", str(pki.server.cert), "--tls-key", str(pki.server.key)]


@pytest.fixture(scope="module")
def tls_broker(pki, tmp_path_factory) -> Iterator[BrokerProcess]:
    proc = start_broker(tmp_path_factory.mktemp("tls") / "data", *tls_args(pki))
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def mtls_broker(pki, tmp_path_factory) -> Iterator[BrokerProcess]:
    data_dir = tmp_path_factory.mktemp("mtls") / "data"
    added = flowmq_user(data_dir, "add", "alice", "--password", "wonderland")
    assert added.returncode == 0, added.stderr
    proc = start_broker(
        data_dir,
        *tls_args(pki),
        "--tls-ca",
        str(pki.ca),
        "--tls-cert-as-username",
        "true",
        "--allow-anonymous",
        "false",
        "--acl-default",
        "allow",
    )
    yield proc
    proc.stop()


def client_context(pki: Pki, cert: KeyPair | None = None) -> ssl.SSLContext:
    """What a client trusting the test CA uses, presenting ``cert`` if given."""
    context = ssl.create_default_context(cafile=str(pki.ca))
    if cert is not None:
        context.load_cert_chain(str(cert.cert), str(cert.key))
    return context


def mqtt_tls_client(
    pki: Pki, protocol: int, cert: KeyPair | None = None, client_id: str = ""
) -> mqtt.Client:
    """A paho client set up for TLS with the test CA (``tls_set``, as its users do)."""
    client = mqtt.Client(
        CallbackAPIVersion.VERSION2,
        protocol=protocol,
        client_id=client_id or f"tls-{time.monotonic_ns()}",
    )
    client.tls_set(
        ca_certs=str(pki.ca),
        certfile=str(cert.cert) if cert else None,
        keyfile=str(cert.key) if cert else None,
    )
    return client


def mqtt_connack(
    port: int,
    pki: Pki,
    protocol: int,
    cert: KeyPair | None = None,
    username: str | None = None,
    password: str | None = None,
) -> int | None:
    """The CONNACK reason code (paho shows 3.1.1 return codes 4 and 5 as 0x86 and 0x87) a
    paho client gets over TLS, or None when the connection failed before any CONNACK (the
    TLS handshake was refused)."""
    client = mqtt_tls_client(pki, protocol, cert)
    result: list[int] = []
    done = threading.Event()

    def on_connect(client, userdata, flags, reason_code, properties):
        result.append(reason_code.value)
        done.set()

    client.on_connect = on_connect
    client.on_disconnect = lambda *args: done.set()
    client.on_connect_fail = lambda *args: done.set()
    if username is not None:
        client.username_pw_set(username, password)
    try:
        client.connect(HOST, port)
    except (ssl.SSLError, OSError):  # TLS 1.2: the handshake itself fails
        return None
    client.loop_start()
    try:
        assert done.wait(TIMEOUT), "neither a CONNACK nor a disconnection"
    finally:
        client.disconnect()
        client.loop_stop()
    return result[0] if result else None
