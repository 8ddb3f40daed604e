"""The admin API's operations endpoints over real HTTP against a ``flowmq serve`` process:
health and readiness without a token (and readiness failing while the object store is
unusable), live counts, stream and queue reads, consumer groups with a live Kafka member,
client connections and the kick."""

from __future__ import annotations

import json
import os
import time
import uuid

import pika
import pytest
from kafka import KafkaConsumer

from tests.fixtures.broker_process import start_broker
from tests.fixtures.waiting import wait_until
from tests.integration.ops.conftest import TIMEOUT, MqttClient, http

pytestmark = pytest.mark.timeout(120)


def api(broker, method: str, path: str, body=None, token: str | None = "") -> tuple[int, dict]:
    return http(method, f"{broker.http}/api/v1{path}", body, broker.token if token == "" else token)


def test_health_and_ready_answer_without_a_token(broker):
    status, body = api(broker, "GET", "/health", token=None)
    assert status == 200, body
    assert body["data"]["status"] == "ok" and body["data"]["node_id"] == broker.ports["node_id"]
    assert body["data"]["version"]
    status, body = api(broker, "GET", "/ready", token=None)
    assert status == 200, body
    checks = body["data"]["checks"]
    assert {name: check["ok"] for name, check in checks.items()} == {
        "meta": True,
        "objects": True,
        "cluster": True,
    }
    # The rest of the API still wants its token.
    assert api(broker, "GET", "/streams", token=None)[0] == 401


def test_ready_turns_503_while_the_object_store_is_unusable_and_recovers(tmp_path):
    """Root ignores chmod, so the objects directory is replaced by a file: every put fails
    as it would on a dead disk; putting the directory back makes the broker ready again."""
    objects = tmp_path / "objects"
    broker = start_broker(tmp_path / "data", "--objects", objects.as_uri())
    try:
        assert api(broker, "GET", "/ready", token=None)[0] == 200
        moved = tmp_path / "objects.moved"
        os.rename(objects, moved)
        objects.write_text("not a directory")
        status, body = api(broker, "GET", "/ready", token=None)
        assert status == 503, body
        assert body["success"] is False and body["error"]["code"] == "not_ready"
        assert body["error"]["details"]["failed"] == ["objects"]
        assert body["error"]["message"].startswith("not ready: objects: ")
        assert body["error"]["details"]["checks"]["meta"]["ok"] is True
        # Liveness is not readiness: the process still answers.
        assert api(broker, "GET", "/health", token=None)[0] == 200
        objects.unlink()
        os.rename(moved, objects)
        assert api(broker, "GET", "/ready", token=None)[0] == 200
    finally:
        assert broker.stop() == 0


def test_ready_turns_503_while_the_s3_server_is_stopped_and_recovers(tmp_path, monkeypatch):
    """A real S3 server (moto) of the test's own: stopped, the probe put fails or times out;
    started again on the same port (moto keeps its buckets in memory), the broker is ready."""
    import boto3
    from moto.server import ThreadedMotoServer

    from tests.fixtures.s3 import _CLEARED_ENV, _FAKE_ENV, S3_REGION

    for name, value in _FAKE_ENV.items():
        monkeypatch.setenv(name, value)
    for name in _CLEARED_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    bucket = f"ready-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=endpoint, region_name=S3_REGION).create_bucket(Bucket=bucket)
    broker = start_broker(
        tmp_path / "data", "--objects", f"s3://{bucket}?endpoint={endpoint}&region={S3_REGION}"
    )
    try:
        assert api(broker, "GET", "/ready", token=None)[0] == 200
        server.stop()
        status, body = api(broker, "GET", "/ready", token=None)
        assert status == 503 and body["error"]["details"]["failed"] == ["objects"], body
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        server.start()
        wait_until(lambda: api(broker, "GET", "/ready", token=None)[0] == 200, 20, step=0.2,
                   what="ready again")  # fmt: skip
    finally:
        broker.stop()
        server.stop()


def test_ready_turns_503_when_the_broker_stops(tmp_path):
    """A broker being stopped says so before its listener closes (drains load balancers)."""
    broker = start_broker(tmp_path / "data")
    assert api(broker, "GET", "/ready", token=None)[0] == 200
    broker.proc.terminate()
    seen: list[int] = []
    deadline = time.monotonic() + TIMEOUT
    while broker.proc.poll() is None and time.monotonic() < deadline:
        try:
            seen.append(api(broker, "GET", "/ready", token=None)[0])
        except OSError:
            break
    broker.stop()
    assert 503 in seen, seen


