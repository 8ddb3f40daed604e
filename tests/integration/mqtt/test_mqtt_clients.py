"""Other real clients: amqtt (asyncio, 3.1.1) and Debian's mosquitto_pub / mosquitto_sub."""

from __future__ import annotations

import asyncio
import shutil
import subprocess

import pytest

from .conftest import HOST, http, wait_until

MOSQUITTO = shutil.which("mosquitto_pub") and shutil.which("mosquitto_sub")
needs_mosquitto = pytest.mark.skipif(
    not MOSQUITTO,
    reason="mosquitto_pub/mosquitto_sub not installed (Debian package mosquitto-clients)",
)


# --- amqtt ----------------------------------------------------------------------------------
async def test_amqtt_subscribe_publish_qos_0_1_2(broker, paho, uid):
    from amqtt.client import MQTTClient
    from amqtt.mqtt.constants import QOS_0, QOS_1, QOS_2

    url = f"mqtt://{HOST}:{broker.ports['mqtt']}/"
    config = {"auto_reconnect": False, "keep_alive": 30}
    client = MQTTClient(client_id=f"amqtt-{uid}", config=config)
    await client.connect(url, cleansession=True)
    try:
        granted = await client.subscribe(
            [(f"am/{uid}/0", QOS_0), (f"am/{uid}/1", QOS_1), (f"am/{uid}/2", QOS_2)]
        )
        assert list(granted) == [0, 1, 2]
        for qos in (0, 1, 2):
            await client.publish(f"am/{uid}/{qos}", f"self {qos}".encode(), qos=qos)
        got = {}
        for _ in range(3):
            m = await client.deliver_message(timeout_duration=5)
            assert m is not None, "amqtt received nothing"
            got[m.topic] = (bytes(m.data), m.qos)
        assert got == {f"am/{uid}/{q}": (f"self {q}".encode(), q) for q in (0, 1, 2)}

        # From paho v5 (QoS 2 publish to the QoS 1 subscription → QoS 1).
        pub = paho(f"pahopub-{uid}", v5=True)
        await asyncio.to_thread(pub.connect)
        await asyncio.to_thread(pub.publish, f"am/{uid}/1", b"from paho", 2)
        m = await client.deliver_message(timeout_duration=5)
        assert m is not None
        assert (m.topic, bytes(m.data), m.qos) == (f"am/{uid}/1", b"from paho", 1)

        # amqtt → paho.
        sub = paho(f"pahosub-{uid}", v5=False)
        await asyncio.to_thread(sub.connect)
        await asyncio.to_thread(sub.subscribe, f"am/{uid}/to-paho", 2)
        await client.publish(f"am/{uid}/to-paho", b"from amqtt", qos=QOS_2)
        m = await asyncio.to_thread(sub.get)
        assert (m.payload, m.qos) == (b"from amqtt", 2)

        await client.unsubscribe([f"am/{uid}/0"])
        await client.publish(f"am/{uid}/0", b"after unsubscribe", qos=QOS_1)
        await client.publish(f"am/{uid}/2", b"fence", qos=QOS_1)
        m = await client.deliver_message(timeout_duration=5)
        assert m is not None and bytes(m.data) == b"fence"
    finally:
        await client.disconnect()


async def test_amqtt_persistent_session(broker, paho, uid):
    from amqtt.client import MQTTClient
    from amqtt.mqtt.constants import QOS_1

    url = f"mqtt://{HOST}:{broker.ports['mqtt']}/"
    config = {"auto_reconnect": False, "keep_alive": 30}
    client = MQTTClient(client_id=f"amqttp-{uid}", config=config)
    await client.connect(url, cleansession=False)
    await client.subscribe([(f"amp/{uid}", QOS_1)])
    await client.disconnect()

    pub = paho(f"pub-{uid}", v5=False)
    await asyncio.to_thread(pub.connect)
    await asyncio.to_thread(pub.publish, f"amp/{uid}", b"while away", 1)

    client = MQTTClient(client_id=f"amqttp-{uid}", config=config)
    await client.connect(url, cleansession=False)
    try:
        m = await client.deliver_message(timeout_duration=5)
        assert m is not None and bytes(m.data) == b"while away"
    finally:
        await client.disconnect()


# --- mosquitto clients ----------------------------------------------------------------------
def _wait_subscribed(broker, client_id: str) -> None:
    def listed() -> bool:
        _, body = http(broker.http, "GET", "/api/v1/subscriptions", broker.token)
        return any(s["client_id"] == client_id for s in body["data"])

    wait_until(listed, timeout=5)


def _mosquitto_sub(broker, client_id: str, topic: str, count: int, *extra: str):
    return subprocess.Popen(
        [
            "mosquitto_sub",
            "-h", HOST,
            "-p", str(broker.ports["mqtt"]),
            "-i", client_id,
            "-t", topic,
            "-C", str(count),
            "-W", "10",
            "-v",
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip


def _mosquitto_pub(broker, topic: str, message: str, *extra: str) -> None:
    done = subprocess.run(
        ["mosquitto_pub", "-h", HOST, "-p", str(broker.ports["mqtt"]), "-t", topic,
         "-m", message, *extra],
        capture_output=True, text=True, timeout=10,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


@needs_mosquitto
@pytest.mark.parametrize("version", ["311", "5"])
def test_mosquitto_pub_sub(broker, uid, version):
    topic = f"mosq/{uid}"
    sub = _mosquitto_sub(broker, f"msub-{uid}", f"{topic}/#", 3, "-q", "2", "-V", version)
    try:
        _wait_subscribed(broker, f"msub-{uid}")
        for qos in (0, 1, 2):
            _mosquitto_pub(broker, f"{topic}/{qos}", f"hello {qos}", "-q", str(qos), "-V", version)
        out, err = sub.communicate(timeout=15)
    finally:
        if sub.poll() is None:
            sub.kill()
            sub.wait()
    assert sub.returncode == 0, err
    assert sorted(out.splitlines()) == [f"{topic}/{q} hello {q}" for q in (0, 1, 2)]


@needs_mosquitto
def test_mosquitto_retained_and_properties(broker, uid):
    topic = f"mosqret/{uid}"
    _mosquitto_pub(
        broker, topic, "retained", "-r", "-q", "1", "-V", "5",
        "-D", "publish", "user-property", "k", "v",
        "-D", "publish", "content-type", "text/plain",
    )  # fmt: skip
    done = subprocess.run(
        ["mosquitto_sub", "-h", HOST, "-p", str(broker.ports["mqtt"]), "-t", topic,
         "-C", "1", "-W", "10", "-V", "5", "-F", "%t|%p|%r|%C|%P"],
        capture_output=True, text=True, timeout=15,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{topic}|retained|1|text/plain|k:v"
