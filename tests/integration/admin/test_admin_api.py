"""The admin REST API over real HTTP against a broker on the SQLite meta store."""

from __future__ import annotations

import aiohttp
import pytest

import flowmq_metrics as metrics


def assert_error(status: int, body: dict, expected_status: int, code: str, *words: str) -> None:
    assert status == expected_status, body
    assert body["success"] is False and body["data"] is None
    assert body["error"]["code"] == code, body
    for word in words:
        assert word in body["error"]["message"], body


async def test_missing_or_wrong_token_is_refused(api):
    status, body = await api.call("GET", "/api/v1/streams", token=None)
    assert_error(status, body, 401, "unauthorized", "Bearer")
    status, body = await api.call("GET", "/api/v1/streams", token="not-it")
    assert_error(status, body, 401, "unauthorized", "invalid")
    status, body = await api.call("GET", "/api/v1/streams")
    assert status == 200 and body == {"success": True, "data": [], "error": None}


async def test_stream_life_cycle_and_routing(api):
    status, body = await api.call(
        "POST",
        "/api/v1/streams",
        json={
            "name": "sensors.telemetry",
            "topic_filters": ["sensors/+/telemetry"],
            "partitions": 3,
        },
    )
    assert status == 201, body
    stream = body["data"]
    assert stream["name"] == "sensors.telemetry" and stream["partitions"] == 3
    assert stream["topic_filters"] == ["sensors/+/telemetry"] and stream["namespace"] == "default"

    status, body = await api.call(
        "GET", "/api/v1/routes", params={"topic": "sensors/dev-1/telemetry"}
    )
    assert status == 200
    assert [d["name"] for d in body["data"]["destinations"]] == ["sensors.telemetry"]
    status, body = await api.call("GET", "/api/v1/routes", params={"topic": "sensors/dev-1/status"})
    assert body["data"]["destinations"] == []

    status, body = await api.call(
        "PUT", "/api/v1/streams/sensors.telemetry", json={"topic_filters": ["sensors/#"]}
    )
    assert status == 200 and body["data"]["topic_filters"] == ["sensors/#"]
    assert body["data"]["partitions"] == 3
    status, body = await api.call("GET", "/api/v1/routes", params={"topic": "sensors/dev-1/status"})
    assert [d["name"] for d in body["data"]["destinations"]] == ["sensors.telemetry"]

    status, body = await api.call("GET", "/api/v1/streams")
    assert [s["name"] for s in body["data"]] == ["sensors.telemetry"]

    status, body = await api.call("DELETE", "/api/v1/streams/sensors.telemetry")
    assert status == 200 and body["data"] == {"deleted": "sensors.telemetry"}
    status, body = await api.call("GET", "/api/v1/streams/sensors.telemetry")
    assert_error(status, body, 404, "not_found", "sensors.telemetry")
    status, body = await api.call("GET", "/api/v1/routes", params={"topic": "sensors/dev-1/status"})
    assert body["data"]["destinations"] == []


async def test_default_stream_filter_is_the_mapped_name(api):
    status, body = await api.call("POST", "/api/v1/streams", json={"name": "orders.eu"})
    assert status == 201 and body["data"]["topic_filters"] == ["orders/eu"]
    assert body["data"]["partitions"] == 1 and body["data"]["retention_ms"] == 604800000


async def test_queue_life_cycle(api):
    status, body = await api.call(
        "POST",
        "/api/v1/queues",
        json={"name": "jobs", "topic_filter": "jobs/#", "max_size_mb": 10, "message_ttl_seconds": 60,
              "max_retries": 3, "dead_letter_topic": "jobs-dead"},
    )  # fmt: skip
    assert status == 201, body
    queue = body["data"]
    assert queue["topic_filter"] == "jobs/#" and queue["max_retries"] == 3
    assert queue["dead_letter_topic"] == "jobs-dead" and queue["shards"] >= 1
    status, body = await api.call("PUT", "/api/v1/queues/jobs", json={"max_retries": 7})
    assert status == 200 and body["data"]["max_retries"] == 7 and body["data"]["max_size_mb"] == 10
    status, body = await api.call("GET", "/api/v1/routes", params={"topic": "jobs/a/b"})
    assert body["data"]["destinations"] == [
        {"type": "queue", "name": "jobs", "topic_filters": ["jobs/#"]}
    ]
    status, body = await api.call("DELETE", "/api/v1/queues/jobs")
    assert status == 200


