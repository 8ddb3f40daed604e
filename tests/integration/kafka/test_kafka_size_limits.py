"""Size limits on the Kafka listener (docs/operations.md#limits), each exceeded by one client
while another keeps being served, on a broker started with small limits."""

from __future__ import annotations

import struct
from collections.abc import Iterator

import pytest
from confluent_kafka import KafkaError, Producer

from tests.fixtures.broker_process import BrokerProcess, start_broker
from tests.integration.kafka.conftest import RawKafka, confluent_conf, metric

API_VERSIONS = 18
MAX_REQUEST = 256 * 1024
MAX_MESSAGE = 64 * 1024


@pytest.fixture(scope="module")
def capped_broker(tmp_path_factory) -> Iterator[BrokerProcess]:
    proc = start_broker(
        tmp_path_factory.mktemp("capped") / "data",
        "--kafka-max-request-bytes", str(MAX_REQUEST),
        "--kafka-message-max-bytes", str(MAX_MESSAGE),
    )  # fmt: skip
    yield proc
    proc.stop()


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


def _produce(broker: BrokerProcess, topic: str, value: bytes) -> KafkaError | None:
    """Produce one record with librdkafka (no retries, no batching); its delivery error."""
    producer = Producer(confluent_conf(broker, linger_ms=0, retries=0, message_max_bytes=1 << 20))
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
