"""Shared helpers for the Kafka integration tests: real clients over real sockets.

- ``broker``: one ``flowmq serve`` OS process per test module (ports 0, tmp dirs, so
  pytest-xdist workers never collide); tests use unique topic and group names (``uid``).
- ``fresh_broker``: a process of the test's own, for tests that kill or restart it.
- ``RawKafka``: a socket speaking the protocol through kafka-python's generated classes, for
  what a client library will not do (old or unknown versions, bad bytes, repeated batches).
- ``confluent_conf``: librdkafka settings with short timeouts and its logging kept quiet.
"""

from __future__ import annotations

import logging
import socket
import struct
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from flowmq_wire.kafka import REQUEST_CLASSES, RESPONSE_CLASSES
from tests.fixtures import waiting
from tests.fixtures.broker_process import BrokerProcess
from tests.fixtures.brokers import broker_fixtures, no_broker_tracebacks, uid  # noqa: F401

HOST = "127.0.0.1"
TIMEOUT = 10.0


broker, fresh_broker = broker_fixtures("kafka")


def bootstrap(broker: BrokerProcess) -> str:
    return f"{HOST}:{broker.ports['kafka']}"


_QUIET = logging.getLogger("librdkafka-in-tests")
_QUIET.addHandler(logging.NullHandler())
_QUIET.propagate = False


def confluent_conf(broker: BrokerProcess, **extra: Any) -> dict[str, Any]:
    """librdkafka settings for tests: fast metadata/retries, logs to a silent logger."""
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap(broker),
        "logger": _QUIET,
        "topic.metadata.refresh.interval.ms": 2000,
        "socket.connection.setup.timeout.ms": 5000,
    }
    conf.update({k.replace("_", "."): v for k, v in extra.items()})
    return conf


def wait_until(predicate: Callable[[], Any], timeout: float = TIMEOUT, step: float = 0.05) -> Any:
    return waiting.wait_until(predicate, timeout, step)


def scrape(broker: BrokerProcess) -> str:
    with urllib.request.urlopen(broker.http + "/metrics", timeout=TIMEOUT) as r:
        return r.read().decode()


def metric(broker: BrokerProcess, sample: str) -> float:
    for line in scrape(broker).splitlines():
        if line.startswith(sample + " "):
            return float(line.split()[-1])
    return 0.0


class Closed(Exception):
    """The broker closed the connection."""


class RawKafka:
    """One socket; requests built with kafka-python's classes, responses decoded by them."""

    def __init__(self, port: int, source: str | None = None) -> None:
        """``source``: the client's address (a 127.x.y.z of its own; default the OS's)."""
        self.sock = socket.create_connection(
            (HOST, port), timeout=TIMEOUT, source_address=(source, 0) if source else None
        )
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buf = b""
        self._cid = 0

    def send(self, api_key: int, version: int, **fields: Any) -> int:
        cls = REQUEST_CLASSES[api_key][version]
        request = cls(**fields)
        self._cid += 1
        request.with_header(correlation_id=self._cid, client_id="raw-test")
        self.sock.sendall(bytes(request.encode(header=True, framed=True)))
        return self._cid

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv_frame(self, timeout: float = TIMEOUT) -> bytes:
        self.sock.settimeout(timeout)
        while True:
            if len(self._buf) >= 4:
                (size,) = struct.unpack_from(">i", self._buf)
                if len(self._buf) >= 4 + size:
                    frame, self._buf = self._buf[4 : 4 + size], self._buf[4 + size :]
                    return frame
            try:
                chunk = self.sock.recv(1 << 20)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                raise Closed
            self._buf += chunk

    def recv(self, api_key: int, version: int, timeout: float = TIMEOUT) -> Any:
        frame = self.recv_frame(timeout)
        return RESPONSE_CLASSES[api_key][version].decode(frame, header=True)

    def request(self, api_key: int, version: int, **fields: Any) -> Any:
        cid = self.send(api_key, version, **fields)
        response = self.recv(api_key, version)
        assert response.header.correlation_id == cid
        return response

    def is_closed(self, timeout: float = 3.0) -> bool:
        try:
            self.recv_frame(timeout)
        except Closed:
            return True
        except TimeoutError:
            return False
        return False

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def raw(broker) -> Iterator[Callable[[], RawKafka]]:
    made: list[RawKafka] = []

    def make() -> RawKafka:
        client = RawKafka(broker.ports["kafka"])
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()
