"""Metrics after MQTT traffic, HTTP publish into MQTT, the subscriptions API, and the policy
for a QoS 0 subscriber that stops reading."""

from __future__ import annotations

import base64
import socket
import urllib.parse

from flowmq_wire.mqtt.codec import encode
from flowmq_wire.mqtt.packets import Puback, Publish

from .conftest import HOST, RawClient, connected, http, scrape, subscribed, wait_until

NS = '{namespace="default"}'


def _delta(before: dict[str, float], after: dict[str, float], name: str) -> float:
    return after.get(name, 0.0) - before.get(name, 0.0)


def test_metrics_follow_traffic(broker, paho, uid):
    base = broker.http
    before = scrape(base)

    sub_a = connected(paho, f"a-{uid}", v5=True)
    sub_b = connected(paho, f"b-{uid}", v5=False)
    pub = connected(paho, f"pub-{uid}", v5=True)
    wait_until(lambda: _delta(before, scrape(base), f"mqtt_connections{NS}") == 3)

    sub_a.subscribe(f"met/{uid}/x", 1)
    sub_a.subscribe(f"met/{uid}/+", 1)  # overlapping: still one delivery per message
    sub_b.subscribe(f"met/{uid}/#", 0)
    assert _delta(before, scrape(base), "broker_subscriptions") == 3

    for _ in range(4):
        pub.publish(f"met/{uid}/x", b"0123456789", 1)
    sub_a.expect(4)
    sub_b.expect(4)
    after = scrape(base)
    assert _delta(before, after, f"mqtt_messages_in_count{NS}") == 4
    assert _delta(before, after, f"mqtt_messages_in_bytes_count{NS}") == 40
    assert _delta(before, after, f"mqtt_messages_out_count{NS}") == 8
    assert _delta(before, after, f"mqtt_messages_out_bytes_count{NS}") == 80
    assert _delta(before, after, f"broker_messages_published_count{NS}") == 4
    assert _delta(before, after, f"broker_messages_dispatched_count{NS}") == 8

    assert sub_a.unsubscribe(f"met/{uid}/x") == [0]
    assert _delta(before, scrape(base), "broker_subscriptions") == 2
    for c in (sub_a, sub_b, pub):
        c.close()
    wait_until(lambda: _delta(before, scrape(base), f"mqtt_connections{NS}") == 0)
    wait_until(lambda: _delta(before, scrape(base), "broker_subscriptions") == 0)


def test_metrics_count_abruptly_closed_connections(broker, raw, uid):
    base = broker.http
    before = scrape(base)
    clients = [raw(5 if i % 2 else 4) for i in range(4)]
    for i, c in enumerate(clients):
        c.connect(f"abrupt{i}-{uid}")
    wait_until(lambda: _delta(before, scrape(base), f"mqtt_connections{NS}") == 4)
    for c in clients:
        c.kill()
    wait_until(lambda: _delta(before, scrape(base), f"mqtt_connections{NS}") == 0)


def test_dropped_count_for_oversize_delivery(broker, raw, uid):
    base = broker.http
    before = scrape(base)
    sub = raw(5)
    sub.connect(f"sub-{uid}", properties={"maximum_packet_size": 100})
    sub.subscribe(f"drop/{uid}")
    pub = raw(5)
    pub.connect(f"pub-{uid}")
    pub.publish(f"drop/{uid}", b"z" * 500)
    pub.publish(f"drop/{uid}", b"ok")
    assert sub.expect(Publish).payload == b"ok"
    assert _delta(before, scrape(base), f"mqtt_messages_dropped_count{NS}") == 1


# --- HTTP publish -----------------------------------------------------------------------------
def _post(broker, topic: str, body: dict) -> tuple[int, dict]:
    path = f"/api/v1/topics/{urllib.parse.quote(topic, safe='')}/messages"
    return http(broker.http, "POST", path, broker.token, body)


def test_http_publish_reaches_mqtt_subscribers(broker, paho, uid):
    topic = f"http/{uid}/in"
    v5 = subscribed(paho, f"v5-{uid}", f"http/{uid}/#", 2, v5=True)
    v311 = subscribed(paho, f"v311-{uid}", topic, 0, v5=False)

    status, body = _post(
        broker,
        topic,
        {"payload": "hello", "qos": 1, "content_type": "text/plain", "headers": {"h": "v"}},
    )
    assert status == 200, body
    m = v5.get()
    assert (m.topic, m.payload, m.qos) == (topic, b"hello", 1)
    assert m.properties.ContentType == "text/plain"
    assert m.properties.UserProperty == [("h", "v")]
    m = v311.get()
    assert (m.topic, m.payload, m.qos) == (topic, b"hello", 0)

    binary = bytes(range(256))
    status, body = _post(
        broker, topic, {"payload": base64.b64encode(binary).decode(), "encoding": "base64"}
    )
    assert status == 200, body
    assert v5.get().payload == binary


