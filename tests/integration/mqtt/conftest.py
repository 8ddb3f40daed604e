"""Shared helpers for the MQTT integration tests: real clients over real sockets.

- ``broker``: one ``flowmq serve`` OS process per test module (xdist-safe: ports 0, tmp dirs).
  Tests that share it use unique client ids and topics (the ``uid`` fixture).
- ``fresh_broker``: a process of the test's own, for tests that restart it or need isolation.
- ``Paho``: a paho-mqtt 2.x client driven from the test thread with queues and events, no
  sleeps; ``paho`` is a factory fixture that closes every client it made.
- ``RawClient``: a plain socket speaking the project's codec, for what a library client
  cannot do (stay silent, die mid-flow, send bad bytes, decode exactly what the broker sent).
- ``ThreadedBroker``: an in-process ``Broker`` running on its own event loop in a thread, so
  that a test can reach into it (the authorisation hook) while using blocking clients.
"""

from __future__ import annotations

import queue
import re
import socket
import struct
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from flowmq_wire.mqtt.codec import MqttDecoder, encode
from flowmq_wire.mqtt.packets import (
    Connack,
    Connect,
    Disconnect,
    Pingresp,
    Puback,
    Publish,
    Suback,
    Subscribe,
    SubscriptionOptions,
    Will,
)
from tests.fixtures.admin_http import api_call
from tests.fixtures.broker_process import BrokerProcess, start_broker
from tests.fixtures.brokers import (  # noqa: F401
    broker_fixtures,
    logged_errors,
    no_broker_tracebacks,
    uid,
)
from tests.fixtures.inprocess import broker_config
from tests.fixtures.threaded_broker import ThreadedBroker as SharedThreadedBroker
from tests.fixtures.waiting import wait_until as _wait_until

HOST = "127.0.0.1"
TIMEOUT = 5.0
# The MQTT tests need the MQTT listener and the HTTP API only; other listeners stay off so a
# problem in one of them does not fail these tests (and starts are quicker).
ROLES = ("--roles", "mqtt,admin")
QUIET = 0.4  # how long to wait when asserting that something does NOT arrive


# --- brokers ----------------------------------------------------------------------------------
broker, fresh_broker = broker_fixtures("mqtt", *ROLES)


def broker_with(data_dir: Path, *flags: str) -> Iterator[BrokerProcess]:
    """For a fixture: a broker of these tests' roles started with ``flags`` (a limit set
    small, ...), stopped afterwards."""
    proc = start_broker(data_dir, *ROLES, *flags)
    yield proc
    proc.stop()


class ThreadedBroker(SharedThreadedBroker):
    """The shared in-process broker with MQTT and the admin API, and its HTTP address."""

    def __init__(self, data_dir: Path, token: str = "test-token") -> None:
        self.token = token
        config = broker_config(data_dir, node_id="mqtt-test", token=token, roles=["mqtt", "admin"])
        super().__init__(config, timeout=TIMEOUT)

    @property
    def http(self) -> str:
        return f"http://{HOST}:{self.ports['http']}"


@pytest.fixture
def inproc_broker(tmp_path, caplog) -> Iterator[ThreadedBroker]:
    """An in-process broker; like the subprocess ones, it must log no error during the test."""
    tb = ThreadedBroker(tmp_path / "data").start()
    yield tb
    errors = logged_errors(caplog)
    tb.stop()
    assert not errors, errors


# --- paho ---------------------------------------------------------------------------------
def _value(code: Any) -> int:
    return code.value if hasattr(code, "value") else int(code)


