"""Issue #6 across OS processes: Kafka and AMQP clients live through a broker's SIGKILL.

Three brokers ("a", "b", "c") share one SQLite meta store and one object directory and find
each other by gossip.  The tests run in order on one module-scoped cluster (each brings "c"
back up if an earlier one left it dead):

1. Kafka: a producer (acks=all) and a consumer group, both bootstrapped from "a" and "b"
   only, while "c" leads partitions and coordinates the group; "c" is SIGKILLed midway.
2. The killed node restarts with the same id and data dir and is seen again.
3. AMQP: the leases a consumer on "c" held are reaped by a survivor after "c" dies.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pika
import pytest

from flowmq_broker.kafka.cluster import REFRESH_S, KafkaNode, _score, kafka_node_id
from flowmq_cluster.config import GossipConfig
from flowmq_queue.engine import DEFAULT_LEASE_MS
from flowmq_wire.kafka import REQUEST_CLASSES
from tests.fixtures.broker_process import BrokerProcess
from tests.fixtures.cluster import BrokerCluster, cluster_size, metric, wait_for
from tests.integration.kafka.conftest import RawKafka

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

pytestmark = pytest.mark.timeout(120)

TOKEN = "failover"
NAMES = ("a", "b", "c")
METADATA = 3
PARTITIONS = 4
# gossip_cluster_size is scraped, not pushed: allow a scrape's worth on top of the bound.
DETECTION_S = GossipConfig().detection_bound(len(NAMES)) + 1.0
# A broker's Kafka view follows its node table every REFRESH_S.
VIEW_S = REFRESH_S + 2.0
REAPER_S = 2.0  # flowmq_broker.queues.REAPER_INTERVAL_S (not imported: server-side module)


# --- helpers ---------------------------------------------------------------------------------


def kafka_requests(broker: BrokerProcess, api: str) -> float:
    return metric(broker.http, "kafka_requests_count", f'api="{api}"')


def owner(key: str) -> str:
    """The node ``key`` maps to among all three, as ClusterView.owner computes it."""
    nodes = [KafkaNode(n, kafka_node_id(n), None, 0) for n in NAMES]
    return max(nodes, key=lambda n: _score(key.encode(), n)).name


def pick(prefix: str, fits: Callable[[str], bool]) -> str:
    return next(name for i in range(10_000) if fits(name := f"{prefix}-{i}"))


def kafka_metadata(broker: BrokerProcess, topic: str) -> tuple[dict[int, int], dict[int, int]]:
    """Metadata answered by ``broker`` itself: ({broker id: port}, {partition: leader id})."""
    client = RawKafka(broker.ports["kafka"])
    try:
        topic_cls = REQUEST_CLASSES[METADATA][12].MetadataRequestTopic
        response = client.request(
            METADATA,
            12,
            topics=[topic_cls(topic_id=None, name=topic)],
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=False,
        )
    finally:
        client.sock.close()
    brokers = {b.node_id: b.port for b in response.brokers}
    leaders = {p.partition_index: p.leader_id for t in response.topics for p in t.partitions}
    return brokers, leaders


QUIET = logging.getLogger("librdkafka-in-failover-tests")
QUIET.propagate = False


def kafka_conf(*brokers: BrokerProcess, **extra: Any) -> dict[str, Any]:
    conf: dict[str, Any] = {
        "bootstrap.servers": ",".join(f"127.0.0.1:{b.ports['kafka']}" for b in brokers),
        "logger": QUIET,
        "topic.metadata.refresh.interval.ms": 1000,
        "socket.connection.setup.timeout.ms": 3000,
        "reconnect.backoff.max.ms": 500,
    }
    conf.update({k.replace("_", "."): v for k, v in extra.items()})
    return conf


class Cluster(BrokerCluster):
    def wait_whole(self, timeout: float = 15.0) -> None:
        """Every broker alive, seen by every other in gossip and in its Kafka Metadata."""
        for name in NAMES:
            if not self.alive(name):
                self.start(name)
        ids = {kafka_node_id(n) for n in NAMES}
        for name in NAMES:
            wait_for(lambda b=self[name]: cluster_size(b) == 3, timeout, f"{name} sees 3 members")
        for name in NAMES:
            wait_for(
                lambda b=self[name]: set(kafka_metadata(b, "-")[0]) == ids,
                timeout,
                f"Kafka Metadata from {name} lists all three brokers",
            )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    made = Cluster(tmp_path_factory.mktemp("failover"), TOKEN, NAMES)
    try:
        for name in NAMES:
            made.start(name)
        yield made
    finally:
        made.stop_all()


# --- 1. Kafka through a SIGKILL ------------------------------------------------------------------


class Produced:
    """A producer thread: keys 0, 1, 2, ... (value = key), acks counted by delivery report."""

    def __init__(self, conf: dict[str, Any], topic: str) -> None:
        self.producer = ck.Producer(conf)
        self.topic = topic
        self.sent = 0
        self.acked: set[int] = set()
        self.failed: dict[int, str] = {}
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _report(self, err: Any, msg: Any) -> None:
        key = int(msg.key())
        with self.lock:
            if err is None:
                self.acked.add(key)
            else:
                self.failed[key] = str(err)

    def _run(self) -> None:
        while not self.stop.is_set():
            key = str(self.sent).encode()
            self.producer.produce(self.topic, key=key, value=key, on_delivery=self._report)
            self.sent += 1
            self.producer.poll(0.005)  # serves delivery reports; paces ~150 records/s

    def acked_count(self) -> int:
        with self.lock:
            return len(self.acked)

    def acked_from(self, first: int) -> int:
        with self.lock:
            return sum(1 for k in self.acked if k >= first)

    def finish(self, timeout: float) -> int:
        self.stop.set()
        self.thread.join(10)
        return self.producer.flush(timeout)


class Consumed:
    """A consumer-group thread recording every key it receives."""

    def __init__(self, conf: dict[str, Any], topic: str) -> None:
        self.consumer = ck.Consumer(conf)
        self.consumer.subscribe([topic])
        self.keys: set[int] = set()
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            msg = self.consumer.poll(0.1)
            if msg is None:
                continue
            if msg.error() is not None:
                self.errors.append(str(msg.error()))
                continue
            with self.lock:
                self.keys.add(int(msg.key()))
        self.consumer.close()

    def count(self) -> int:
        with self.lock:
            return len(self.keys)

    def missing(self, wanted: set[int]) -> set[int]:
        with self.lock:
            return wanted - self.keys

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(15)


@pytest.mark.parametrize("idempotent", [False, True], ids=["plain", "idempotent"])
def test_kafka_producer_and_group_continue_after_sigkill(
    cluster: Cluster, idempotent: bool
) -> None:
    cluster.wait_whole()
    a, b, c = cluster["a"], cluster["b"], cluster["c"]
    c_id = kafka_node_id("c")
    # The group's coordinator and some (not all) partition leaders hash to "c".
    tag = "idem" if idempotent else "plain"
    group = pick(f"failover-group-{tag}", lambda g: owner(f"g\0{g}") == "c")

    def leads(topic: str) -> list[str]:
        return [owner(f"p\0{topic}\0{p}") for p in range(PARTITIONS)]

    topic = pick(f"failover-{tag}", lambda t: "c" in leads(t) and set(leads(t)) != {"c"})
    admin = AdminClient(kafka_conf(a, b))
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(10)
    for broker in (a, b):
        leaders = wait_for(
            lambda x=broker: len(found := kafka_metadata(x, topic)[1]) == PARTITIONS and found,
            VIEW_S,
            "the topic in Metadata",
        )
        assert sorted(p for p, leader in leaders.items() if leader == c_id) == [
            p for p, n in enumerate(leads(topic)) if n == "c"
        ]

    producer = Produced(
        kafka_conf(
            a, b,
            acks="all",
            linger_ms=5,
            message_timeout_ms=60_000,
            # The producer's sequence state for c's partitions must be found by a survivor.
            enable_idempotence=idempotent,
        ),
        topic,
    )  # fmt: skip
    consumer = Consumed(
        kafka_conf(
            a, b,
            group_id=group,
            auto_offset_reset="earliest",
            auto_commit_interval_ms=500,
            session_timeout_ms=10_000,
            heartbeat_interval_ms=500,
        ),
        topic,
    )  # fmt: skip
    consumer.thread.start()
    producer.thread.start()
    try:
        # Running through "c" as coordinator and as leader before it dies.
        wait_for(lambda: consumer.count() >= 100, 30, "100 records consumed before the kill")
        assert kafka_requests(c, "SyncGroup") > 0, "the group was not coordinated by c"
        assert kafka_requests(c, "Produce") > 0 and kafka_requests(c, "Fetch") > 0
        syncs_before = {n: kafka_requests(cluster[n], "SyncGroup") for n in ("a", "b")}

        killed_at = cluster.kill("c")
        sent_at_kill = producer.sent

        wait_for(
            lambda: cluster_size(a) == 2 and cluster_size(b) == 2,
            DETECTION_S,
            "a and b report gossip_cluster_size 2",
        )
        detected_s = time.monotonic() - killed_at

        def only_live(broker: BrokerProcess) -> bool:
            brokers, leaders = kafka_metadata(broker, topic)
            live = {kafka_node_id("a"), kafka_node_id("b")}
            return set(brokers) == live and set(leaders.values()) <= live

        for broker in (a, b):
            wait_for(lambda x=broker: only_live(x), VIEW_S, "Metadata lists only live brokers")

        # Producing continues: records produced after the kill are acknowledged.
        wait_for(lambda: producer.acked_from(sent_at_kill) >= 300, 30, "300 acks after the kill")
        assert producer.finish(30) == 0, "records still unacknowledged"
        acked = set(producer.acked)
        assert not producer.failed, f"deliveries failed: {list(producer.failed.items())[:5]}"
        assert acked == set(range(producer.sent))

        # No acknowledged record is lost (duplicates are allowed).
        wait_for(lambda: not consumer.missing(acked), 30, "every acked record consumed")
        # The group moved to a survivor.
        survivor = group_coordinator_now(a, group)
        assert survivor in ("a", "b")
        # The records can all arrive through the old assignment before the consumer's next
        # heartbeat finds that the new coordinator does not know it: wait for the rejoin.
        wait_for(
            lambda: kafka_requests(cluster[survivor], "SyncGroup") > syncs_before[survivor],
            30,
            "the consumer rejoined the group at the survivor",
        )
    finally:
        producer.stop.set()
        consumer.finish()
    print(f"detected after {detected_s:.1f} s (bound {DETECTION_S - 1:.1f} s)")
    assert "Traceback" not in cluster.output("a", "b")


def group_coordinator_now(broker: BrokerProcess, group: str) -> str:
    """The coordinator ``broker`` names for ``group`` (FindCoordinator v1)."""
    client = RawKafka(broker.ports["kafka"])
    try:
        response = client.request(10, 1, key=group, key_type=0)
    finally:
        client.sock.close()
    assert response.error_code == 0
    return {kafka_node_id(n): n for n in NAMES}[response.node_id]


# --- 2. The killed node rejoins ----------------------------------------------------------------


def test_a_restarted_node_rejoins_gossip_and_kafka_metadata(cluster: Cluster) -> None:
    if cluster.alive("c"):
        cluster.wait_whole()
        cluster.kill("c")
    a = cluster["a"]
    wait_for(lambda: cluster_size(a) == 2, DETECTION_S, "a sees c gone")
    old_data = json.loads((cluster.root / "c" / "ports.json").read_text())

    c = cluster.start("c")  # same node id, same data dir, new ports
    assert c.ports["node_id"] == old_data["node_id"] == "c"
    wait_for(lambda: cluster_size(a) == 3, 10, "a sees gossip_cluster_size 3 again")
    wait_for(lambda: cluster_size(c) == 3, 10, "c sees gossip_cluster_size 3")
    wait_for(
        lambda: kafka_metadata(a, "-")[0].get(kafka_node_id("c")) == c.ports["kafka"],
        VIEW_S,
        "Kafka Metadata from a lists c at its new port",
    )


# --- 3. AMQP leases of a dead broker -----------------------------------------------------------


def amqp(broker: BrokerProcess) -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", broker.ports["amqp"], connection_attempts=3)
    )


def test_amqp_leases_of_a_killed_broker_are_reaped_by_a_survivor(cluster: Cluster) -> None:
    cluster.wait_whole()
    a, c = cluster["a"], cluster["c"]
    queue, total, prefetch = "failover-leases", 40, 10

    publisher = amqp(a)
    ch = publisher.channel()
    ch.queue_declare(queue, durable=True)
    ch.confirm_delivery()
    for i in range(total):  # confirm mode: raises unless the broker confirms
        ch.basic_publish("", queue, b"m%d" % i, pika.BasicProperties(delivery_mode=2))

    held: list[bytes] = []
    on_c = amqp(c)
    try:
        cch = on_c.channel()
        cch.queue_declare(queue, durable=True)  # c knows it once the catalog change reached it
        cch.basic_qos(prefetch_count=prefetch)
        cch.basic_consume(queue, lambda _ch, _m, _p, body: held.append(body), auto_ack=False)
        deadline = time.monotonic() + 10
        while len(held) < prefetch:
            assert time.monotonic() < deadline, "c did not deliver a prefetch window"
            on_c.process_data_events(0.1)
        assert len(held) == prefetch  # no ack: c holds their leases
    finally:
        killed_at = cluster.kill("c")

    got: dict[bytes, bool] = {}
    consumer = publisher.channel()
    consumer.basic_qos(prefetch_count=50)

    def on_message(chan: Any, method: Any, _props: Any, body: bytes) -> None:
        got[body] = got.get(body, False) or method.redelivered
        chan.basic_ack(method.delivery_tag)

    consumer.basic_consume(queue, on_message)
    # A lease runs out at most DEFAULT_LEASE_MS after the dead holder's last renewal, then a
    # survivor's reaper (every REAPER_S) returns it and a consumer's claim picks it up.
    bound = DEFAULT_LEASE_MS / 1000 + REAPER_S + 3.0
    deadline = killed_at + bound
    while len(got) < total:
        assert time.monotonic() < deadline, (
            f"{total - len(got)} messages not back within {bound:.0f} s "
            f"(missing {sorted(set(b'm%d' % i for i in range(total)) - set(got))[:10]})"
        )
        publisher.process_data_events(0.1)
    reaped_s = time.monotonic() - killed_at
    assert set(got) == {b"m%d" % i for i in range(total)}
    assert all(got[body] for body in held), "messages held by c were not marked redelivered"
    publisher.close()
    print(f"leases of the dead broker back after {reaped_s:.1f} s")
    assert "Traceback" not in cluster.output("a", "b")
