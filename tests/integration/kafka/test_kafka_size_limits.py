"""Size limits on the Kafka listener (docs/operations.md#limits), each exceeded by one client
while another keeps being served, on a broker started with small limits."""

from __future__ import annotations

import queue
import struct
import time
from collections.abc import Iterator

import pytest
from confluent_kafka import KafkaError, Producer

from flowmq_kas3.records import build_batch
from flowmq_wire.kafka import REQUEST_CLASSES
from tests.fixtures.broker_process import BrokerProcess
from tests.fixtures.brokers import broker_fixtures
from tests.integration.kafka.conftest import RawKafka, confluent_conf, metric
from tests.integration.kafka.test_kafka_cross_protocol import mqtt_client
from tests.integration.kafka.test_kafka_protocol import create_topic, produce

API_VERSIONS, FETCH = 18, 1
MAX_REQUEST = 256 * 1024
MAX_MESSAGE = 64 * 1024
MAX_FETCH = 100 * 1024


capped_broker, _ = broker_fixtures(
    "capped",
    "--kafka-max-request-bytes", str(MAX_REQUEST),
    "--kafka-message-max-bytes", str(MAX_MESSAGE),
    "--kafka-fetch-max-bytes", str(MAX_FETCH),
)  # fmt: skip
idle_broker, _ = broker_fixtures("idle", "--kafka-idle-timeout", "1")


@pytest.fixture
def client(capped_broker) -> Iterator[callable]:
    made: list[RawKafka] = []

    def make() -> RawKafka:
        made.append(RawKafka(capped_broker.ports["kafka"]))
        return made[-1]

    yield make
    for c in made:
        c.close()


def _served(c: RawKafka) -> bool:
    return c.request(API_VERSIONS, 3).error_code == 0


def _rejections(broker: BrokerProcess, limit: str) -> float:
    return metric(broker, f'limits_rejections_count{{limit="{limit}"}}')


def test_a_request_past_the_limit_closes_before_it_is_sent(capped_broker, client):
    bystander = client()
    assert _served(bystander)
    before = _rejections(capped_broker, "kafka_request_bytes")
    victim = client()
    # Only the size prefix and a header: the broker must not wait for the rest.
    victim.send_raw(struct.pack(">ihhih", MAX_REQUEST + 1, API_VERSIONS, 3, 1, -1))
    assert victim.is_closed()
    assert _rejections(capped_broker, "kafka_request_bytes") == before + 1
    at_limit = client()
    at_limit.send_raw(struct.pack(">ihhih", MAX_REQUEST, API_VERSIONS, 0, 1, -1))
    assert not at_limit.is_closed(timeout=0.5)  # waits for the rest of the request
    assert _served(bystander)
    assert any("exceeds the limit of 262144" in line for line in capped_broker.output)


def _produce(broker: BrokerProcess, topic: str, value: bytes, **conf) -> KafkaError | None:
    """Produce one record with librdkafka (no retries, no batching); its delivery error."""
    conf = {"linger_ms": 0, "retries": 0, "message_max_bytes": 1 << 20, **conf}
    producer = Producer(confluent_conf(broker, **conf))
    errors: list[KafkaError | None] = []
    producer.produce(topic, value, on_delivery=lambda err, _msg: errors.append(err))
    assert producer.flush(10) == 0
    return errors[0]


def test_a_batch_past_message_max_bytes_is_message_too_large(capped_broker, client, uid):
    bystander = client()
    before = _rejections(capped_broker, "kafka_message_bytes")
    assert _produce(capped_broker, f"big-{uid}", b"x" * 1000) is None  # creates the topic
    error = _produce(capped_broker, f"big-{uid}", b"x" * (MAX_MESSAGE + 1))
    assert error is not None and error.code() == KafkaError.MSG_SIZE_TOO_LARGE, error
    assert _rejections(capped_broker, "kafka_message_bytes") == before + 1
    assert _produce(capped_broker, f"big-{uid}", b"x" * (MAX_MESSAGE - 200)) is None
    assert _served(bystander)


