"""Issue #11 across OS processes: a confluent-kafka idempotent producer (acks=all) lives through
the chaos harness's moment before its fatal error, focused: the meta store locked (another
process holds SQLite's write lock) and, while it is, the broker leading the producer's
partitions SIGKILLed, restarted once the lock is gone; twice.  The producer must never hit a
fatal error, every record must be acknowledged, and the log must hold each record once.

This passed before the fix too: a killed broker's memory dies with it.  The refusal librdkafka
found fatal needs a broker that stays alive with a batch stalled in its flush while the
producer goes on elsewhere; ``tests/integration/kafka/test_kafka_idempotence_brokers.py``
reproduces that deterministically."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from flowmq_broker.kafka.cluster import KafkaNode, _score, kafka_node_id
from tests.cluster.test_failover import Produced, kafka_conf, kafka_metadata, pick
from tests.fixtures.cluster import BrokerCluster, cluster_size, http, metric, wait_for
from tests.fixtures.meta_lock import meta_store_locked

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

pytestmark = pytest.mark.timeout(180)

TOKEN = "idemfaults"
NAMES = ("a", "b")
PARTITIONS = 2
ROUNDS = 2


def owner(key: str) -> str:
    nodes = [KafkaNode(n, kafka_node_id(n), None, 0) for n in NAMES]
    return max(nodes, key=lambda n: _score(key.encode(), n)).name


@pytest.fixture
def cluster(tmp_path) -> Iterator[BrokerCluster]:
    made = BrokerCluster(tmp_path, TOKEN, NAMES)
    try:
        made.start_all()
        made.wait_size(2, NAMES, 20)
        yield made
    finally:
        made.stop_all()


class Fatal:
    """librdkafka's error callback: the fatal errors, with their reason."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, err: Any) -> None:
        if err.fatal():
            with self.lock:
                self.errors.append(err.str())


def produce_requests(broker: Any) -> float:
    return metric(broker.http, "kafka_requests_count", 'api="Produce"')


def stored_keys(cluster: BrokerCluster, topic: str) -> Counter:
    """Every record key in the topic's log, counted (admin API of broker "a")."""
    keys: Counter = Counter()
    for partition in range(PARTITIONS):
        offset = 0
        while True:
            page = http(
                "GET",
                f"{cluster['a'].http}/api/v1/streams/{topic}/messages"
                f"?partition={partition}&offset={offset}&limit=1000",
                token=TOKEN,
            )["data"]
            keys.update(record["key"] for record in page["records"])
            offset = page["next_offset"]
            if offset >= page["high_watermark"] or not page["records"]:
                break
    return keys


def test_an_idempotent_producer_lives_through_kills_of_its_leader_under_a_locked_meta_store(
    cluster: BrokerCluster,
) -> None:
    a, b = cluster["a"], cluster["b"]
    # Every partition led by "b", the node killed.
    topic = pick(
        "idem-faults", lambda t: {owner(f"p\0{t}\0{p}") for p in range(PARTITIONS)} == {"b"}
    )
    admin = AdminClient(kafka_conf(a))
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(10)
    b_id = kafka_node_id("b")
    wait_for(lambda: set(kafka_metadata(a, topic)[1].values()) == {b_id}, 10, "b leads the topic")
    fatal = Fatal()
    conf = kafka_conf(
        a, b, enable_idempotence=True, acks="all", linger_ms=5, message_timeout_ms=120_000
    )  # fmt: skip
    conf["error_cb"] = fatal
    producer = Produced(conf, topic)
    producer.thread.start()
    try:
        wait_for(lambda: producer.acked_count() >= 200, 30, "200 records acknowledged")
        for _ in range(ROUNDS):
            with meta_store_locked(cluster.root / "meta.db"):
                # Produce requests reach b while its flushes wait for the lock.
                before = produce_requests(b)
                wait_for(
                    lambda x=before, node=b: produce_requests(node) > x,
                    10,
                    "b took produce requests under the lock",
                )
                cluster.kill("b")
            cluster.start("b")
            b = cluster["b"]
            wait_for(lambda: cluster_size(a) == 2, 20, "b back in the cluster")
            acked = producer.acked_count()
            wait_for(lambda x=acked: producer.acked_count() >= x + 200, 60, "200 more acknowledged")
        assert producer.finish(60) == 0, "records still unacknowledged"
    finally:
        producer.stop.set()
    assert not fatal.errors, fatal.errors
    assert not producer.failed, list(producer.failed.items())[:5]
    assert producer.acked == set(range(producer.sent))
    stored = stored_keys(cluster, topic)
    assert {int(k) for k in stored} == producer.acked
    assert [k for k, n in stored.items() if n > 1] == []
    assert "Traceback" not in cluster.output()