def test_stream_and_queue_counts_rise_after_publishing(broker, uid):
    stream, queue_name = f"s-{uid}", f"q-{uid}"
    assert api(broker, "POST", "/streams",
               {"name": stream, "topic_filters": [f"{uid}/s/#"], "partitions": 2})[0] == 201  # fmt: skip
    assert (
        api(broker, "POST", "/queues", {"name": queue_name, "topic_filter": f"{uid}/q/#"})[0] == 201
    )
    status, body = api(broker, "GET", f"/streams/{stream}")
    assert status == 200 and body["data"]["end_offsets"] == [0, 0]
    assert body["data"]["bytes"] == 0 and body["data"]["segments"] == 0
    messages = [{"payload": f"m{i}", "key": "same"} for i in range(5)]
    assert (
        api(broker, "POST", f"/topics/{uid}/s/x/messages/batch", {"messages": messages})[0] == 200
    )
    assert (
        api(broker, "POST", f"/topics/{uid}/q/x/messages/batch", {"messages": messages})[0] == 200
    )
    data = api(broker, "GET", f"/streams/{stream}")[1]["data"]
    assert sorted(data["end_offsets"]) == [0, 5] and data["messages"] == 5  # one key: one partition
    assert data["bytes"] > 0 and data["segments"] >= 1 and data["start_offsets"] == [0, 0]
    listed = api(broker, "GET", "/streams")[1]["data"]
    assert [s["end_offsets"] for s in listed if s["name"] == stream] == [data["end_offsets"]]
    data = api(broker, "GET", f"/queues/{queue_name}")[1]["data"]
    assert (data["ready"], data["unacked"], data["consumers"]) == (5, 0, 0)


def test_stream_read_decodes_records(broker, uid):
    stream = f"read-{uid}"
    api(broker, "POST", "/streams", {"name": stream, "topic_filters": [f"{uid}/#"]})
    body = {"payload": "aGk=", "encoding": "base64", "key": "k1", "headers": {"h": "v"}}
    api(broker, "POST", f"/topics/{uid}/a/messages", body)
    api(broker, "POST", f"/topics/{uid}/b/messages", {"payload": "\u00e9t\u00e9"})
    api(broker, "POST", f"/topics/{uid}/c/messages", {"payload": "/w==", "encoding": "base64"})
    status, body = api(broker, "GET", f"/streams/{stream}/messages?offset=1&limit=5")
    assert status == 200, body
    data = body["data"]
    assert data["high_watermark"] == 3 and data["next_offset"] == 3
    assert [
        (r["offset"], r["topic"], r["value"], r["value_encoding"]) for r in data["records"]
    ] == [
        (1, f"{uid}/b", "\u00e9t\u00e9", "utf8"),
        (2, f"{uid}/c", "/w==", "base64"),  # 0xff is not UTF-8
    ]
    first = api(broker, "GET", f"/streams/{stream}/messages?limit=1")[1]["data"]["records"][0]
    assert (first["key"], first["value"]) == ("k1", "hi")
    assert first["headers"] == [{"name": "h", "value": "v", "encoding": "utf8"}]
    status, body = api(broker, "GET", f"/streams/{stream}/messages?offset=9")
    assert status == 422 and body["error"]["code"] == "offset_out_of_range"
    status, body = api(broker, "GET", f"/streams/{stream}/messages?partition=3")
    assert status == 422 and body["error"]["code"] == "invalid_partition"
    status, body = api(broker, "GET", f"/streams/{stream}/messages?limit=ten")
    assert status == 422 and "not an integer" in body["error"]["message"]
    assert api(broker, "GET", f"/streams/nope-{uid}/messages")[0] == 404


def test_queue_peek_take_and_purge(broker, uid):
    name = f"jobs-{uid}"
    api(broker, "POST", "/queues", {"name": name, "topic_filter": f"{uid}/#", "shards": 1})
    batch = {"messages": [{"payload": f"job{i}"} for i in range(4)]}
    api(broker, "POST", f"/topics/{uid}/x/messages/batch", batch)
    peeked = api(broker, "GET", f"/queues/{name}/messages?limit=2")[1]["data"]["messages"]
    assert [m["payload"] for m in peeked] == ["job0", "job1"]
    assert api(broker, "GET", f"/queues/{name}")[1]["data"]["ready"] == 4  # peek took nothing
    status, body = api(broker, "POST", f"/queues/{name}/messages/take", {"max_messages": 3})
    assert status == 200 and [m["payload"] for m in body["data"]["messages"]] == [
        "job0",
        "job1",
        "job2",
    ]
    assert api(broker, "GET", f"/queues/{name}")[1]["data"]["ready"] == 1
    status, body = api(broker, "POST", f"/queues/{name}/purge")
    assert status == 200 and body["data"]["purged"] == 1
    assert api(broker, "GET", f"/queues/{name}")[1]["data"]["ready"] == 0
    taken = api(broker, "POST", f"/queues/{name}/messages/take", {})[1]["data"]["messages"]
    assert taken == []
    assert api(broker, "POST", f"/queues/{name}/messages/take", {"max": 1})[0] == 422


