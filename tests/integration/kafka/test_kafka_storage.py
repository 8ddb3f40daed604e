"""Kafka on the storage variants: the S3 object store (a real S3 HTTP server), and what
retention does to what clients see (log start offset, OFFSET_OUT_OF_RANGE)."""

from __future__ import annotations

import asyncio
import time

import pytest

from flowmq_kas3.records import build_batch
from flowmq_kas3.retention import RetentionPolicy, apply_retention
from flowmq_wire.kafka import REQUEST_CLASSES, ErrorCode
from tests.fixtures.broker_process import start_broker
from tests.fixtures.inprocess import broker  # noqa: F401 - the in-process broker fixture
from tests.fixtures.s3 import s3_bucket_url, s3_client, s3_server  # noqa: F401
from tests.integration.kafka.conftest import RawKafka, confluent_conf
from tests.integration.kafka.test_kafka_protocol import LIST_OFFSETS, create_topic, fetch, produce

ck = pytest.importorskip("confluent_kafka")


def test_kafka_over_the_s3_object_store(tmp_path, s3_bucket_url, s3_client) -> None:  # noqa: F811
    proc = start_broker(tmp_path / "data", "--objects", s3_bucket_url)
    try:
        from tests.integration.kafka.test_kafka_clients import produce_all, read_partition

        topic = "on.s3"
        produce_all(
            proc, topic, [(0, b"k", b"s3-%d" % i) for i in range(300)], compression_type="lz4"
        )
        assert [m.value() for m in read_partition(proc, topic, 0, 300)] == [
            b"s3-%d" % i for i in range(300)
        ]
        bucket = s3_bucket_url.split("//", 1)[1].split("?", 1)[0]
        listed = s3_client.list_objects_v2(Bucket=bucket, Prefix="segments/")
        assert listed.get("KeyCount", 0) >= 1
        consumer = ck.Consumer(confluent_conf(proc, group_id="s3-check"))
        assert consumer.get_watermark_offsets(ck.TopicPartition(topic, 0), timeout=10) == (0, 300)
        consumer.close()
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nbroker output:\n{''.join(proc.output[-200:])}") from None
    finally:
        proc.stop()


async def test_retention_moves_the_log_start_clients_see(broker) -> None:  # noqa: F811
    def client_side() -> None:
        raw = RawKafka(broker.ports["kafka"])
        create_topic(raw, "short.lived")
        old = int(time.time() * 1000) - 3_600_000
        produce(raw, "short.lived", 0, build_batch([(None, b"old", [], old)] * 3))
        raw.close()

    await asyncio.to_thread(client_side)
    await broker.batcher.flush()
    # Make sure the next batch lands in a chunk of its own, newer than the cut-off.
    await asyncio.to_thread(
        lambda: produce(
            RawKafka(broker.ports["kafka"]),
            "short.lived",
            0,
            build_batch([(None, b"new", [], int(time.time() * 1000))]),
        )
    )
    result = await apply_retention(
        broker.meta, ("default", "short.lived", 0), RetentionPolicy(retention_ms=60_000)
    )
    assert result.log_start_offset == 3

    def check() -> None:
        raw = RawKafka(broker.ports["kafka"])
        gone = fetch(raw, "short.lived", 0, 0)
        assert (gone.error_code, gone.log_start_offset, gone.high_watermark) == (
            ErrorCode.OFFSET_OUT_OF_RANGE,
            3,
            4,
        )
        cls = REQUEST_CLASSES[LIST_OFFSETS][6]
        topic = cls.ListOffsetsTopic
        earliest = raw.request(
            LIST_OFFSETS,
            6,
            replica_id=-1,
            isolation_level=0,
            topics=[
                topic(
                    name="short.lived",
                    partitions=[
                        topic.ListOffsetsPartition(
                            partition_index=0, current_leader_epoch=-1, timestamp=-2
                        )
                    ],
                )
            ],
        )
        assert earliest.topics[0].partitions[0].offset == 3
        assert fetch(raw, "short.lived", 0, 3).records
        raw.close()

    await asyncio.to_thread(check)