def _fetch(c: RawKafka, topic: str, offsets: list[int], max_bytes: int) -> list[bytes]:
    """The records of each partition, from a Fetch v12 of all of them at ``offsets``."""
    cls = REQUEST_CLASSES[FETCH][12].FetchTopic
    response = c.request(
        FETCH, 12, replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=max_bytes,
        isolation_level=0, session_id=0, session_epoch=-1, forgotten_topics_data=[], rack_id="",
        topics=[cls(topic=topic, partitions=[
            cls.FetchPartition(partition=i, current_leader_epoch=-1, fetch_offset=offset,
                               last_fetched_epoch=-1, log_start_offset=-1,
                               partition_max_bytes=1 << 20)
            for i, offset in enumerate(offsets)
        ])],
    )  # fmt: skip
    parts = sorted(response.responses[0].partitions, key=lambda p: p.partition_index)
    assert all(p.error_code == 0 and p.high_watermark == 1 for p in parts)
    return [bytes(p.records or b"") for p in parts]


def test_a_fetch_answers_at_most_fetch_max_bytes_and_always_one_batch(capped_broker, client, uid):
    c, bystander = client(), client()
    topic = f"wide-{uid}"
    create_topic(c, topic, partitions=4)
    batch = build_batch([(None, b"v" * 40_000, [], 0)])  # 4 x 40 KB: past the 100 KiB cap
    for partition in range(4):
        assert (
            produce(c, topic, partition, batch).responses[0].partition_responses[0].error_code == 0
        )
    before = _rejections(capped_broker, "kafka_fetch_bytes")
    got = _fetch(c, topic, [0, 0, 0, 0], max_bytes=50 << 20)  # asks for more than the cap
    assert [len(r) for r in got] == [len(batch), len(batch), 0, 0]
    assert _rejections(capped_broker, "kafka_fetch_bytes") == before + 1
    # The consumer moves on: the partitions left out come next.
    assert [len(r) for r in _fetch(c, topic, [1, 1, 0, 0], max_bytes=50 << 20)] == [
        0,
        0,
        len(batch),
        len(batch),
    ]
    # Its own max_bytes smaller than one batch: still that whole batch (KIP-74), not counted.
    assert [len(r) for r in _fetch(c, topic, [0, 0, 0, 0], max_bytes=1)] == [len(batch), 0, 0, 0]
    assert _rejections(capped_broker, "kafka_fetch_bytes") == before + 1
    assert _served(bystander)


def test_an_idle_connection_is_closed_while_a_busy_one_stays(idle_broker):
    port = idle_broker.ports["kafka"]
    idle, busy = RawKafka(port), RawKafka(port)
    try:
        assert _served(idle) and _served(busy)
        started = time.monotonic()
        while time.monotonic() - started < 2.5:  # requests every 0.2 s: never idle for 1 s
            assert _served(busy)
            time.sleep(0.2)
        assert idle.is_closed(timeout=5)
        assert _served(busy)
        assert _rejections(idle_broker, "kafka_idle_timeout") == 1
    finally:
        idle.close()
        busy.close()


def test_a_compressed_batch_routed_elsewhere_may_not_inflate_past_message_max_bytes(
    capped_broker, client, uid
):
    """Kafka records are decompressed only to route them to other destinations (here an
    MQTT subscriber): 20 MiB of zeros gzip to ~20 KB, under the 64 KiB message.max.bytes,
    and are refused without being inflated."""
    bystander = client()
    topic = f"zip-{uid}"
    inbox: queue.Queue = queue.Queue()
    subscriber = mqtt_client(capped_broker, f"sub-{uid}", inbox)
    try:
        subscriber.subscribe(topic, qos=0)
        subscriber._test_subscribed.get(timeout=10)
        before = _rejections(capped_broker, "kafka_decompressed_bytes")
        gzip = {"compression_type": "gzip", "message_max_bytes": 64 << 20}
        assert _produce(capped_broker, topic, b"small", **gzip) is None
        assert inbox.get(timeout=10).payload == b"small"
        error = _produce(capped_broker, topic, bytes(20 << 20), **gzip)
        assert error is not None and error.code() == KafkaError.MSG_SIZE_TOO_LARGE, error
        assert _rejections(capped_broker, "kafka_decompressed_bytes") == before + 1
        assert _produce(capped_broker, topic, b"after", **gzip) is None
        assert inbox.get(timeout=10).payload == b"after"
        assert _served(bystander)
    finally:
        subscriber.loop_stop()
        subscriber.disconnect()
