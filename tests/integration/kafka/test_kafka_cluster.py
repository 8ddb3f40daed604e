"""Two stateless brokers on one meta store and object store: Kafka clients see both,
partition leaders and group coordinators are spread over them, and records produced through
either are read back exactly."""

from __future__ import annotations

import time

import pytest

from tests.fixtures.broker_process import start_broker
from tests.fixtures.waiting import wait_until
from tests.integration.kafka.conftest import confluent_conf

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

# Leaders are rendezvous-hashed over node names that differ each run: with 8 partitions all
# would land on one of two brokers 1 run in 128; with 32, 1 in 2**31.
PARTITIONS = 32
RECORDS = 800


def test_two_brokers_share_topics_partitions_and_groups(tmp_path) -> None:
    data_dir = tmp_path / "data"
    first = start_broker(data_dir)
    second = start_broker(data_dir)  # same SQLite meta store and object directory
    try:
        both = f"127.0.0.1:{first.ports['kafka']},127.0.0.1:{second.ports['kafka']}"
        admin = AdminClient({**confluent_conf(first), "bootstrap.servers": both})

        def brokers():
            return admin.list_topics(timeout=5).brokers

        deadline = time.monotonic() + 15
        while len(brokers()) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert {b.port for b in brokers().values()} == {first.ports["kafka"], second.ports["kafka"]}

        admin.create_topics([NewTopic("shared", PARTITIONS, 1)])["shared"].result(10)

        def view() -> tuple[set[int], set[int]]:
            """One Metadata answer (from whichever broker librdkafka asks): its brokers and
            the leaders of the topic's partitions."""
            meta = admin.list_topics("shared", timeout=5)
            return set(meta.brokers), {p.leader for p in meta.topics["shared"].partitions.values()}

        # Each broker refreshes its view of the node table every 2 s; once both have seen
        # the other, the partitions over 2 brokers give each some to lead.
        deadline = time.monotonic() + 20
        while not (len((seen := view())[0]) == 2 and seen[1] == seen[0]):
            assert time.monotonic() < deadline, seen
            time.sleep(0.2)
        assert len(seen[0]) == 2 and seen[1] == seen[0], seen

        producer = ck.Producer(
            {**confluent_conf(first, acks="all", linger_ms=5), "bootstrap.servers": both}
        )
        for i in range(RECORDS):
            producer.produce("shared", value=b"r%d" % i, partition=i % PARTITIONS)
        assert producer.flush(15) == 0

        consumer = ck.Consumer(
            {
                **confluent_conf(second, group_id="shared-group", auto_offset_reset="earliest"),
                "bootstrap.servers": both,
            }
        )
        consumer.subscribe(["shared"])
        got = []
        deadline = time.monotonic() + 20
        try:
            while len(got) < RECORDS and time.monotonic() < deadline:
                m = consumer.poll(0.2)
                if m is not None and m.error() is None:
                    got.append((m.partition(), m.offset(), m.value()))
        finally:
            consumer.close()
        assert sorted(v for _, _, v in got) == sorted(b"r%d" % i for i in range(RECORDS))
        for p in range(PARTITIONS):
            assert sorted(o for q, o, _ in got if q == p) == list(range(RECORDS // PARTITIONS))
    finally:
        second.stop()
        first.stop()


def test_advertised_host_is_what_clients_are_told(tmp_path) -> None:
    """Kafka's advertised.listeners: a broker with ``advertised_host`` is named by it in every
    broker's Metadata; one without is named by the address the client used (or, for another
    broker, its cluster address)."""
    data_dir = tmp_path / "data"
    plain = start_broker(data_dir)
    advertised = start_broker(data_dir, "--advertised-host", "localhost")
    try:
        for entry in (plain, advertised):
            admin = AdminClient(
                {**confluent_conf(entry), "bootstrap.servers": f"127.0.0.1:{entry.ports['kafka']}"}
            )

            def hosts(admin=admin) -> dict[int, str]:
                return {b.port: b.host for b in admin.list_topics(timeout=5).brokers.values()}

            seen = wait_until(lambda hosts=hosts: len(seen := hosts()) == 2 and seen, 15,
                              step=0.2, what="both brokers in Metadata")  # fmt: skip
            assert seen[advertised.ports["kafka"]] == "localhost"
            assert seen[plain.ports["kafka"]] == "127.0.0.1"
    finally:
        advertised.stop()
        plain.stop()
