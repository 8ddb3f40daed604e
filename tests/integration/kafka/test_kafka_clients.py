"""Kafka client libraries, unchanged, against FlowMQ: librdkafka (confluent-kafka and kcat),
kafka-python (idempotent by default) and aiokafka."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time

import pytest

from flowmq_kas3.records import CODEC_NAMES, iter_batches
from tests.integration.kafka.conftest import bootstrap, confluent_conf, metric
from tests.integration.kafka.test_kafka_protocol import fetch

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import AdminClient, ConfigResource, NewPartitions, NewTopic  # noqa: E402


def create(broker, name: str, partitions: int = 1, **config: str) -> None:
    admin = AdminClient(confluent_conf(broker))
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=1, config=config)]
    )
    futures[name].result(10)


def produce_all(broker, topic: str, items, **conf) -> list:
    """Produce ``(partition, key, value)`` items with acks=all; returns the delivery reports."""
    producer = ck.Producer(confluent_conf(broker, acks="all", linger_ms=5, **conf))
    reports: list = []
    for partition, key, value in items:
        producer.produce(
            topic,
            value=value,
            key=key,
            partition=partition,
            on_delivery=lambda e, m: reports.append((e, m)),
        )
    assert producer.flush(15) == 0
    assert all(err is None for err, _ in reports), [err for err, _ in reports if err]
    return [m for _, m in reports]


def read_partition(broker, topic: str, partition: int, count: int, timeout: float = 15) -> list:
    consumer = ck.Consumer(
        confluent_conf(broker, group_id=f"reader-{time.monotonic_ns()}", enable_auto_commit=False)
    )
    consumer.assign([ck.TopicPartition(topic, partition, 0)])
    out = []
    deadline = time.monotonic() + timeout
    try:
        while len(out) < count and time.monotonic() < deadline:
            for m in consumer.consume(num_messages=1000, timeout=0.5):
                assert m.error() is None, m.error()
                out.append(m)
    finally:
        consumer.close()
    return out


def test_kcat_lists_brokers_and_topics(broker, uid) -> None:
    if shutil.which("kcat") is None:
        pytest.skip("kcat (Debian package kcat) is not installed")
    create(broker, f"kcat-{uid}", 3)
    out = subprocess.run(
        ["kcat", "-b", bootstrap(broker), "-L", "-t", f"kcat-{uid}"],
        capture_output=True,
        text=True,
        timeout=20,
        check=True,
    ).stdout
    assert "1 brokers:" in out
    assert f'topic "kcat-{uid}" with 3 partitions' in out
    for p in range(3):
        assert f"partition {p}, leader" in out


def test_ordering_and_exactly_the_produced_records_per_partition(broker, uid) -> None:
    topic = f"order-{uid}"
    create(broker, topic, 3)
    items = [(i % 3, f"k{i}".encode(), f"value-{i}".encode()) for i in range(3000)]
    reports = produce_all(broker, topic, items, enable_idempotence=True)
    assert len(reports) == 3000
    for p in range(3):
        want = [value for partition, _, value in items if partition == p]
        got = read_partition(broker, topic, p, len(want))
        assert [m.value() for m in got] == want
        assert [m.offset() for m in got] == list(range(len(want)))
        assert {m.partition() for m in got} == {p}
    assert metric(broker, 'kafka_messages_in_count{namespace="default"}') >= 3000
    assert metric(broker, 'kafka_requests_count{api="Produce"}') > 0


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_every_compression_codec_is_stored_and_fetched_intact(broker, raw, uid, codec) -> None:
    topic = f"codec-{codec}-{uid}"
    create(broker, topic)
    values = [f"{codec} record {i} ".encode() * 20 for i in range(500)]
    produce_all(broker, topic, [(0, None, v) for v in values], compression_type=codec)
    # Stored as produced: the batches on the wire still carry the producer's codec.
    client = raw()
    stored = fetch(client, topic, 0, 0)
    codecs = {info.compression for info in iter_batches(stored.records)}
    assert codecs == {CODEC_NAMES[codec]}
    got = read_partition(broker, topic, 0, len(values))
    assert [m.value() for m in got] == values


def test_offsets_by_time_earliest_latest(broker, uid) -> None:
    topic = f"times-{uid}"
    create(broker, topic)
    base = int(time.time() * 1000) - 100_000
    producer = ck.Producer(confluent_conf(broker, acks="all", linger_ms=0))
    for i in range(10):
        producer.produce(topic, value=b"%d" % i, partition=0, timestamp=base + i * 1000)
        producer.flush(10)
    consumer = ck.Consumer(confluent_conf(broker, group_id=f"times-{uid}"))
    try:
        found = consumer.offsets_for_times([ck.TopicPartition(topic, 0, base + 4500)], timeout=10)
        assert found[0].offset == 5
        low, high = consumer.get_watermark_offsets(ck.TopicPartition(topic, 0), timeout=10)
        assert (low, high) == (0, 10)
        later = consumer.offsets_for_times([ck.TopicPartition(topic, 0, base + 10**9)], timeout=10)
        assert later[0].offset in (-1, 10)  # none: "end" (librdkafka reports -1 or the HWM)
    finally:
        consumer.close()


def test_kafka_python_idempotent_producer_and_group_consumer(broker, uid) -> None:
    from kafka import KafkaConsumer, KafkaProducer

    topic = f"kpy-{uid}"
    create(broker, topic, 2)
    producer = KafkaProducer(bootstrap_servers=bootstrap(broker), linger_ms=5, acks="all")
    assert producer.config["enable_idempotence"]
    futures = [producer.send(topic, value=b"kp-%d" % i, partition=i % 2) for i in range(400)]
    producer.flush()
    metas = [f.get(10) for f in futures]
    assert sorted(m.offset for m in metas if m.partition == 0) == list(range(200))
    producer.close()
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap(broker),
        group_id=f"kpy-{uid}",
        auto_offset_reset="earliest",
        consumer_timeout_ms=4000,
    )
    got = [m for m in consumer]
    consumer.commit()
    committed = {p: consumer.committed(ck_tp(topic, p)) for p in (0, 1)}
    consumer.close()
    assert sorted(m.value for m in got) == sorted(b"kp-%d" % i for i in range(400))
    assert committed == {0: 200, 1: 200}


def ck_tp(topic: str, partition: int):
    from kafka import TopicPartition

    return TopicPartition(topic, partition)


def test_aiokafka_producer_and_consumer_group(broker, uid) -> None:
    aiokafka = pytest.importorskip("aiokafka")
    topic = f"aio-{uid}"

    async def main() -> list[bytes]:
        producer = aiokafka.AIOKafkaProducer(
            bootstrap_servers=bootstrap(broker), enable_idempotence=True, compression_type="gzip"
        )
        await producer.start()
        try:
            batch = [producer.send(topic, b"aio-%d" % i) for i in range(200)]
            await asyncio.gather(*[await f for f in batch])
        finally:
            await producer.stop()
        consumer = aiokafka.AIOKafkaConsumer(
            topic,
            bootstrap_servers=bootstrap(broker),
            group_id=f"aio-{uid}",
            auto_offset_reset="earliest",
            enable_auto_commit=False,
        )
        await consumer.start()
        got: list[bytes] = []
        try:
            async with asyncio.timeout(20):
                while len(got) < 200:
                    batches = await consumer.getmany(timeout_ms=500)
                    for records in batches.values():
                        got.extend(r.value for r in records)
            await consumer.commit()
            tp = aiokafka.TopicPartition(topic, 0)
            assert await consumer.committed(tp) == 200
        finally:
            await consumer.stop()
        return got

    assert asyncio.run(main()) == [b"aio-%d" % i for i in range(200)]


def test_topic_admin(broker, uid) -> None:
    admin = AdminClient(confluent_conf(broker))
    name = f"admin.{uid}"
    create(broker, name, 2, **{"retention.ms": "3600000"})
    with pytest.raises(ck.KafkaException) as exists:
        create(broker, name, 2)
    assert exists.value.args[0].code() == ck.KafkaError.TOPIC_ALREADY_EXISTS
    with pytest.raises(ck.KafkaException) as invalid:
        create(broker, f"bad/name-{uid}")
    assert invalid.value.args[0].code() == ck.KafkaError.TOPIC_EXCEPTION
    # a.b and a_b are one name to Kafka (and map to one canonical topic here).
    with pytest.raises(ck.KafkaException) as collision:
        create(broker, f"admin_{uid}")
    assert collision.value.args[0].code() == ck.KafkaError.TOPIC_EXCEPTION
    assert "collides" in collision.value.args[0].str()

    configs = admin.describe_configs([ConfigResource("topic", name)])
    entries = next(iter(configs.values())).result(10)
    assert entries["retention.ms"].value == "3600000"
    assert entries["cleanup.policy"].value == "delete"

    with pytest.raises(ck.KafkaException) as shrink:
        admin.create_partitions([NewPartitions(name, 1)])[name].result(10)
    assert shrink.value.args[0].code() == ck.KafkaError.INVALID_PARTITIONS
    admin.create_partitions([NewPartitions(name, 4)])[name].result(10)
    assert len(admin.list_topics(name, timeout=10).topics[name].partitions) == 4

    produce_all(broker, name, [(3, None, b"before delete")])
    admin.delete_topics([name])[name].result(10)
    assert name not in admin.list_topics(timeout=10).topics
    create(broker, name, 1)  # created again: empty
    assert read_partition(broker, name, 0, 1, timeout=1.5) == []


def test_produce_creates_unknown_topics(broker, uid) -> None:
    topic = f"auto-{uid}"
    produce_all(broker, topic, [(0, None, b"x")])
    assert [m.value() for m in read_partition(broker, topic, 0, 1)] == [b"x"]
