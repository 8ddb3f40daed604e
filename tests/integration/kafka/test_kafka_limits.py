"""Identifier limits on the Kafka listener (flowmq_core.limits, docs/operations.md#limits):
a client id past 256 bytes closes that connection (Kafka has no error code for it), a group id
past 255 bytes gets INVALID_GROUP_ID; each is counted, and another client keeps being served."""

from __future__ import annotations

from flowmq_core.limits import MAX_CLIENT_ID_BYTES, MAX_NAME_BYTES
from flowmq_wire.kafka import REQUEST_CLASSES, ErrorCode
from tests.integration.kafka.conftest import metric

API_VERSIONS, OFFSET_COMMIT, JOIN_GROUP = 18, 8, 11


def _served(client) -> bool:
    return client.request(API_VERSIONS, 3).error_code == 0


def _rejections(broker, limit: str) -> float:
    return metric(broker, f'limits_rejections_count{{limit="{limit}"}}')


def _api_versions_frame(client_id: str) -> bytes:
    request = REQUEST_CLASSES[API_VERSIONS][1]()
    request.with_header(correlation_id=1, client_id=client_id)
    return bytes(request.encode(header=True, framed=True))


def test_a_client_id_past_the_limit_closes_only_that_connection(broker, raw):
    bystander = raw()
    assert _served(bystander)
    before = _rejections(broker, "client_id_bytes")
    at_limit = raw()
    at_limit.send_raw(_api_versions_frame("c" * MAX_CLIENT_ID_BYTES))
    assert at_limit.recv_frame()  # answered
    victim = raw()
    victim.send_raw(_api_versions_frame("c" * (MAX_CLIENT_ID_BYTES + 1)))
    assert victim.is_closed()
    assert _rejections(broker, "client_id_bytes") == before + 1
    assert _served(bystander)


def test_a_group_id_past_the_limit_is_invalid(broker, raw):
    client, bystander = raw(), raw()
    before = _rejections(broker, "name_bytes")
    cls = REQUEST_CLASSES[JOIN_GROUP][5]

    def join(group: str) -> int:
        return client.request(
            JOIN_GROUP,
            5,
            group_id=group,
            session_timeout_ms=10000,
            rebalance_timeout_ms=10000,
            member_id="",
            group_instance_id=None,
            protocol_type="consumer",
            protocols=[cls.JoinGroupRequestProtocol(name="range", metadata=b"")],
        ).error_code

    assert join("g" * (MAX_NAME_BYTES + 1)) == ErrorCode.INVALID_GROUP_ID
    # At the limit the group is accepted: v5 first asks for a member id (Kafka's KIP-394).
    assert join("g" * MAX_NAME_BYTES) == ErrorCode.MEMBER_ID_REQUIRED
    commit_cls = REQUEST_CLASSES[OFFSET_COMMIT][8].OffsetCommitRequestTopic
    part = commit_cls.OffsetCommitRequestPartition
    committed = client.request(
        OFFSET_COMMIT,
        8,
        group_id="g" * (MAX_NAME_BYTES + 1),
        generation_id_or_member_epoch=-1,
        member_id="",
        group_instance_id=None,
        topics=[
            commit_cls(
                name="any",
                partitions=[part(partition_index=0, committed_offset=0,
                                 committed_leader_epoch=-1, committed_metadata=None)],
            )
        ],
    )  # fmt: skip
    assert committed.topics[0].partitions[0].error_code == ErrorCode.INVALID_GROUP_ID
    assert _rejections(broker, "name_bytes") == before + 2
    assert _served(bystander)
