"""Size limits on the Kafka listener (docs/operations.md#limits), each exceeded by one client
while another keeps being served, on a broker started with small limits."""

from __future__ import annotations

import struct
from collections.abc import Iterator

import pytest

from tests.fixtures.broker_process import BrokerProcess, start_broker
from tests.integration.kafka.conftest import RawKafka, metric

API_VERSIONS = 18
MAX_REQUEST = 256 * 1024


@pytest.fixture(scope="module")
def capped_broker(tmp_path_factory) -> Iterator[BrokerProcess]:
    proc = start_broker(
        tmp_path_factory.mktemp("capped") / "data",
        "--kafka-max-request-bytes", str(MAX_REQUEST),
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
