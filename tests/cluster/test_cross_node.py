"""Cross-node MQTT routing between brokers running as separate OS processes.

Three brokers ("a", "b", "c") share one SQLite meta store and one object directory and find
each other by gossip (DESIGN.md §4, §6).  A subscriber anywhere gets what is published
anywhere once its SUBACK is in; a message goes once to each remote node with a matching
route; a shared group picks one member cluster-wide; a dead node's routes go away.

Tests 1-5, 7, 8 share one module-scoped cluster (each uses its own topic root, and every
client it opens is disconnected at its end); the kill/restart test gets a cluster of its own.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from flowmq_cluster.config import GossipConfig
from flowmq_meta import keys, open_meta_store
from tests.fixtures.broker_process import BrokerProcess
from tests.fixtures.cluster import BrokerCluster, http, metric, wait_for

pytestmark = pytest.mark.timeout(90)

TOKEN = "cross-node"
NAMES = ("a", "b", "c")
STEP_S = 10.0  # a message, an ack, a subscription: generous on a loaded CI machine
# gossip_cluster_size is scraped, not pushed: allow a scrape's worth on top of the bound.
DETECTION_S = GossipConfig().detection_bound(len(NAMES)) + 1.0
SESSION_TAKEN_OVER = 0x8E


# --- HTTP helpers ------------------------------------------------------------------------------


def forwarded(broker: BrokerProcess) -> float:
    return metric(broker.http, "broker_messages_forwarded_count", 'namespace="default"')


def route_test(broker: BrokerProcess, topic: str) -> dict[str, Any]:
    quoted = urllib.request.quote(topic, safe="")
    answer = http("GET", f"{broker.http}/api/v1/routes?topic={quoted}", token=TOKEN)
    assert answer["success"] is True, answer
    return answer["data"]


# --- the cluster -------------------------------------------------------------------------------


class Cluster(BrokerCluster):
    def routes_in_meta(self, node: str) -> list[tuple[Any, ...]]:
        """``node``'s Subscription routes as the meta store holds them (read directly)."""

        async def read() -> list[tuple[Any, ...]]:
            store = open_meta_store(self.meta_url)
            try:
                begin, end = keys.ROUTES.range(node)
                rows = await store.transact(lambda tr: tr.get_range(begin, end))
            finally:
                await store.close()
            return [tuple(keys.ROUTES.unpack(key)) for key, _ in rows]

        return asyncio.run(read())


def make_cluster(root: Path) -> Cluster:
    made = Cluster(root, TOKEN, NAMES)
    try:
        made.start_all()
        made.wait_size(3, NAMES, timeout=15)
        wait_routable(made)
    except BaseException:
        made.stop_all()
        raise
    return made


def wait_routable(cluster: Cluster, timeout: float = 5.0) -> None:
    """Wait until every broker routes to every other one.  gossip_cluster_size counts a new
    member a gossip round before its link port (gossip meta) is known, and until then
    routes are neither awaited nor applied between the two; test 6's restart covers that window."""
    probes = []
    try:
        for name in NAMES:
            probe = Client(cluster[name])
            probes.append(probe)
            probe.subscribe(f"xn-ready/{name}")
        for name in NAMES:
            for other in NAMES:
                wait_for(
                    lambda at=cluster[other], node=name: (
                        node in route_test(at, f"xn-ready/{node}")["subscriber_nodes"]
                    ),
                    timeout,
                    f"{other} routes to {name}",
                )
    finally:
        for probe in probes:
            probe.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    made = make_cluster(tmp_path_factory.mktemp("cross-node"))
    try:
        yield made
    finally:
        made.stop_all()


@pytest.fixture
def own_cluster(tmp_path) -> Iterator[Cluster]:
    made = make_cluster(tmp_path)
    try:
        yield made
    finally:
        made.stop_all()


# --- MQTT clients ------------------------------------------------------------------------------

_ids = itertools.count()