class Paho:
    """A paho-mqtt client whose callbacks feed queues; every wait is bounded."""

    def __init__(
        self,
        port: int,
        client_id: str = "",
        *,
        v5: bool = True,
        clean: bool = True,
        manual_ack: bool = False,
        keepalive: int = 60,
    ) -> None:
        self.port = port
        self.v5 = v5
        self.clean = clean
        self.keepalive = keepalive
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id,
            protocol=mqtt.MQTTv5 if v5 else mqtt.MQTTv311,
            clean_session=None if v5 else clean,
            manual_ack=manual_ack,
            reconnect_on_failure=False,
        )
        self.messages: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
        self.disconnects: queue.Queue[tuple[int, Any]] = queue.Queue()
        self.connack: tuple[Any, int, Any] | None = None
        self._connected = threading.Event()
        self._results: dict[tuple[str, int], Any] = {}
        self._cond = threading.Condition()
        c = self.client
        c.on_connect = self._on_connect
        c.on_message = lambda _c, _u, m: self.messages.put(m)
        c.on_subscribe = lambda _c, _u, mid, codes, props: self._result("sub", mid, codes)
        c.on_unsubscribe = lambda _c, _u, mid, codes, props: self._result("unsub", mid, codes)
        c.on_publish = lambda _c, _u, mid, code, props: self._result("pub", mid, code)
        c.on_disconnect = lambda _c, _u, flags, code, props: self.disconnects.put(
            (_value(code), props)
        )

    # callbacks (network thread)
    def _on_connect(self, _c, _u, flags, code, props) -> None:
        self.connack = (flags, _value(code), props)
        self._connected.set()

    def _result(self, kind: str, mid: int, value: Any) -> None:
        with self._cond:
            self._results[(kind, mid)] = value
            self._cond.notify_all()

    def _wait_result(self, kind: str, mid: int, timeout: float = TIMEOUT) -> Any:
        with self._cond:
            ok = self._cond.wait_for(lambda: (kind, mid) in self._results, timeout)
            assert ok, f"no {kind} acknowledgement for mid {mid} within {timeout} s"
            return self._results.pop((kind, mid))

    # API (test thread)
    def connect(
        self,
        *,
        clean_start: bool | None = None,
        properties: dict[str, Any] | None = None,
        will: tuple | None = None,
        expect_success: bool = True,
    ) -> tuple[bool, int, Any]:
        """Connect and wait for CONNACK; return (session_present, reason code, properties)."""
        c = self.client
        if will is not None:
            topic, payload, qos, retain, *rest = will
            c.will_set(topic, payload, qos, retain, properties=rest[0] if rest else None)
        kwargs: dict[str, Any] = {"keepalive": self.keepalive}
        if self.v5:
            kwargs["clean_start"] = self.clean if clean_start is None else clean_start
            if properties:
                kwargs["properties"] = props(PacketTypes.CONNECT, **properties)
        self._connected.clear()
        c.connect(HOST, self.port, **kwargs)
        c.loop_start()
        assert self._connected.wait(TIMEOUT), "no CONNACK"
        assert self.connack is not None
        flags, code, cprops = self.connack
        if expect_success:
            assert code == 0, f"CONNACK refused: 0x{code:02X}"
        return flags.session_present, code, cprops

    def subscribe(
        self,
        topic: str,
        qos: int = 0,
        *,
        no_local: bool = False,
        retain_as_published: bool = False,
        retain_handling: int = 0,
        sub_id: int | None = None,
    ) -> list[int]:
        if self.v5:
            opts = SubscribeOptions(
                qos=qos,
                noLocal=no_local,
                retainAsPublished=retain_as_published,
                retainHandling=retain_handling,
            )
            properties = None
            if sub_id is not None:
                properties = props(PacketTypes.SUBSCRIBE, SubscriptionIdentifier=sub_id)
            rc, mid = self.client.subscribe(topic, options=opts, properties=properties)
        else:
            rc, mid = self.client.subscribe(topic, qos)
        assert rc == mqtt.MQTT_ERR_SUCCESS, rc
        return [_value(code) for code in self._wait_result("sub", mid)]

    def unsubscribe(self, *topics: str) -> list[int]:
        rc, mid = self.client.unsubscribe(list(topics))
        assert rc == mqtt.MQTT_ERR_SUCCESS, rc
        codes = self._wait_result("unsub", mid)
        return [_value(code) for code in codes] if isinstance(codes, list) else []

    def publish(
        self,
        topic: str,
        payload: bytes | str = b"",
        qos: int = 0,
        retain: bool = False,
        properties: dict[str, Any] | None = None,
    ) -> int:
        """Publish and wait until it is acknowledged (QoS 1/2) or written (QoS 0); return the
        reason code of the PUBACK / PUBREC (0 for QoS 0 and for 3.1.1)."""
        p = props(PacketTypes.PUBLISH, **properties) if properties else None
        info = self.client.publish(topic, payload, qos, retain, properties=p)
        assert info.rc == mqtt.MQTT_ERR_SUCCESS, info.rc
        return _value(self._wait_result("pub", info.mid))

    def get(self, timeout: float = TIMEOUT) -> mqtt.MQTTMessage:
        try:
            return self.messages.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no message within {timeout} s") from None

    def expect(self, n: int, timeout: float = TIMEOUT) -> list[mqtt.MQTTMessage]:
        deadline = time.monotonic() + timeout
        out = []
        for _ in range(n):
            remaining = deadline - time.monotonic()
            try:
                out.append(self.messages.get(timeout=max(0.0, remaining)))
            except queue.Empty:
                got = [(m.topic, m.payload) for m in out]
                raise AssertionError(f"expected {n} messages, got {len(out)}: {got}") from None
        return out

    def expect_none(self, wait: float = QUIET) -> None:
        try:
            m = self.messages.get(timeout=wait)
        except queue.Empty:
            return
        raise AssertionError(f"unexpected message {m.topic!r} {m.payload!r} qos={m.qos}")

    def drain(self, wait: float = QUIET) -> list[mqtt.MQTTMessage]:
        """Everything that arrives until ``wait`` passes without a message."""
        out = []
        while True:
            try:
                out.append(self.messages.get(timeout=wait))
            except queue.Empty:
                return out

    def wait_disconnect(self, timeout: float = TIMEOUT) -> tuple[int, Any]:
        try:
            return self.disconnects.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"not disconnected within {timeout} s") from None

    def close(self) -> None:
        if self.client.is_connected():
            self.client.disconnect()
        self.client.loop_stop()