@pytest.mark.parametrize(
    ("method", "path", "payload", "status", "code", "words"),
    [
        ("POST", "/api/v1/streams", {"name": "s", "colour": "red"}, 422, "validation_failed", ["unknown field", "colour"]),
        ("POST", "/api/v1/streams", {"name": "s", "partitions": "three"}, 422, "validation_failed", ["partitions", "integer"]),
        ("POST", "/api/v1/streams", {"name": "s", "partitions": 0}, 422, "validation_failed", ["partitions"]),
        ("POST", "/api/v1/streams", {"name": "bad name!"}, 422, "validation_failed", ["name"]),
        ("POST", "/api/v1/streams", {"name": ".."}, 422, "invalid_name", [".."]),
        ("POST", "/api/v1/streams", {"name": "s", "topic_filters": ["a/#/b"]}, 422, "invalid_filter", ["#"]),
        ("POST", "/api/v1/streams", {"partitions": 1}, 422, "validation_failed", ["name"]),
        ("POST", "/api/v1/streams", [1, 2], 422, "validation_failed", ["object"]),
        ("POST", "/api/v1/queues", {"name": "q", "topic_filter": "a+"}, 422, "invalid_filter", []),
        ("POST", "/api/v1/queues", {"name": "q", "dead_letter_topic": "dead/#"}, 422, "invalid_topic", []),
        ("POST", "/api/v1/queues", {"name": "amq.q"}, 422, "invalid_name", ["amq."]),
        ("POST", "/api/v1/namespaces", {"name": "a b"}, 422, "validation_failed", ["name"]),
        ("GET", "/api/v1/streams/nope", None, 404, "not_found", ["nope"]),
        ("GET", "/api/v1/streams?namespace=ghost", None, 404, "not_found", ["ghost"]),
        ("DELETE", "/api/v1/queues/nope", None, 404, "not_found", ["nope"]),
        ("GET", "/api/v1/routes", None, 400, "bad_request", ["topic"]),
        ("GET", "/api/v1/routes?topic=a/%2B/b", None, 422, "invalid_topic", []),
        ("GET", "/api/v1/no-such-thing", None, 404, "not_found", ["no-such-thing"]),
        ("PATCH", "/api/v1/streams", None, 405, "method_not_allowed", ["PATCH"]),
    ],
)  # fmt: skip
async def test_bad_input_gets_a_named_4xx(api, method, path, payload, status, code, words):
    got_status, body = await api.call(method, path, json=payload)
    assert_error(got_status, body, status, code, *words)


async def test_malformed_json_is_400(api):
    for raw in (b"{not json", b"", b"\xff\xfe"):
        status, body = await api.call(
            "POST", "/api/v1/streams", data=raw, headers={"Content-Type": "application/json"}
        )
        assert_error(status, body, 400, "invalid_json", "JSON")


async def test_duplicates_and_name_collisions_are_409(api):
    assert (await api.call("POST", "/api/v1/streams", json={"name": "a.b"}))[0] == 201
    status, body = await api.call("POST", "/api/v1/streams", json={"name": "a.b"})
    assert_error(status, body, 409, "already_exists", "a.b")
    # Kafka refuses topics differing only by '.' and '_'.
    status, body = await api.call("POST", "/api/v1/streams", json={"name": "a_b"})
    assert_error(status, body, 409, "name_collision", "a_b", "a.b")
    # A queue named like the stream would occupy the same canonical topic a/b.
    status, body = await api.call("POST", "/api/v1/queues", json={"name": "a.b"})
    assert_error(status, body, 409, "already_exists")
    status, body = await api.call("POST", "/api/v1/queues", json={"name": "a.b.c"})
    assert status == 201
    status, body = await api.call("POST", "/api/v1/streams", json={"name": "a.b.c"})
    assert_error(status, body, 409, "already_exists")