def test_group_lag_and_reset_refused_while_a_kafka_member_is_live(broker, uid):
    stream, group = f"g-{uid}", f"grp-{uid}"
    api(broker, "POST", "/streams", {"name": stream})
    batch = {"messages": [{"payload": f"m{i}"} for i in range(6)]}
    api(broker, "POST", f"/topics/g-{uid}/messages/batch", batch)
    status, body = api(
        broker, "POST", f"/groups/{group}/reset-offsets", {"stream": stream, "to": 2}
    )
    assert status == 200 and body["data"]["offsets"] == [{"partition": 0, "offset": 2}]
    data = api(broker, "GET", f"/groups/{group}")[1]["data"]
    assert data["lag"] == 4 and data["offsets"][0]["committed_offset"] == 2
    assert data["offsets"][0]["end_offset"] == 6 and data["members"] == []
    assert group in [g["group"] for g in api(broker, "GET", "/groups")[1]["data"]]

    consumer = KafkaConsumer(
        stream,
        bootstrap_servers=f"127.0.0.1:{broker.ports['kafka']}",
        group_id=group,
        enable_auto_commit=False,
        consumer_timeout_ms=200,
    )
    try:
        wait_until(lambda: consumer.poll(200) is not None and consumer.assignment(), 20,
                   what="the consumer's assignment")  # fmt: skip
        members = api(broker, "GET", f"/groups/{group}")[1]["data"]["members"]
        assert len(members) == 1 and members[0]["client_id"]
        status, body = api(
            broker, "POST", f"/groups/{group}/reset-offsets", {"stream": stream, "to": "earliest"}
        )
        assert status == 409 and body["error"]["code"] == "group_active", body
    finally:
        consumer.close()
    wait_until(lambda: api(broker, "GET", f"/groups/{group}")[1]["data"]["members"] == [], 15,
               what="the member to leave")  # fmt: skip
    status, body = api(
        broker, "POST", f"/groups/{group}/reset-offsets", {"stream": stream, "to": "earliest"}
    )
    assert status == 200 and body["data"]["offsets"] == [{"partition": 0, "offset": 0}]
    assert api(broker, "GET", f"/groups/{group}")[1]["data"]["lag"] == 6
    status, body = api(
        broker, "POST", f"/groups/{group}/reset-offsets", {"stream": "nope", "to": 0}
    )
    assert status == 404
    assert api(broker, "GET", f"/groups/never-{uid}")[0] == 404


def test_clients_lists_mqtt_amqp_kafka_and_kicks_mqtt_v5_with_0x98(broker, uid):
    client = MqttClient(broker.ports["mqtt"], f"dev-{uid}")
    amqp = pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", broker.ports["amqp"], socket_timeout=TIMEOUT)
    )
    consumer = KafkaConsumer(bootstrap_servers=f"127.0.0.1:{broker.ports['kafka']}")
    try:
        client.subscribe(f"{uid}/#")
        consumer.topics()  # connects
        found = api(broker, "GET", "/clients")[1]["data"]
        mine = [c for c in found if c["client_id"] == f"dev-{uid}"]
        assert len(mine) == 1, found
        assert mine[0]["protocol"] == "mqtt" and mine[0]["protocol_version"] == "5.0"
        assert mine[0]["subscriptions"] == [f"{uid}/#"] and mine[0]["inflight"] == 0
        assert mine[0]["node_id"] == broker.ports["node_id"]
        assert {"mqtt", "amqp", "kafka"} <= {c["protocol"] for c in found}
        only = api(broker, "GET", "/clients?protocol=amqp")[1]["data"]
        assert only and {c["protocol"] for c in only} == {"amqp"}

        status, body = api(broker, "DELETE", f"/clients/dev-{uid}")
        assert status == 200 and body["data"]["disconnected"] == [mine[0]["id"]]
        assert client.disconnects.get(timeout=TIMEOUT) == 0x98
        wait_until(lambda: all(c["client_id"] != f"dev-{uid}"
                               for c in api(broker, "GET", "/clients")[1]["data"]), TIMEOUT,
                   what="the kicked client to be gone")  # fmt: skip

        amqp_id = only[0]["id"]
        assert api(broker, "DELETE", f"/clients/{amqp_id}")[0] == 200
        with pytest.raises(pika.exceptions.ConnectionClosed) as closed:
            amqp.process_data_events(time_limit=TIMEOUT)
        assert closed.value.reply_code == 320
        status, body = api(broker, "DELETE", f"/clients/gone-{uid}")
        assert status == 404 and body["error"]["code"] == "not_found"
    finally:
        client.close()
        consumer.close()
        if amqp.is_open:
            amqp.close()


def test_log_format_json(tmp_path):
    broker = start_broker(tmp_path / "data", "--log-format", "json", "--admin-token", "t")
    try:
        api(broker, "GET", "/streams", token="t")
    finally:
        broker.stop()
    lines = [json.loads(line) for line in broker.output if line.startswith("{")]
    ready = [entry for entry in lines if " ready: " in entry["message"]]
    assert ready and ready[0]["level"] == "info" and ready[0]["logger"] == "flowmq_broker.server"
    assert ready[0]["ts"].endswith("Z")
    assert all(line.startswith("{") for line in broker.output if line.strip()), broker.output


def test_ready_and_health_are_documented_without_security(broker):
    doc = api(broker, "GET", "/openapi.json", token=None)[1]
    for path in ("/api/v1/health", "/api/v1/ready"):
        assert doc["paths"][path]["get"]["security"] == []
    assert "503" in doc["paths"]["/api/v1/ready"]["get"]["responses"]