def props(packet_type: int, **values: Any) -> Properties:
    """paho Properties from keyword arguments (``ContentType="x"``, ``UserProperty=[...]``)."""
    p = Properties(packet_type)
    for name, value in values.items():
        setattr(p, name, value)
    return p


def connected(make: Callable[..., Paho], client_id: str, **kwargs: Any) -> Paho:
    """``make(client_id, **kwargs)`` (the ``paho`` factory or alike), connected."""
    client = make(client_id, **kwargs)
    client.connect()
    return client


def subscribed(
    make: Callable[..., Paho], client_id: str, topic: str, qos: int = 1, **kwargs: Any
) -> Paho:
    """A connected client (see ``connected``) subscribed to ``topic`` at ``qos``."""
    client = connected(make, client_id, **kwargs)
    client.subscribe(topic, qos)
    return client


@pytest.fixture
def paho(broker) -> Iterator[Callable[..., Paho]]:
    """``paho(client_id, v5=True, ...)``: an unconnected Paho on the module broker."""
    made: list[Paho] = []

    def make(client_id: str = "", *, port: int | None = None, **kwargs: Any) -> Paho:
        client = Paho(port or broker.ports["mqtt"], client_id, **kwargs)
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


# --- raw sockets ---------------------------------------------------------------------------
class Closed(Exception):
    """The broker closed the connection."""