async def test_partitions_only_grow(api):
    await api.call("POST", "/api/v1/streams", json={"name": "p", "partitions": 4})
    status, body = await api.call("PUT", "/api/v1/streams/p", json={"partitions": 2})
    assert_error(status, body, 422, "invalid_partitions", "4", "2")
    status, body = await api.call("PUT", "/api/v1/streams/p", json={"partitions": 6})
    assert status == 200 and body["data"]["partitions"] == 6


async def test_namespaces(api):
    status, body = await api.call("GET", "/api/v1/namespaces")
    assert [ns["name"] for ns in body["data"]] == ["default"]
    assert (await api.call("POST", "/api/v1/namespaces", json={"name": "tenant-1"}))[0] == 201
    status, body = await api.call("POST", "/api/v1/namespaces", json={"name": "tenant-1"})
    assert_error(status, body, 409, "already_exists")
    status, _ = await api.call("POST", "/api/v1/streams?namespace=tenant-1", json={"name": "x"})
    assert status == 201
    # Destinations are per namespace: the same name is free in another one.
    assert (await api.call("POST", "/api/v1/streams", json={"name": "x"}))[0] == 201
    status, body = await api.call(
        "GET", "/api/v1/routes", params={"topic": "x", "namespace": "tenant-1"}
    )
    assert body["data"]["destinations"][0]["name"] == "x"
    status, body = await api.call("DELETE", "/api/v1/namespaces/tenant-1")
    assert_error(status, body, 409, "not_empty", "tenant-1")
    await api.call("DELETE", "/api/v1/streams/x?namespace=tenant-1")
    status, body = await api.call("DELETE", "/api/v1/namespaces/tenant-1")
    assert status == 200
    status, body = await api.call("GET", "/api/v1/namespaces/tenant-1")
    assert_error(status, body, 404, "not_found")
    status, body = await api.call("DELETE", "/api/v1/namespaces/default")
    assert_error(status, body, 409, "not_empty", "default")


async def test_cluster_nodes_and_subscriptions(api, broker):
    status, body = await api.call("GET", "/api/v1/cluster/nodes")
    assert status == 200
    [node] = body["data"]
    assert node["node_id"] == "node-a" and node["status"] == "up" and node["self"] is True
    assert node["ports"]["http"] == broker.ports["http"]
    status, body = await api.call("GET", "/api/v1/subscriptions")
    assert status == 200 and body["data"] == []


async def test_http_publish_routes_and_counts(api):
    before = metrics.broker_messages_published_count.value("default")
    status, body = await api.call(
        "POST", "/api/v1/topics/nobody/listens/messages", json={"payload": "hi"}
    )
    assert status == 200 and body["data"] == {"topic": "nobody/listens", "destinations": []}
    status, body = await api.call(
        "POST", "/api/v1/topics/nobody%2Flistens/messages/batch",
        json={"messages": [{"payload": "aGk=", "encoding": "base64"}, {"payload": "x"}]},
    )  # fmt: skip
    assert status == 200 and len(body["data"]["results"]) == 2
    assert body["data"]["results"][0]["topic"] == "nobody/listens"
    assert metrics.broker_messages_published_count.value("default") == before + 3


async def test_http_publish_bad_input(api):
    status, body = await api.call(
        "POST", "/api/v1/topics/a/messages", json={"payload": "%%", "encoding": "base64"}
    )
    assert_error(status, body, 422, "validation_failed", "base64")
    status, body = await api.call("POST", "/api/v1/topics/a/%23/messages", json={"payload": "x"})
    assert_error(status, body, 422, "invalid_topic")
    status, body = await api.call(
        "POST", "/api/v1/topics/a/messages/batch", json={"messages": [{"payload": "x"}, {"qos": 1}]}
    )
    assert_error(status, body, 422, "validation_failed", "payload")