class Client:
    """A paho 2.x client on its own network thread; callbacks feed events and queues."""

    def __init__(
        self,
        broker: BrokerProcess,
        client_id: str | None = None,
        *,
        v5: bool = False,
        clean_start: bool = True,
        session_expiry: int | None = None,
    ) -> None:
        self.client_id = client_id or f"xn-{next(_ids)}"
        self.v5 = v5
        self.paho = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=self.client_id,
            protocol=mqtt.MQTTv5 if v5 else mqtt.MQTTv311,
            clean_session=None if v5 else clean_start,
            reconnect_on_failure=False,  # a taken-over client must not take the session back
        )
        self.messages: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
        self.connected = threading.Event()
        self.disconnected = threading.Event()
        self.connect_flags: Any = None
        self.connect_rc: Any = None
        self.disconnect_rc: Any = None
        self._acks: dict[int, tuple[threading.Event, list[Any]]] = {}
        self._lock = threading.Lock()
        self.paho.on_connect = self._on_connect
        self.paho.on_disconnect = self._on_disconnect
        self.paho.on_message = lambda _c, _u, msg: self.messages.put(msg)
        self.paho.on_subscribe = self._on_ack
        self.paho.on_unsubscribe = self._on_ack
        properties = None
        if v5 and session_expiry is not None:
            properties = Properties(PacketTypes.CONNECT)
            properties.SessionExpiryInterval = session_expiry
        kwargs: dict[str, Any] = {"keepalive": 30}
        if v5:
            kwargs.update(clean_start=clean_start, properties=properties)
        self.paho.connect("127.0.0.1", broker.ports["mqtt"], **kwargs)
        self.paho.loop_start()
        assert self.connected.wait(STEP_S), f"{self.client_id}: no CONNACK"
        assert not self.connect_rc.is_failure, f"{self.client_id}: CONNACK {self.connect_rc}"

    # callbacks (network thread)
    def _on_connect(self, _c, _u, flags, reason_code, _props) -> None:
        self.connect_flags, self.connect_rc = flags, reason_code
        self.connected.set()

    def _on_disconnect(self, _c, _u, _flags, reason_code, _props) -> None:
        self.disconnect_rc = reason_code
        self.disconnected.set()

    def _on_ack(self, _c, _u, mid, reason_codes, _props) -> None:
        with self._lock:
            event, box = self._acks.setdefault(mid, (threading.Event(), []))
        box.append(reason_codes)
        event.set()

    def _wait_ack(self, mid: int, what: str) -> list[Any]:
        with self._lock:
            event, box = self._acks.setdefault(mid, (threading.Event(), []))
        assert event.wait(STEP_S), f"{self.client_id}: no {what}"
        return box[0]

    # operations
    def subscribe(self, topic_filter: str, qos: int = 1) -> None:
        """Subscribe and wait for the SUBACK (granted, not a failure)."""
        result, mid = self.paho.subscribe(topic_filter, qos)
        assert result == mqtt.MQTT_ERR_SUCCESS
        codes = self._wait_ack(mid, "SUBACK")
        assert all(not rc.is_failure for rc in codes), codes

    def unsubscribe(self, topic_filter: str) -> None:
        result, mid = self.paho.unsubscribe(topic_filter)
        assert result == mqtt.MQTT_ERR_SUCCESS
        self._wait_ack(mid, "UNSUBACK")

    def publish(self, topic: str, payload: bytes | str, qos: int = 0, retain: bool = False):
        return self.paho.publish(topic, payload, qos=qos, retain=retain)

    def publish_all(self, items: list[tuple[str, bytes | str, int]], retain: bool = False) -> None:
        """Publish ``(topic, payload, qos)`` in order; wait until every one is out (QoS 0)
        or acknowledged (QoS 1/2)."""
        infos = [self.publish(t, p, q, retain) for t, p, q in items]
        deadline = time.monotonic() + STEP_S + len(items) * 0.01
        for info in infos:
            info.wait_for_publish(max(0.0, deadline - time.monotonic()))
            assert info.is_published(), f"{self.client_id}: message {info.mid} not acknowledged"

    def receive(self, count: int, timeout: float = STEP_S) -> list[mqtt.MQTTMessage]:
        """Exactly the next ``count`` messages; fails if they do not all come in ``timeout``."""
        got: list[mqtt.MQTTMessage] = []
        deadline = time.monotonic() + timeout
        while len(got) < count:
            try:
                got.append(self.messages.get(timeout=max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                raise AssertionError(
                    f"{self.client_id}: {len(got)} of {count} messages in {timeout:.1f} s"
                ) from None
        return got

    def drain(self, quiet: float = 0.3) -> list[mqtt.MQTTMessage]:
        """Whatever else arrives until nothing has for ``quiet`` s (to catch duplicates)."""
        extra = []
        while True:
            try:
                extra.append(self.messages.get(timeout=quiet))
            except queue.Empty:
                return extra

    def close(self) -> None:
        try:
            if self.paho.is_connected():
                self.paho.disconnect()
        finally:
            self.paho.loop_stop()


@pytest.fixture
def clients() -> Iterator[Callable[..., Client]]:
    """``clients(broker, ...)`` opens a connected Client; all are closed after the test."""
    opened: list[Client] = []

    def open_client(broker: BrokerProcess, *args: Any, **kwargs: Any) -> Client:
        client = Client(broker, *args, **kwargs)
        opened.append(client)
        return client

    yield open_client
    for client in opened:
        client.close()


def payloads(messages: list[mqtt.MQTTMessage]) -> list[str]:
    return [m.payload.decode() for m in messages]


# --- 1. local and two remote nodes -------------------------------------------------------------


def test_a_publish_on_a_reaches_subscribers_on_b_c_and_a(cluster, clients):
    a = cluster["a"]
    n = 200
    subscribers = {}
    for name in ("b", "c", "a"):
        subscribers[name] = clients(cluster[name])
        subscribers[name].subscribe("x/#", qos=1)
    before = forwarded(a)

    publisher = clients(a)
    items = [("x/q0", f"q0-{i}", 0) for i in range(n)] + [("x/q1", f"q1-{i}", 1) for i in range(n)]
    publisher.publish_all(items)

    for name, subscriber in subscribers.items():
        got = subscriber.receive(2 * n)
        assert subscriber.drain() == [], f"duplicates at {name}"
        by_qos = {0: [], 1: []}
        for message in got:
            by_qos[int(message.topic[-1])].append(message.payload.decode())
        assert by_qos[0] == [f"q0-{i}" for i in range(n)], f"QoS 0 at {name}: lost or reordered"
        assert by_qos[1] == [f"q1-{i}" for i in range(n)], f"QoS 1 at {name}: lost or reordered"
        assert {m.qos for m in got if m.topic == "x/q1"} == {1}
    # Two remote nodes (b and c) with a matching route, once each per message.
    assert forwarded(a) - before == 2 * 2 * n


# --- 2. once per node, whatever the number of subscribers there --------------------------------


def test_a_message_is_forwarded_once_per_node(cluster, clients):
    a, b = cluster["a"], cluster["b"]
    n = 100
    first, second = clients(b), clients(b)
    first.subscribe("dup/#")
    second.subscribe("dup/+/x")  # a different filter matching the same topics
    third = clients(b)
    third.subscribe("dup/#")  # and the same filter again
    before = forwarded(a)

    clients(a).publish_all([("dup/1/x", f"m{i}", 1) for i in range(n)])

    expected = [f"m{i}" for i in range(n)]
    for subscriber in (first, second, third):
        assert payloads(subscriber.receive(n)) == expected
        assert subscriber.drain() == []
    assert forwarded(a) - before == n


# --- 3. shared subscription across nodes -------------------------------------------------------


def test_a_shared_group_spread_over_nodes_gets_each_message_once(cluster, clients):
    a, b, c = cluster["a"], cluster["b"], cluster["c"]
    n = 100
    on_b, on_c = clients(b), clients(c)
    on_b.subscribe("$share/g/jobs/#")
    on_c.subscribe("$share/g/jobs/#")
    before = forwarded(a)

    clients(a).publish_all([(f"jobs/{i % 7}", f"j{i}", 1) for i in range(n)])

    received: dict[str, list[str]] = {"b": [], "c": []}
    deadline = time.monotonic() + STEP_S
    while len(received["b"]) + len(received["c"]) < n:
        assert time.monotonic() < deadline, f"only {received} of {n} arrived"
        for name, member in (("b", on_b), ("c", on_c)):
            try:
                received[name].append(member.messages.get(timeout=0.05).payload.decode())
            except queue.Empty:
                pass
    received["b"] += payloads(on_b.drain())
    received["c"] += payloads(on_c.drain())

    everything = received["b"] + received["c"]
    assert len(everything) == n, "a message reached more than one member"
    assert sorted(everything) == sorted(f"j{i}" for i in range(n))
    assert received["b"] and received["c"], f"one member got nothing: {received}"
    assert forwarded(a) - before == n


# --- 4. route test lists remote subscriber nodes -----------------------------------------------


def test_route_test_lists_a_remote_subscriber_node_until_it_unsubscribes(cluster, clients):
    a, c = cluster["a"], cluster["c"]
    topic = "rt/1/leaf"
    assert "c" not in route_test(a, topic)["subscriber_nodes"]
    subscriber = clients(c)
    subscriber.subscribe("rt/+/leaf")
    data = route_test(a, topic)  # right after the SUBACK: no waiting
    assert data["topic"] == topic
    assert data["subscriber_nodes"] == ["c"]
    assert "c" in route_test(c, topic)["subscriber_nodes"]

    subscriber.unsubscribe("rt/+/leaf")
    started = time.monotonic()
    wait_for(lambda: "c" not in route_test(a, topic)["subscriber_nodes"], 1.0, "route gone on a")
    assert time.monotonic() - started < 1.0


# --- 5. a destination created on one node routes on another ------------------------------------


def test_a_stream_created_on_c_routes_on_a_within_a_second(cluster):
    a, c = cluster["a"], cluster["c"]
    topic = "s5/sensor/1"
    assert not any(d["name"] == "xn-s5" for d in route_test(a, topic)["destinations"])
    created = http(
        "POST", f"{c.http}/api/v1/streams", {"name": "xn-s5", "topic_filters": ["s5/#"]}, TOKEN
    )
    assert created["success"] is True, created
    started = time.monotonic()

    def routed() -> bool:
        return any(d["name"] == "xn-s5" for d in route_test(a, topic)["destinations"])

    wait_for(routed, 1.0, "stream created on c routed on a")
    took = time.monotonic() - started
    assert took < 1.0
    [dest] = [d for d in route_test(a, topic)["destinations"] if d["name"] == "xn-s5"]
    assert dest["type"] == "stream" and dest["topic_filters"] == ["s5/#"]


# --- 6. a node dies, and comes back ------------------------------------------------------------


def test_a_killed_nodes_routes_go_and_it_routes_again_after_restart(own_cluster, clients):
    cluster = own_cluster
    a, b, c = cluster["a"], cluster["b"], cluster["c"]
    topic = "k6/t"
    doomed = Client(c)  # not closed by the fixture: its broker is about to die
    doomed.subscribe("k6/#")
    assert "c" in route_test(a, topic)["subscriber_nodes"]  # at SUBACK (cluster routable)
    assert any(r[0] == "c" for r in cluster.routes_in_meta("c"))

    cluster.kill("c")
    killed = time.monotonic()
    cluster.wait_size(2, ("a", "b"), timeout=DETECTION_S)
    detected = time.monotonic() - killed
    assert detected < DETECTION_S
    wait_for(lambda: "c" not in route_test(a, topic)["subscriber_nodes"], 1.0, "c's route on a")
    wait_for(lambda: "c" not in route_test(b, topic)["subscriber_nodes"], 1.0, "c's route on b")
    wait_for(lambda: not cluster.routes_in_meta("c"), 2.0, "c's routes cleared in the meta store")
    doomed.paho.loop_stop()

    on_b = clients(b)
    on_b.subscribe("k6/#")
    publisher = clients(a)
    publisher.publish_all([(topic, "after-death", 1)])  # PUBACK although c is gone
    assert payloads(on_b.receive(1)) == ["after-death"]

    cluster.start("c")
    cluster.wait_size(3, ("a", "c"), timeout=15)
    c = cluster["c"]
    on_c = clients(c)
    on_c.subscribe("k6/#")
    routed_at_suback = route_test(a, topic)["subscriber_nodes"]
    publisher.publish_all([(topic, "after-restart", 1)])
    assert payloads(on_b.receive(1)) == ["after-restart"]
    try:
        assert payloads(on_c.receive(1)) == ["after-restart"]
    except AssertionError as exc:
        raise AssertionError(
            f"{exc}; a's subscriber_nodes at c's SUBACK: {routed_at_suback}"
        ) from None
    assert "c" in routed_at_suback


def test_a_dead_nodes_offline_session_keeps_its_stored_messages(own_cluster, clients):
    """Messages for an offline persistent session on c are in its durable queue: c dies,
    the client comes back on b and gets them, and its subscription still works."""
    cluster = own_cluster
    a, b, c = cluster["a"], cluster["b"], cluster["c"]
    away = Client(c, "k7-away", v5=True, clean_start=False, session_expiry=300)
    away.subscribe("k7/#")
    away.close()
    publisher = clients(a)
    # PUBACK from a means c stored them: a forwarded QoS 1 message is confirmed by the node
    # that stores it for its offline session.
    publisher.publish_all([(f"k7/{i}", f"s{i}", 1) for i in range(5)])
    stored = metric(c.http, "queue_messages_enqueued_count", 'namespace="default",queue="$session"')
    assert stored == 5
    cluster.kill("c")
    cluster.wait_size(2, ("a", "b"), timeout=DETECTION_S)

    back = clients(b, "k7-away", v5=True, clean_start=False, session_expiry=300)
    assert back.connect_flags.session_present is True
    assert payloads(back.receive(5)) == [f"s{i}" for i in range(5)]
    publisher.publish_all([("k7/after", "later", 1)])
    assert payloads(back.receive(1)) == ["later"]


# --- 7. retained messages across nodes ---------------------------------------------------------


def test_a_message_retained_on_a_is_delivered_by_b_to_a_later_subscriber(cluster, clients):
    a, b = cluster["a"], cluster["b"]
    publisher = clients(a)
    publisher.publish_all([("r7/state", "kept", 1)], retain=True)
    try:
        subscriber = clients(b)
        subscriber.subscribe("r7/#")
        [message] = subscriber.receive(1)
        assert message.topic == "r7/state" and message.payload == b"kept"
        assert bool(message.retain) is True
    finally:
        publisher.publish_all([("r7/state", b"", 1)], retain=True)  # clear it


# --- 8. session takeover across nodes ----------------------------------------------------------


def test_the_same_client_id_on_b_takes_the_session_over_from_a(cluster, clients):
    a, b = cluster["a"], cluster["b"]
    first = clients(a, "roamer", v5=True)
    second = clients(b, "roamer", v5=True)
    assert second.connect_flags.session_present is False
    assert first.disconnected.wait(STEP_S), "the connection on a was not closed"
    assert first.disconnect_rc.value == SESSION_TAKEN_OVER, first.disconnect_rc
    assert second.paho.is_connected()


def test_a_persistent_session_moves_with_its_subscription_to_b(cluster, clients):
    a, b = cluster["a"], cluster["b"]
    publisher = clients(a)  # connected before: it publishes right after the takeover
    first = clients(a, "roamer-p", v5=True, clean_start=False, session_expiry=300)
    first.subscribe("roam/#")
    second = clients(b, "roamer-p", v5=True, clean_start=False, session_expiry=300)
    assert first.disconnected.wait(STEP_S), "the connection on a was not closed"
    assert first.disconnect_rc.value == SESSION_TAKEN_OVER, first.disconnect_rc
    assert second.connect_flags.session_present is True

    publisher.publish_all([(f"roam/{i}", f"r{i}", 1) for i in range(5)])
    assert payloads(second.receive(5)) == [f"r{i}" for i in range(5)]
    assert first.messages.empty()
    # End the session so the module's other tests don't see it.
    second.close()
    clients(b, "roamer-p", v5=True, clean_start=True, session_expiry=0).close()