class RawClient:
    """A socket speaking MQTT through the project's codec, one packet at a time."""

    def __init__(self, port: int, level: int = 5, *, sock: socket.socket | None = None) -> None:
        self.level = level
        self.sock = sock or socket.create_connection((HOST, port), timeout=TIMEOUT)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.decoder = MqttDecoder(server=False, protocol_level=level, max_packet_size=None)
        self.pending: list[Any] = []
        self.closed = False
        self._next_id = 0

    def packet_id(self) -> int:
        self._next_id = self._next_id % 65535 + 1
        return self._next_id

    def send(self, *packets: Any) -> None:
        self.send_raw(b"".join(encode(p, self.level) for p in packets))

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _read(self, timeout: float) -> None:
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(1 << 20)
        except ConnectionResetError:
            data = b""
        if not data:
            self.closed = True
            raise Closed
        self.pending.extend(self.decoder.feed(data))

    def recv(self, timeout: float = TIMEOUT) -> Any:
        """The next packet; raises Closed, or TimeoutError (socket.timeout)."""
        deadline = time.monotonic() + timeout
        while not self.pending:
            if self.closed:
                raise Closed
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no packet within {timeout} s")
            self._read(remaining)
        return self.pending.pop(0)

    def expect(self, cls: type, timeout: float = TIMEOUT, *, skip=(Pingresp,)) -> Any:
        p = self.recv(timeout)
        while isinstance(p, skip):
            p = self.recv(timeout)
        assert isinstance(p, cls), f"expected {cls.__name__}, got {p!r}"
        return p

    def expect_nothing(self, wait: float = QUIET) -> None:
        try:
            p = self.recv(wait)
        except TimeoutError:
            return
        raise AssertionError(f"unexpected packet {p!r}")

    def wait_closed(self, timeout: float = TIMEOUT) -> list[Any]:
        """Wait for the broker to close the connection; return the packets it sent first."""
        got = []
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"connection still open after {timeout} s; got {got}")
            try:
                got.append(self.recv(remaining))
            except Closed:
                return got
            except TimeoutError:
                continue

    def connect(
        self,
        client_id: str,
        *,
        clean_start: bool = True,
        keep_alive: int = 60,
        will: Will | None = None,
        properties: dict[str, Any] | None = None,
        username: str | None = None,
        password: bytes | None = None,
        expect_success: bool = True,
    ) -> Connack:
        self.send(
            Connect(
                client_id,
                clean_start,
                keep_alive,
                will,
                username,
                password,
                properties or {},
                protocol_level=self.level,
            )
        )
        ack = self.expect(Connack)
        if expect_success:
            assert ack.reason_code == 0, f"CONNACK refused: 0x{ack.reason_code:02X}"
        return ack

    def subscribe(
        self,
        *filters: tuple[str, SubscriptionOptions] | str,
        sub_id: int | None = None,
    ) -> list[int]:
        subs = [(f, SubscriptionOptions()) if isinstance(f, str) else f for f in filters]
        properties = {"subscription_identifier": sub_id} if sub_id else {}
        pid = self.packet_id()
        self.send(Subscribe(pid, subs, properties))
        ack = self.expect(Suback)
        assert ack.packet_id == pid
        return list(ack.reason_codes)

    def publish(
        self,
        topic: str,
        payload: bytes = b"",
        qos: int = 0,
        *,
        retain: bool = False,
        properties: dict[str, Any] | None = None,
    ) -> Any:
        """Publish; for QoS 1 return the PUBACK (for QoS 2 the caller does the rest)."""
        pid = self.packet_id() if qos else None
        self.send(Publish(topic, payload, qos, retain, False, pid, properties or {}))
        if qos == 1:
            ack = self.expect(Puback)
            assert ack.packet_id == pid
            return ack
        return pid

    def disconnect(self, reason: int = 0, properties: dict[str, Any] | None = None) -> None:
        self.send(Disconnect(reason, properties or {}))
        self.sock.close()
        self.closed = True

    def kill(self) -> None:
        """Drop the connection abruptly (RST, no DISCONNECT) — a crashed client."""
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        self.sock.close()
        self.closed = True

    def close(self) -> None:
        self.sock.close()
        self.closed = True


@pytest.fixture
def raw(broker) -> Iterator[Callable[..., RawClient]]:
    """``raw(level=5)``: a RawClient on the module broker (closed at teardown)."""
    made: list[RawClient] = []

    def make(level: int = 5, *, port: int | None = None) -> RawClient:
        client = RawClient(port or broker.ports["mqtt"], level)
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


# --- HTTP ------------------------------------------------------------------------------------
def http(
    base: str, method: str, path: str, token: str | None = None, body: Any = None
) -> tuple[int, Any]:
    return api_call(method, base + path, body, token, TIMEOUT)


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def scrape(base: str) -> dict[str, float]:
    """GET /metrics as {'name{labels}': value} (and 'name' for unlabelled samples)."""
    with urllib.request.urlopen(base + "/metrics", timeout=TIMEOUT) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def rejections(broker: BrokerProcess, limit: str) -> float:
    """``limits_rejections_count{limit=...}`` of ``broker`` now."""
    return scrape(broker.http).get(f'limits_rejections_count{{limit="{limit}"}}', 0.0)


def wait_until(predicate: Callable[[], Any], timeout: float = TIMEOUT, step: float = 0.02) -> Any:
    """Poll ``predicate`` until it returns something truthy (for state only visible by polling:
    metrics, the admin API). Raises AssertionError on timeout."""
    return _wait_until(predicate, timeout, step)


def roundtrip(port: int, tag: str = "") -> None:
    """A well-behaved paho v5 client can still connect, subscribe and receive."""
    tag = tag or uuid.uuid4().hex[:8]
    c = Paho(port, f"check-{tag}")
    try:
        c.connect()
        assert c.subscribe(f"check/{tag}", 1) == [1]
        c.publish(f"check/{tag}", b"alive", 1)
        m = c.get()
        assert (m.topic, m.payload) == (f"check/{tag}", b"alive")
    finally:
        c.close()


@pytest.fixture
def still_serves(broker, paho, uid):  # noqa: F811 (uid is the imported fixture)
    """A v5 client connected before the bad input; after it, it must still get messages, and
    a new client must still connect."""
    watcher = subscribed(paho, f"watch-{uid}", f"alive/{uid}", 1, v5=True)

    def check() -> None:
        watcher.publish(f"alive/{uid}", b"still here", 1)
        assert watcher.get().payload == b"still here"
        roundtrip(broker.ports["mqtt"])

    return check
