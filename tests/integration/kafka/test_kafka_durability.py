"""SIGKILL of the broker while librdkafka produces with acks=all: after a restart every
acknowledged record is there, offsets are continuous, committed group offsets are intact,
and an idempotent producer's retry of an acknowledged batch is still recognised."""

from __future__ import annotations

import threading
import time

import pytest

from tests.fixtures.broker_process import start_broker
from tests.integration.kafka.conftest import RawKafka, confluent_conf
from tests.integration.kafka.test_kafka_clients import create
from tests.integration.kafka.test_kafka_protocol import (
    _idempotent_batch,
    fetch,
    init_producer_id,
    produce,
)

ck = pytest.importorskip("confluent_kafka")

PARTITIONS = 3


def read_all(broker, topic: str, partition: int, timeout: float = 15) -> list:
    consumer = ck.Consumer(
        confluent_conf(broker, group_id=f"check-{time.monotonic_ns()}", enable_auto_commit=False)
    )
    try:
        low, high = consumer.get_watermark_offsets(ck.TopicPartition(topic, partition), timeout=10)
        consumer.assign([ck.TopicPartition(topic, partition, 0)])
        out = []
        deadline = time.monotonic() + timeout
        while len(out) < high and time.monotonic() < deadline:
            for m in consumer.consume(num_messages=1000, timeout=0.5):
                assert m.error() is None, m.error()
                out.append(m)
        return out
    finally:
        consumer.close()


def test_acknowledged_records_and_offsets_survive_sigkill(tmp_path, uid) -> None:
    data_dir = tmp_path / "data"
    broker = start_broker(data_dir)
    topic, group = f"durable-{uid}", f"durable-{uid}"
    acked: dict[tuple[int, int], bytes] = {}
    try:
        create(broker, topic, PARTITIONS)
        # Committed group offsets, acknowledged before the kill.
        committer = ck.Consumer(confluent_conf(broker, group_id=group))
        committer.commit(
            offsets=[ck.TopicPartition(topic, p, 7 + p) for p in range(PARTITIONS)],
            asynchronous=False,
        )
        committer.close()
        # An idempotent batch whose "retry" comes after the restart.
        raw = RawKafka(broker.ports["kafka"])
        pid = init_producer_id(raw, timeout_ms=1000).producer_id
        batch = _idempotent_batch(pid, 0, 0, [b"once"])
        first = produce(raw, topic, 0, batch).responses[0].partition_responses[0].base_offset
        raw.close()

        producer = ck.Producer(
            confluent_conf(
                broker, acks="all", linger_ms=5, enable_idempotence=True, message_timeout_ms=3000
            )
        )
        lock = threading.Lock()

        def delivered(err, msg) -> None:
            if err is None:
                with lock:
                    acked[(msg.partition(), msg.offset())] = msg.value()

        stop = threading.Event()

        def run() -> None:
            i = 0
            while not stop.is_set():
                try:
                    producer.produce(
                        topic, value=b"rec-%d" % i, partition=i % PARTITIONS, on_delivery=delivered
                    )
                    i += 1
                except BufferError:
                    pass
                producer.poll(0 if i % 100 else 0.001)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 20
        while len(acked) < 3000 and time.monotonic() < deadline:
            time.sleep(0.01)
        broker.proc.kill()  # SIGKILL mid-stream: no flush, no clean shutdown
        broker.proc.wait(10)
        stop.set()
        thread.join(10)
        producer.flush(3)
    finally:
        broker.stop()
    with lock:
        acked_now = dict(acked)
    assert len(acked_now) >= 3000

    broker = start_broker(data_dir)
    try:
        for p in range(PARTITIONS):
            stored = read_all(broker, topic, p)
            offsets = [m.offset() for m in stored]
            assert offsets == list(range(len(offsets))), "offsets are not continuous"
            values = {m.offset(): m.value() for m in stored}
            for (partition, offset), value in acked_now.items():
                if partition == p:
                    assert values.get(offset) == value, f"acknowledged record {p}:{offset} lost"
        checker = ck.Consumer(confluent_conf(broker, group_id=group))
        committed = checker.committed(
            [ck.TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=30
        )
        checker.close()
        assert [tp.offset for tp in committed] == [7 + p for p in range(PARTITIONS)]

        raw = RawKafka(broker.ports["kafka"])
        hwm = fetch(raw, topic, 0, 0).high_watermark
        again = produce(raw, topic, 0, batch).responses[0].partition_responses[0]
        assert (again.error_code, again.base_offset) == (0, first)
        assert fetch(raw, topic, 0, 0).high_watermark == hwm  # the retry was not appended
        raw.close()
    finally:
        broker.stop()
