"""Helpers for the AMQP integration tests: real clients (pika, aio-pika) over real sockets.

- ``broker``: one ``flowmq serve`` process per test module (ports 0, tmp dirs: xdist-safe);
  tests sharing it use unique queue and topic names (``uid``).
- ``fresh_broker``: a process of the test's own (restarts, crashes, users).
- ``connect(port)``: a pika BlockingConnection; ``RawAmqp``: a socket speaking AMQP through
  pamqp (an independent codec) for what a library client cannot do (send bad frames).
- ``inproc``: an in-process Broker on its own loop thread, for reaching into it.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import pika
import pytest
from pamqp import commands, frame, header

from tests.fixtures.brokers import (  # noqa: F401
    broker_fixtures,
    logged_errors,
    no_broker_tracebacks,
    uid,
)
from tests.fixtures.inprocess import broker_config
from tests.fixtures.threaded_broker import ThreadedBroker

HOST = "127.0.0.1"
TIMEOUT = 10.0


broker, fresh_broker = broker_fixtures("amqp")


def connect(port: int, **params: Any) -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters(HOST, port, connection_attempts=3, retry_delay=0.2, **params)
    )


@pytest.fixture
def amqp(broker) -> Iterator[Callable[..., pika.BlockingConnection]]:
    """``amqp()``: a BlockingConnection to the module broker, closed at teardown."""
    made: list[pika.BlockingConnection] = []

    def make(port: int | None = None, **params: Any) -> pika.BlockingConnection:
        conn = connect(port or broker.ports["amqp"], **params)
        made.append(conn)
        return conn

    yield make
    for conn in made:
        if conn.is_open:
            try:
                conn.close()
            except Exception:
                pass


def drain(channel: Any, queue: str, n: int, *, ack: bool = True, timeout: float = TIMEOUT):
    """Consume ``n`` messages from ``queue`` (acking them), as (method, properties, body)."""
    out = []
    deadline = time.monotonic() + timeout
    for method, props, body in channel.consume(queue, inactivity_timeout=0.2):
        if method is not None:
            out.append((method, props, body))
            if ack:
                channel.basic_ack(method.delivery_tag)
            if len(out) == n:
                break
        if time.monotonic() > deadline:
            break
    channel.cancel()
    return out


def nothing_more(channel: Any, queue: str, wait: float = 0.5) -> None:
    for method, _, body in channel.consume(queue, inactivity_timeout=wait):
        channel.cancel()
        assert method is None, f"unexpected message {body!r}"
        return


# --- a raw client over pamqp ---------------------------------------------------------------
class Closed(Exception):
    pass


class RawAmqp:
    """A socket speaking AMQP through pamqp, one frame at a time."""

    def __init__(self, port: int, source: str | None = None) -> None:
        """``source``: the client's address (a 127.x.y.z of its own; default the OS's)."""
        self.sock = socket.create_connection(
            (HOST, port), timeout=TIMEOUT, source_address=(source, 0) if source else None
        )
        self.buffer = b""

    def send(self, *frames: tuple[Any, int]) -> None:
        self.sock.sendall(b"".join(frame.marshal(f, ch) for f, ch in frames))

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv(self, timeout: float = TIMEOUT) -> tuple[int, Any]:
        deadline = time.monotonic() + timeout
        while True:
            if self.buffer:
                try:
                    used, channel, value = frame.unmarshal(self.buffer)
                except Exception:
                    used = 0
                if used:
                    self.buffer = self.buffer[used:]
                    return channel, value
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no frame")
            self.sock.settimeout(remaining)
            data = self.sock.recv(65536)
            if not data:
                raise Closed
            self.buffer += data

    def expect(self, cls: type) -> Any:
        _, value = self.recv()
        while isinstance(value, commands.Basic.Deliver | header.ContentHeader) or type(
            value
        ).__name__ in ("ContentBody", "Heartbeat"):
            _, value = self.recv()
        assert isinstance(value, cls), f"expected {cls.__name__}, got {value!r}"
        return value

    def handshake(self, vhost: str = "/", user: str = "guest", password: str = "guest") -> Any:
        """Up to Connection.OpenOk; returns what answered the Open."""
        self.send_raw(b"AMQP\x00\x00\x09\x01")
        self.expect(commands.Connection.Start)
        self.send(
            (commands.Connection.StartOk(response=f"\0{user}\0{password}", mechanism="PLAIN"), 0)
        )
        tune = self.expect(commands.Connection.Tune)
        self.send((commands.Connection.TuneOk(tune.channel_max, tune.frame_max, 0), 0))
        self.send((commands.Connection.Open(virtual_host=vhost), 0))
        return self.recv()[1]

    def open_channel(self, channel: int = 1) -> None:
        """Handshake, then open ``channel``."""
        self.handshake()
        self.send((commands.Channel.Open(), channel))
        self.expect(commands.Channel.OpenOk)

    def closed_with(self) -> commands.Connection.Close:
        """The Connection.Close the broker sends (answered with CloseOk)."""
        close = self.expect(commands.Connection.Close)
        self.send((commands.Connection.CloseOk(), 0))
        return close

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def raw(broker) -> Iterator[Callable[[], RawAmqp]]:
    made: list[RawAmqp] = []

    def make() -> RawAmqp:
        client = RawAmqp(broker.ports["amqp"])
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


# --- an in-process broker ------------------------------------------------------------------
@pytest.fixture
def inproc(tmp_path, caplog) -> Iterator[ThreadedBroker]:
    """An in-process broker; like the subprocess ones, it must log no error during the test."""
    config = broker_config(tmp_path / "data", node_id="amqp-test")
    tb = ThreadedBroker(config, timeout=TIMEOUT).start()
    yield tb
    errors = logged_errors(caplog)
    tb.stop()
    assert not errors, errors
