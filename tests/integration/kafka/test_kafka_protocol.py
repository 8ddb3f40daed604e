"""The Kafka protocol at the byte level: every advertised API and version answers, what is
not implemented gets UNSUPPORTED_VERSION, bad bytes close only their own connection, and
the error codes the protocol defines come back for bad requests."""

from __future__ import annotations

import socket
import struct
import time
from typing import Any

import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder

from flowmq_kas3.records import build_batch
from flowmq_wire.kafka import REQUEST_CLASSES, ErrorCode
from tests.integration.kafka.conftest import RawKafka, metric, wait_until

API_VERSIONS, PRODUCE, FETCH, LIST_OFFSETS, METADATA = 18, 0, 1, 2, 3
INIT_PRODUCER_ID, CREATE_TOPICS = 22, 19

# Fields a request needs so the default-valued body is answered (not, e.g., acks=0).
_OVERRIDES = {PRODUCE: {"acks": 1}, INIT_PRODUCER_ID: {"transactional_id": None}}


def advertised(raw_client: RawKafka) -> dict[int, tuple[int, int]]:
    response = raw_client.request(API_VERSIONS, 3)
    assert response.error_code == 0
    return {a.api_key: (a.min_version, a.max_version) for a in response.api_keys}


def create_topic(client: RawKafka, name: str, partitions: int = 1) -> None:
    cls = REQUEST_CLASSES[CREATE_TOPICS][7]
    response = client.request(
        CREATE_TOPICS,
        7,
        topics=[
            cls.CreatableTopic(
                name=name,
                num_partitions=partitions,
                replication_factor=1,
                assignments=[],
                configs=[],
            )
        ],
        timeout_ms=5000,
        validate_only=False,
    )
    assert response.topics[0].error_code == 0, response


def produce(
    client: RawKafka, topic: str, partition: int, records: bytes, version: int = 9, acks: int = -1
):
    cls = REQUEST_CLASSES[PRODUCE][version]
    data = cls.TopicProduceData
    return client.request(
        PRODUCE,
        version,
        transactional_id=None,
        acks=acks,
        timeout_ms=5000,
        topic_data=[
            data(
                name=topic,
                partition_data=[data.PartitionProduceData(index=partition, records=records)],
            )
        ],
    )


def fetch_args(
    topic: str, partition: int, offset: int, *, max_wait_ms: int = 0, version: int = 12
) -> dict[str, Any]:
    """The fields of a one-partition Fetch request."""
    topic_cls = REQUEST_CLASSES[FETCH][version].FetchTopic
    return dict(
        replica_id=-1,
        max_wait_ms=max_wait_ms,
        min_bytes=1,
        max_bytes=1 << 20,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=[
            topic_cls(
                topic=topic,
                partitions=[
                    topic_cls.FetchPartition(
                        partition=partition,
                        current_leader_epoch=-1,
                        fetch_offset=offset,
                        last_fetched_epoch=-1,
                        log_start_offset=-1,
                        partition_max_bytes=1 << 20,
                    )
                ],
            )
        ],
        forgotten_topics_data=[],
        rack_id="",
    )


def fetch(
    client: RawKafka,
    topic: str,
    partition: int,
    offset: int,
    *,
    max_wait_ms: int = 0,
    version: int = 12,
):
    args = fetch_args(topic, partition, offset, max_wait_ms=max_wait_ms, version=version)
    response = client.request(FETCH, version, **args)
    return response.responses[0].partitions[0]


def test_api_versions_lists_what_is_implemented_at_every_version(raw) -> None:
    client = raw()
    for version in range(5):
        response = client.request(API_VERSIONS, version)
        assert response.error_code == 0
        keys = {a.api_key for a in response.api_keys}
        assert {
            0,
            1,
            2,
            3,
            8,
            9,
            10,
            11,
            12,
            13,
            14,
            15,
            16,
            17,
            18,
            19,
            20,
            22,
            32,
            36,
            37,
            42,
            60,
        } == keys