async def test_http_publish_topic_past_the_limits_is_refused_and_counted(api):
    """Topics past 4,096 bytes or 128 levels (flowmq_core.limits) are refused in the envelope
    and counted in limits_rejections_count; publishing goes on for everyone else."""

    def counted() -> tuple[float, float]:
        refused = metrics.limits_rejections_count
        return refused.value("topic_bytes"), refused.value("topic_levels")

    before = counted()
    status, body = await api.call("POST", f"/api/v1/topics/{'x' * 4097}/messages", json={"payload": "x"})  # fmt: skip
    assert_error(status, body, 422, "invalid_topic", "longer than")
    levels = "/".join(["l"] * 129)
    status, body = await api.call(
        "POST", f"/api/v1/topics/{levels}/messages", json={"payload": "x"}
    )
    assert_error(status, body, 422, "invalid_topic", "levels")
    assert counted() == (before[0] + 1, before[1] + 1)
    status, body = await api.call("POST", f"/api/v1/topics/{'x' * 4096}/messages", json={"payload": "x"})  # fmt: skip
    assert status == 200, body


async def test_http_publish_into_a_queue_is_stored(api, broker):
    await api.call("POST", "/api/v1/queues", json={"name": "t", "topic_filter": "t/#"})
    status, body = await api.call("POST", "/api/v1/topics/t/1/messages", json={"payload": "x"})
    assert status == 200 and body["data"]["destinations"][0]["name"] == "t", body
    stats = await broker.queues.engine.stats("default", "t")
    assert stats["count"] == 1


async def test_http_publish_into_a_stream_is_stored(api, broker):
    from flowmq_kas3.records import decode_batches

    await api.call(
        "POST",
        "/api/v1/streams",
        json={"name": "events", "topic_filters": ["events/#"], "partitions": 2},
    )
    status, body = await api.call(
        "POST",
        "/api/v1/topics/events/a/messages/batch",
        json={
            "messages": [{"payload": f"m{i}", "key": "k", "headers": {"h": "v"}} for i in range(5)]
        },
    )
    assert status == 200 and all(
        r["destinations"][0]["name"] == "events" for r in body["data"]["results"]
    )
    # One key, so one partition (Kafka's partitioner), in publish order.
    records = []
    for partition in (0, 1):
        fetched = await broker.streams.fetch("default", "events", partition, 0, 1 << 20)
        records += decode_batches(fetched.records)
    assert [r.value for r in records] == [f"m{i}".encode() for i in range(5)]
    assert [r.offset for r in records] == list(range(5))
    assert records[0].key == b"k"
    assert b"events/a" in [v for k, v in records[0].headers if k == "flowmq.topic"]
    assert ("h", b"v") in records[0].headers


async def test_metrics_endpoints_need_no_token(broker):
    async with aiohttp.ClientSession() as session:
        for path in ("/metrics", "/v1/prometheus/metrics"):
            async with session.get(f"http://127.0.0.1:{broker.ports['http']}{path}") as r:
                text = await r.text()
                assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")
                assert "# TYPE broker_messages_published_count counter" in text
                assert "broker_destinations" in text


async def test_integral_floats_count_as_integers(api, broker):
    # JSON Schema says 3.0 is an integer; it must then behave as 3 everywhere.
    status, body = await api.call("POST", "/api/v1/streams", json={"name": "f", "partitions": 3.0})
    assert status == 201 and body["data"]["partitions"] == 3
    assert isinstance(body["data"]["partitions"], int)
    status, body = await api.call(
        "POST", "/api/v1/topics/f/messages", json={"payload": "x", "qos": 2.0}
    )
    assert status == 200, body
    status, body = await api.call("POST", "/api/v1/streams", json={"name": "g", "partitions": 2.5})
    assert_error(status, body, 422, "validation_failed", "partitions")
