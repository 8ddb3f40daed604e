"""MQTT over WebSocket (``mqtt_ws_port``, path ``/mqtt``, subprotocol ``mqtt``): real paho
clients with ``transport="websockets"``, talking to TCP clients through one broker."""

from __future__ import annotations

import asyncio
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import aiohttp
import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from flowmq_wire.mqtt import reason_codes as rc
from flowmq_wire.mqtt.codec import MqttDecoder, encode
from flowmq_wire.mqtt.packets import Connack, Connect, Disconnect, Publish, Pubrec
from tests.fixtures.broker_process import BrokerProcess, start_broker
from tests.fixtures.cli import flowmq_user
from tests.fixtures.tls import make_pki

from .conftest import HOST, ROLES, TIMEOUT, Paho

CALLBACKS = ("on_connect", "on_message", "on_subscribe", "on_unsubscribe", "on_publish")


class WsPaho(Paho):
    """The conftest ``Paho``, over WebSocket (``ws://host:port/<path>``)."""

    def __init__(self, port: int, client_id: str = "", *, path: str = "/mqtt", **kwargs: Any):
        super().__init__(port, client_id, **kwargs)
        tcp = self.client
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id,
            protocol=mqtt.MQTTv5 if self.v5 else mqtt.MQTTv311,
            clean_session=None if self.v5 else self.clean,
            reconnect_on_failure=False,
            transport="websockets",
        )
        for name in (*CALLBACKS, "on_disconnect"):
            setattr(self.client, name, getattr(tcp, name))
        self.client.ws_set_options(path=path)


@pytest.fixture(scope="module")
def broker(tmp_path_factory) -> Iterator[BrokerProcess]:
    data = tmp_path_factory.mktemp("ws") / "data"
    data.mkdir(parents=True)
    done = flowmq_user(data, "add", "alice", "--password", "wonderland")
    assert done.returncode == 0, done.stdout + done.stderr
    # Anonymous clients stay allowed (loopback); alice must give her password.
    proc = start_broker(data, *ROLES, "--acl-default", "allow")
    yield proc
    proc.stop()
    errors = [line for line in proc.output if " ERROR " in line or "Traceback" in line]
    assert not errors, "".join(errors)


@pytest.fixture
def clients(broker) -> Iterator[Any]:
    made: list[Paho] = []

    def make(kind: str, client_id: str, **kwargs: Any) -> Paho:
        if kind == "ws":
            client: Paho = WsPaho(broker.ports["mqtt_ws"], client_id, **kwargs)
        else:
            client = Paho(broker.ports["mqtt"], client_id, **kwargs)
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


def test_ports_json_names_the_websocket_port(broker):
    assert broker.ports["mqtt_ws"] not in (0, broker.ports["mqtt"])
    assert "mqtt_wss" not in broker.ports  # no TLS configured


@pytest.mark.parametrize("v5", [False, True], ids=["3.1.1", "5.0"])
def test_ws_and_tcp_clients_exchange_qos0_and_qos1_both_ways(clients, uid, v5):
    ws = clients("ws", f"ws-{uid}", v5=v5)
    tcp = clients("tcp", f"tcp-{uid}", v5=v5)
    assert ws.connect()[1] == 0
    tcp.connect()
    assert ws.subscribe(f"to-ws/{uid}", 1) == [1]
    assert tcp.subscribe(f"to-tcp/{uid}", 1) == [1]

    tcp.publish(f"to-ws/{uid}", b"zero", qos=0)
    tcp.publish(f"to-ws/{uid}", b"one", qos=1)
    got = ws.expect(2)
    assert [(m.payload, m.qos) for m in got] == [(b"zero", 0), (b"one", 1)]

    ws.publish(f"to-tcp/{uid}", b"zero", qos=0)
    assert ws.publish(f"to-tcp/{uid}", b"one", qos=1) == 0
    got = tcp.expect(2)
    assert [(m.payload, m.qos) for m in got] == [(b"zero", 0), (b"one", 1)]

    # A large payload spanning many TCP segments arrives whole.
    big = bytes(range(256)) * 1024
    ws.subscribe(f"big/{uid}", 1)
    ws.publish(f"big/{uid}", big, qos=1)
    assert ws.get().payload == big


@pytest.mark.parametrize("v5", [False, True], ids=["3.1.1", "5.0"])
def test_retained_message_over_websocket(clients, uid, v5):
    publisher = clients("ws", f"ret-pub-{uid}", v5=v5)
    publisher.connect()
    publisher.publish(f"retained/{uid}", b"kept", qos=1, retain=True)
    for kind in ("ws", "tcp"):
        late = clients(kind, f"ret-{kind}-{uid}", v5=v5)
        late.connect()
        late.subscribe(f"retained/{uid}", 1)
        m = late.get()
        assert (m.payload, m.retain) == (b"kept", True)


@pytest.mark.parametrize("v5", [False, True], ids=["3.1.1", "5.0"])
def test_user_authenticates_over_websocket(clients, uid, v5):
    good = clients("ws", f"alice-{uid}", v5=v5)
    good.client.username_pw_set("alice", "wonderland")
    assert good.connect()[1] == 0
    good.subscribe(f"auth/{uid}", 1)
    good.publish(f"auth/{uid}", b"hi", qos=1)
    assert good.get().payload == b"hi"

    bad = clients("ws", f"mallory-{uid}", v5=v5)
    bad.client.username_pw_set("alice", "not-her-password")
    code = bad.connect(expect_success=False)[1]
    assert code == 0x86  # bad user name or password (paho maps 3.1.1 code 4 to it)