def test_every_advertised_api_and_version_answers(broker, raw) -> None:
    versions = advertised(raw())
    for key, (low, high) in sorted(versions.items()):
        if key == 36:  # SaslAuthenticate without a handshake closes the connection (tested below)
            continue
        for version in sorted({low, (low + high) // 2, high}):
            client = raw()
            cls = REQUEST_CLASSES[key][version]
            response = client.request(key, version, **_OVERRIDES.get(key, {}))
            assert response is not None, (cls.__name__, version)
            client.close()


def test_unknown_api_and_version_get_unsupported_version_and_the_connection_stays(raw) -> None:
    client = raw()
    versions = advertised(client)
    # DeleteRecords is a real API this broker does not implement; 999 is no API at all;
    # Metadata 13 is past what is advertised.
    for key, version in ((21, 0), (999, 0), (METADATA, versions[METADATA][1] + 1)):
        header = struct.pack(">hhih", key, version, 77, 4) + b"test"
        client.send_raw(struct.pack(">i", len(header) + 8) + header + b"\0" * 8)
        frame = client.recv_frame()
        correlation_id, error = struct.unpack_from(">ih", frame)
        assert (correlation_id, error) == (77, ErrorCode.UNSUPPORTED_VERSION)
    # ApiVersions of an unknown version: v0 with error 35 and the supported list.
    header = struct.pack(">hhih", API_VERSIONS, 127, 78, -1)
    client.send_raw(struct.pack(">i", len(header)) + header)
    response = REQUEST_CLASSES[API_VERSIONS]  # noqa: F841 - the v0 response decodes below
    from kafka.protocol.metadata import ApiVersionsResponse

    decoded = ApiVersionsResponse[0].decode(client.recv_frame(), header=True)
    assert decoded.error_code == ErrorCode.UNSUPPORTED_VERSION
    assert {a.api_key for a in decoded.api_keys} >= {0, 1, 3, 18}
    assert advertised(client)  # still usable


@pytest.mark.parametrize(
    "payload",
    [
        struct.pack(">i", -5),  # negative size
        struct.pack(">i", 3) + b"abc",  # shorter than any header
        struct.pack(">i", 200 * 1024 * 1024) + b"x" * 100,  # declares > 100 MiB
        # Metadata v12 whose body stops in the middle of the topics array.
        struct.pack(">i", 20)
        + struct.pack(">hhih", METADATA, 12, 5, 0)
        + b"\x00\x05\x01\x02"
        + b"\x00" * 6,
    ],
    ids=["negative-size", "too-short", "oversize", "truncated-body"],
)
def test_malformed_frames_close_only_that_connection(raw, payload) -> None:
    bystander = raw()
    assert advertised(bystander)
    victim = raw()
    victim.send_raw(payload)
    assert victim.is_closed()
    assert advertised(bystander)
    assert advertised(raw())


def test_produce_errors_per_partition(raw, uid) -> None:
    client = raw()
    topic = f"errors-{uid}"
    create_topic(client, topic, 2)
    good = build_batch([(None, b"v", [], int(time.time() * 1000))])
    response = produce(client, topic, 7, good)
    assert (
        response.responses[0].partition_responses[0].error_code
        == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    )
    bad_crc = bytearray(good)
    bad_crc[-1] ^= 0xFF
    response = produce(client, topic, 0, bytes(bad_crc))
    assert response.responses[0].partition_responses[0].error_code == ErrorCode.CORRUPT_MESSAGE
    response = produce(client, "bad name!", 0, good)
    assert (
        response.responses[0].partition_responses[0].error_code == ErrorCode.INVALID_TOPIC_EXCEPTION
    )
    response = produce(client, topic, 0, good, acks=2)
    assert (
        response.responses[0].partition_responses[0].error_code == ErrorCode.INVALID_REQUIRED_ACKS
    )
    response = produce(client, topic, 1, good)
    part = response.responses[0].partition_responses[0]
    assert (part.error_code, part.base_offset) == (0, 0)


def test_acks_zero_gets_no_answer_and_later_answers_keep_their_order(raw, uid) -> None:
    client = raw()
    topic = f"acks0-{uid}"
    create_topic(client, topic)
    batch = build_batch([(None, b"fire-and-forget", [], int(time.time() * 1000))])
    cls = REQUEST_CLASSES[PRODUCE][9]
    data = cls.TopicProduceData
    fields = {
        "transactional_id": None,
        "timeout_ms": 5000,
        "topic_data": [
            data(name=topic, partition_data=[data.PartitionProduceData(index=0, records=batch)])
        ],
    }
    client.send(PRODUCE, 9, acks=0, **fields)
    first = client.send(PRODUCE, 9, acks=-1, **fields)
    second = client.send(API_VERSIONS, 0)
    r1 = client.recv(PRODUCE, 9)
    r2 = client.recv(API_VERSIONS, 0)
    assert (r1.header.correlation_id, r2.header.correlation_id) == (first, second)
    assert r1.responses[0].partition_responses[0].base_offset == 1


def test_fetch_out_of_range_unknown_and_long_poll(broker, raw, uid) -> None:
    client = raw()
    topic = f"fetch-{uid}"
    create_topic(client, topic)
    batch = build_batch([(b"k", b"v1", [("h", b"1")], int(time.time() * 1000))])
    produce(client, topic, 0, batch)
    part = fetch(client, topic, 0, 5)
    assert (part.error_code, part.high_watermark, part.log_start_offset) == (
        ErrorCode.OFFSET_OUT_OF_RANGE,
        1,
        0,
    )
    assert fetch(client, f"nope-{uid}", 0, 0).error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert fetch(client, topic, 3, 0).error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    # At the high watermark a fetch waits up to max_wait_ms ...
    started = time.monotonic()
    part = fetch(client, topic, 0, 1, max_wait_ms=300)
    assert part.error_code == 0 and not part.records
    assert time.monotonic() - started >= 0.25
    # ... and returns as soon as data arrives.
    waiter = raw()
    waiter.send(FETCH, 12, **fetch_args(topic, 0, 1, max_wait_ms=10_000))
    # the waiting fetcher
    assert wait_until(lambda: metric(broker, "broker_stream_subscriptions") >= 1)
    started = time.monotonic()
    produce(client, topic, 0, build_batch([(None, b"v2", [], int(time.time() * 1000))]))
    got = waiter.recv(FETCH, 12).responses[0].partitions[0]
    assert time.monotonic() - started < 2.0
    assert got.high_watermark == 2 and got.records
    assert metric(broker, 'kafka_messages_out_count{namespace="default"}') >= 1
    assert metric(broker, 'kafka_requests_count{api="Fetch"}') >= 5


def init_producer_id(
    client: RawKafka, pid: int = -1, epoch: int = -1, *, timeout_ms: int = 60000
) -> Any:
    """InitProducerId v4: a new producer id, or with ``pid``/``epoch`` a bumped epoch."""
    return client.request(
        INIT_PRODUCER_ID,
        4,
        transactional_id=None,
        transaction_timeout_ms=timeout_ms,
        producer_id=pid,
        producer_epoch=epoch,
    )


def _idempotent_batch(pid: int, epoch: int, seq: int, values: list[bytes]) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=False,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        batch_size=1 << 20,
    )
    now = int(time.time() * 1000)
    for i, value in enumerate(values):
        builder.append(i, now, None, value, [])
    return bytes(builder.build())


def test_idempotent_producer_duplicates_and_gaps(raw, uid) -> None:
    client = raw()
    topic = f"idem-{uid}"
    create_topic(client, topic)
    pid_response = init_producer_id(client)
    assert pid_response.error_code == 0
    pid = pid_response.producer_id

    def send(seq: int, values: list[bytes], epoch: int = 0):
        part = (
            produce(client, topic, 0, _idempotent_batch(pid, epoch, seq, values))
            .responses[0]
            .partition_responses[0]
        )
        return part.error_code, part.base_offset

    assert send(0, [b"a", b"b"]) == (0, 0)
    assert send(2, [b"c"]) == (0, 2)
    assert send(0, [b"a", b"b"]) == (0, 0)  # a retry: its original offset, not appended again
    assert send(2, [b"c"]) == (0, 2)
    assert send(5, [b"x"])[0] == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER  # a gap
    assert send(3, [b"d"]) == (0, 3)
    # A bumped epoch restarts the sequence; the old epoch is fenced.
    bumped = init_producer_id(client, pid, 0)
    assert (bumped.producer_id, bumped.producer_epoch) == (pid, 1)
    assert send(0, [b"e"], epoch=1) == (0, 4)
    assert send(4, [b"f"], epoch=0)[0] == ErrorCode.INVALID_PRODUCER_EPOCH
    part = fetch(client, topic, 0, 0)
    assert part.high_watermark == 5


def test_sasl_authenticate_without_handshake_closes(raw) -> None:
    client = raw()
    response = client.request(36, 2, auth_bytes=b"\0u\0p")
    assert response.error_code == ErrorCode.ILLEGAL_SASL_STATE
    assert client.is_closed()


def test_a_client_that_vanishes_mid_request_harms_no_one(broker, raw) -> None:
    sock = socket.create_connection(("127.0.0.1", broker.ports["kafka"]))
    sock.sendall(struct.pack(">i", 1000) + b"\x00\x03\x00\x0c")  # half a Metadata request
    sock.close()
    assert advertised(raw())


def test_pipelined_batches_of_a_new_producer_keep_their_order(raw, uid) -> None:
    client = raw()
    topic = f"pipeline-{uid}"
    create_topic(client, topic, 2)
    pid = init_producer_id(client).producer_id
    cls = REQUEST_CLASSES[PRODUCE][9]
    data = cls.TopicProduceData
    sent = []
    for seq in range(8):  # the first ones wait for the producer's state; the rest queue up
        batches = [
            data.PartitionProduceData(
                index=p, records=_idempotent_batch(pid, 0, seq * 2, [b"a", b"b"])
            )
            for p in (0, 1)
        ]
        sent.append(
            client.send(
                PRODUCE,
                9,
                transactional_id=None,
                acks=-1,
                timeout_ms=5000,
                topic_data=[data(name=topic, partition_data=batches)],
            )
        )
    for n, cid in enumerate(sent):
        response = client.recv(PRODUCE, 9)
        assert response.header.correlation_id == cid
        parts = response.responses[0].partition_responses
        assert [(p.error_code, p.base_offset) for p in parts] == [(0, 2 * n), (0, 2 * n)]


def test_a_client_leaving_during_auto_create_does_not_block_others(raw, uid) -> None:
    topic_cls = REQUEST_CLASSES[METADATA][12].MetadataRequestTopic
    fields = {
        "topics": [topic_cls(topic_id=None, name=f"leaver-{uid}")],
        "allow_auto_topic_creation": True,
        "include_topic_authorized_operations": False,
    }
    for _ in range(3):
        leaver = raw()
        leaver.send(METADATA, 12, **fields)
        leaver.close()  # cancels its request while the topic is being created
    response = raw().request(METADATA, 12, **fields)
    assert [(t.name, t.error_code, len(t.partitions)) for t in response.topics] == [
        (f"leaver-{uid}", 0, 1)
    ]
