"""MQTT → Stream: a QoS 1 PUBACK means the message is in the Stream, even across SIGKILL."""

from __future__ import annotations

import json
import urllib.request

import paho.mqtt.client as mqtt
import psutil
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from flowmq_commit.batcher import GroupCommitBatcher
from flowmq_kas3.records import decode_batches
from flowmq_kas3.store import StreamStore
from flowmq_meta import open_meta_store
from flowmq_objstore import open_object_store
from tests.fixtures.broker_process import start_broker
from tests.fixtures.waiting import wait_until


def admin_post(broker, path: str, body: dict) -> dict:
    request = urllib.request.Request(
        broker.http + path,
        data=json.dumps(body).encode(),
        headers={"Authorization": "Bearer t", "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def flush_processes(broker) -> list[psutil.Process]:
    return [
        child
        for child in psutil.Process(broker.proc.pid).children()
        if "flowmq_commit.flush_worker" in child.cmdline()
    ]


@pytest.mark.parametrize("child_up", [False, True], ids=["from-the-start", "flush-process-up"])
async def test_acknowledged_mqtt_messages_survive_sigkill_in_the_stream(tmp_path, child_up):
    """From the start (the first appends may take the flush thread while the flush process
    starts) and once the flush process is up (every append goes through it)."""
    data_dir = tmp_path / "data"
    broker = start_broker(data_dir, "--admin-token", "t")
    children: list[psutil.Process] = []
    try:
        admin_post(
            broker,
            "/api/v1/streams",
            {"name": "telemetry", "topic_filters": ["sensors/+/telemetry"]},
        )
        if child_up:  # started once the routes hold a Stream
            children = wait_until(lambda: flush_processes(broker), 30, what="a flush process")
        client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="dev-1", protocol=mqtt.MQTTv5)
        client.connect("127.0.0.1", broker.ports["mqtt"])
        client.loop_start()
        props = Properties(PacketTypes.PUBLISH)
        props.UserProperty = [("site", "lab")]
        infos = [
            client.publish("sensors/dev-1/telemetry", f"reading {i}", qos=1, properties=props)
            for i in range(50)
        ]
        for info in infos:
            info.wait_for_publish(10)
            assert info.is_published()
        client.loop_stop()
    finally:
        broker.proc.kill()  # SIGKILL: no flush, no clean shutdown
        broker.proc.wait(10)
    # The flush process ends with its broker (its end of the socket pair closed).
    _, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, "the flush process outlived its broker"

    meta = open_meta_store(f"sqlite:///{data_dir / 'meta.db'}")
    objects = open_object_store(str(data_dir / "objects"))
    store = StreamStore(meta, objects, GroupCommitBatcher(meta, objects, node_id="reader"))
    try:
        fetched = await store.fetch("default", "telemetry", 0, 0, 1 << 20)
        records = decode_batches(fetched.records)
    finally:
        await meta.close()
        await objects.close()
    assert fetched.high_watermark == 50
    assert [r.value for r in records] == [f"reading {i}".encode() for i in range(50)]
    assert [r.offset for r in records] == list(range(50))
    assert ("flowmq.topic", b"sensors/dev-1/telemetry") in records[0].headers
    assert ("site", b"lab") in records[0].headers