def test_wrong_path_is_refused(broker, clients, uid):
    port = broker.ports["mqtt_ws"]
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"http://{HOST}:{port}/nope", timeout=TIMEOUT)
    assert err.value.code == 404
    lost = clients("ws", f"path-{uid}", path="/nope")
    with pytest.raises(Exception, match="404|WebSocket|handshake|Connection"):
        lost.client.connect(HOST, port)


async def _raw_ws(port: int, frames: list[bytes | str]) -> tuple[str | None, list[Any]]:
    """Open ``/mqtt``, send ``frames`` (bytes: binary, str: text); the negotiated subprotocol
    and every message received until the broker closes the WebSocket."""
    url = f"http://{HOST}:{port}/mqtt"
    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(url, protocols=("mqtt",)) as ws,
    ):
        for frame in frames:
            if isinstance(frame, str):
                await ws.send_str(frame)
            else:
                await ws.send_bytes(frame)
        got = []
        async with asyncio.timeout(TIMEOUT):
            async for msg in ws:
                got.append(msg)
        return ws.protocol, got


def test_subprotocol_mqtt_and_packets_split_or_joined_across_frames(broker, uid):
    connect = encode(Connect(client_id=f"raw-{uid}", protocol_level=4, keep_alive=0), 4)
    ping = bytes([0xC0, 0x00])
    # CONNECT in three frames, then two PINGREQs in one, then a bad packet to end it.
    frames: list[bytes | str] = [connect[:3], connect[3:7], connect[7:], ping + ping, b"\xf0\x00"]
    protocol, got = asyncio.run(_raw_ws(broker.ports["mqtt_ws"], frames))
    assert protocol == "mqtt"
    data = b"".join(m.data for m in got if m.type == aiohttp.WSMsgType.BINARY)
    packets = MqttDecoder(server=False, protocol_level=4).feed(data)
    assert isinstance(packets[0], Connack) and packets[0].reason_code == 0
    assert [type(p).__name__ for p in packets[1:]] == ["Pingresp", "Pingresp"]


def test_bad_packet_or_text_frame_closes_only_that_client(broker, clients, uid):
    bystander = clients("ws", f"bystander-{uid}")
    bystander.connect()
    bystander.subscribe(f"still/{uid}", 1)
    port = broker.ports["mqtt_ws"]
    # A reserved packet type before CONNECT: the broker closes the WebSocket.
    _, got = asyncio.run(_raw_ws(port, [b"\xf0\x00"]))
    assert not [m for m in got if m.type == aiohttp.WSMsgType.BINARY]
    # A text frame: MQTT over WebSocket is binary only.
    _, got = asyncio.run(_raw_ws(port, ["CONNECT"]))
    assert not [m for m in got if m.type == aiohttp.WSMsgType.BINARY]
    # The other client is still served.
    bystander.publish(f"still/{uid}", b"alive", qos=1)
    assert bystander.get().payload == b"alive"


@pytest.fixture(scope="module")
def wss_broker(tmp_path_factory) -> Iterator[BrokerProcess]:
    pki = make_pki(tmp_path_factory.mktemp("ws-pki"))
    data = tmp_path_factory.mktemp("wss") / "data"
    args = ("--tls-cert", str(pki.server.cert), "--tls-key", str(pki.server.key))
    proc = start_broker(data, *ROLES, *args)
    proc.pki = pki  # type: ignore[attr-defined]
    yield proc
    proc.stop()


@pytest.mark.parametrize("v5", [False, True], ids=["3.1.1", "5.0"])
def test_wss_with_tls_configured(wss_broker, uid, v5):
    ports = wss_broker.ports
    assert ports["mqtt_wss"] not in (0, ports["mqtt_ws"], ports["mqtt_tls"])
    secure = WsPaho(ports["mqtt_wss"], f"wss-{uid}", v5=v5)
    secure.client.tls_set_context(ssl.create_default_context(cafile=str(wss_broker.pki.ca)))
    plain = WsPaho(ports["mqtt_ws"], f"ws-{uid}", v5=v5)
    try:
        secure.connect()
        plain.connect()
        secure.subscribe(f"wss/{uid}", 1)
        plain.publish(f"wss/{uid}", b"over tls", qos=1)
        assert secure.get().payload == b"over tls"
    finally:
        secure.close()
        plain.close()


def test_receive_maximum_exceeded_over_websocket_is_read(broker, uid):
    """The WebSocket close handshake lets the client read the DISCONNECT that says why, even
    when it sent far more than the broker read (as the lingering close does over TCP)."""
    connect = encode(Connect(client_id=f"rm-{uid}", protocol_level=5), 5)
    publishes = [encode(Publish(f"t/{uid}", b"x" * 64, 2, packet_id=i), 5) for i in range(1, 2049)]
    frames: list[bytes | str] = [connect]
    frames += [b"".join(publishes[i : i + 256]) for i in range(0, len(publishes), 256)]
    _, got = asyncio.run(_raw_ws(broker.ports["mqtt_ws"], frames))
    data = b"".join(m.data for m in got if m.type == aiohttp.WSMsgType.BINARY)
    packets = MqttDecoder(server=False, protocol_level=5).feed(data)
    receive_maximum = packets[0].properties["receive_maximum"]
    assert sum(isinstance(p, Pubrec) for p in packets) == receive_maximum
    assert isinstance(packets[-1], Disconnect), packets[-3:]
    assert packets[-1].reason_code == rc.RECEIVE_MAXIMUM_EXCEEDED