def test_http_publish_without_token_is_refused(broker, paho, uid):
    sub = subscribed(paho, f"sub-{uid}", f"httpauth/{uid}", 0, v5=True)
    path = f"/api/v1/topics/httpauth%2F{uid}/messages"
    status, _ = http(broker.http, "POST", path, None, {"payload": "x"})
    assert status == 401
    sub.expect_none()


def test_http_publish_retained(broker, paho, uid):
    topic = f"httpret/{uid}"
    status, body = _post(broker, topic, {"payload": "kept", "retain": True})
    assert status == 200, body
    sub = subscribed(paho, f"sub-{uid}", topic, 1, v5=True)
    m = sub.get(timeout=2)
    assert (m.payload, m.retain) == (b"kept", True)


# --- subscriptions API ----------------------------------------------------------------------
def _subscriptions(broker) -> list[dict]:
    status, body = http(broker.http, "GET", "/api/v1/subscriptions", broker.token)
    assert status == 200, body
    return body["data"]


def test_subscriptions_api_lists_mqtt_subscriptions(broker, paho, uid):
    cid = f"lister-{uid}"
    c = subscribed(paho, cid, f"api/{uid}/#", 1, v5=True)
    c.subscribe(f"$share/grp/api/{uid}/x", 2)
    mine = {s["topic_filter"]: s for s in _subscriptions(broker) if s.get("client_id") == cid}
    assert set(mine) == {f"api/{uid}/#", f"api/{uid}/x"}
    plain, shared = mine[f"api/{uid}/#"], mine[f"api/{uid}/x"]
    assert (plain["protocol"], plain["qos"], plain["shared_group"]) == ("mqtt", 1, None)
    assert (shared["protocol"], shared["qos"], shared["shared_group"]) == ("mqtt", 2, "grp")
    assert plain["namespace"] == "default"

    c.unsubscribe(f"api/{uid}/#")
    mine = [s for s in _subscriptions(broker) if s.get("client_id") == cid]
    assert [s["topic_filter"] for s in mine] == [f"api/{uid}/x"]
    c.close()
    wait_until(lambda: not [s for s in _subscriptions(broker) if s.get("client_id") == cid])


def test_persistent_session_subscriptions_listed_while_offline(broker, paho, uid):
    cid = f"offline-{uid}"
    c = paho(cid, v5=True)
    c.connect(clean_start=False, properties={"SessionExpiryInterval": 60})
    c.subscribe(f"offline/{uid}", 1)
    c.close()
    assert [s["topic_filter"] for s in _subscriptions(broker) if s["client_id"] == cid] == [
        f"offline/{uid}"
    ]


# --- slow subscriber ------------------------------------------------------------------------
def test_slow_qos0_subscriber_is_dropped_not_blocking(broker, paho, uid):
    """A QoS 0 subscriber that stops reading loses messages (counted) instead of slowing
    down the publisher or other subscribers, or growing the broker's memory."""
    topic = f"slow/{uid}"
    base = broker.http
    before = scrape(base)
    port = broker.ports["mqtt"]

    slow = socket.socket()
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow.settimeout(5)
    slow.connect((HOST, port))
    reader = RawClient(port, 5, sock=slow)
    reader.connect(f"slow-{uid}")
    assert reader.subscribe(topic) == [0]
    # …and from now on it never reads again.

    good = subscribed(paho, f"good-{uid}", topic, 1, v5=True)

    pub = RawClient(port, 5)
    pub.connect(f"pub-{uid}")
    n, payload = 300, b"s" * 65536  # ~19 MiB: far past any socket and write buffer
    pub.send_raw(b"".join(encode(Publish(topic, payload, 1, packet_id=i + 1), 5) for i in range(n)))
    acks = [pub.expect(Puback, timeout=20) for _ in range(n)]
    assert len(acks) == n
    got = good.expect(n, timeout=30)
    assert all(m.payload == payload for m in got)
    dropped = _delta(before, scrape(base), f"mqtt_messages_dropped_count{NS}")
    assert dropped > 0, "nothing dropped for a subscriber that stopped reading"
    slow.close()
    pub.close()
