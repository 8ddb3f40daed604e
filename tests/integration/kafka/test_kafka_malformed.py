"""Malformed Kafka requests the fuzzer found: a null (length -1) array where the schema has
none is refused as a malformed request (the connection closes with one info line, as Kafka
closes on a request it cannot parse), never a traceback; other clients keep being served."""

from __future__ import annotations

import pytest

from flowmq_wire.kafka import REQUEST_CLASSES
from tests.integration.kafka.conftest import RawKafka

API_VERSIONS, PRODUCE, FETCH, OFFSET_COMMIT, JOIN_GROUP, SYNC_GROUP = 18, 0, 1, 8, 11, 14

NULL_ARRAYS = {
    "produce topics": (PRODUCE, 9, dict(transactional_id=None, acks=1, timeout_ms=1000, topic_data=None)),
    "produce partitions": (PRODUCE, 9, dict(
        transactional_id=None, acks=1, timeout_ms=1000,
        topic_data=[REQUEST_CLASSES[PRODUCE][9].TopicProduceData(name="t", partition_data=None)],
    )),
    "join group": (JOIN_GROUP, 5, dict(
        group_id="g", session_timeout_ms=10000, rebalance_timeout_ms=10000, member_id="m",
        group_instance_id=None, protocol_type="consumer", protocols=None,
    )),
    "sync group": (SYNC_GROUP, 3, dict(
        group_id="g", generation_id=1, member_id="m", group_instance_id=None, assignments=None,
    )),
    "offset commit": (OFFSET_COMMIT, 8, dict(
        group_id="g", generation_id_or_member_epoch=-1, member_id="", group_instance_id=None,
        topics=None,
    )),
    "fetch": (FETCH, 4, dict(
        replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20, isolation_level=0,
        topics=None,
    )),
}  # fmt: skip


def _frame(api_key: int, version: int, fields: dict) -> bytes:
    request = REQUEST_CLASSES[api_key][version](**fields)
    request.with_header(correlation_id=7, client_id="fuzzed")
    return bytes(request.encode(header=True, framed=True))


def _served(client: RawKafka) -> bool:
    return client.request(API_VERSIONS, 3).error_code == 0


@pytest.mark.parametrize("case", NULL_ARRAYS)
def test_a_null_array_closes_only_that_connection_without_a_traceback(broker, raw, case):
    bystander = raw()
    api_key, version, fields = NULL_ARRAYS[case]
    victim = raw()
    victim.send_raw(_frame(api_key, version, fields))
    assert victim.is_closed()
    assert _served(bystander)
    assert any("is null; closing" in line for line in broker.output)
