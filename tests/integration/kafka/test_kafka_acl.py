"""Kafka authorization against a broker process with ``--acl-default deny``, rules made
through the admin API:

- raw requests (kafka-python's generated classes) check the exact error codes of every API
  that touches a topic, a group or the cluster: TOPIC_AUTHORIZATION_FAILED (29),
  GROUP_AUTHORIZATION_FAILED (30), CLUSTER_AUTHORIZATION_FAILED (31); anonymous clients are
  the ``*`` principal;
- Metadata hides the topics a client may not describe, and answers 29 for one it names;
- SASL users with kafka-python and librdkafka: what a rule allows works, the rest is refused
  with the client's authorization error; an explicit deny beats an allow.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import kafka
import kafka.errors
import pytest

from flowmq_kas3.records import build_batch
from flowmq_wire.kafka import REQUEST_CLASSES, ErrorCode
from tests.fixtures.acl import add_rule, deny_by_default_broker
from tests.fixtures.broker_process import BrokerProcess
from tests.fixtures.cluster import http
from tests.integration.kafka.conftest import RawKafka, bootstrap, confluent_conf
from tests.integration.kafka.test_kafka_protocol import fetch, produce

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import AdminClient  # noqa: E402

TOPIC_DENIED = ErrorCode.TOPIC_AUTHORIZATION_FAILED
GROUP_DENIED = ErrorCode.GROUP_AUTHORIZATION_FAILED
CLUSTER_DENIED = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
METADATA, CREATE_TOPICS, DELETE_TOPICS = 3, 19, 20
OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR, JOIN_GROUP = 8, 9, 10, 11
DESCRIBE_GROUPS, DELETE_GROUPS, DESCRIBE_CONFIGS, DESCRIBE_CLUSTER = 15, 42, 32, 60
LIST_OFFSETS, INIT_PRODUCER_ID = 2, 22


def create_stream(broker: BrokerProcess, name: str) -> None:
    """As the operator (admin API), whatever the ACLs say."""
    http("POST", f"{broker.http}/api/v1/streams", {"name": name}, broker.token)


@pytest.fixture(scope="module")
def broker(tmp_path_factory) -> Iterator[BrokerProcess]:
    data = tmp_path_factory.mktemp("kafka-acl") / "data"
    proc = deny_by_default_broker(data, "kafka,admin", ("alice", "bob"))
    # Anonymous (raw) clients: everything on open.* and group g-ok, nothing else.
    add_rule(proc, "*", "stream:open.*", "all")
    add_rule(proc, "*", "group:g-ok", "consume")
    # SASL users.
    add_rule(proc, "alice", "stream:orders", "produce")
    add_rule(proc, "alice", "stream:orders", "consume")
    add_rule(proc, "alice", "stream:orders", "create")
    add_rule(proc, "alice", "group:orders-g", "consume")
    add_rule(proc, "alice", "stream:*", "produce")
    add_rule(proc, "alice", "stream:secret", "produce", "deny")
    for name in ("closed.t", "orders", "secret", "billing"):
        create_stream(proc, name)
    yield proc
    proc.stop()


@pytest.fixture
def raw(broker) -> Iterator[RawKafka]:
    client = RawKafka(broker.ports["kafka"])
    yield client
    client.close()


def create_topics(client: RawKafka, *names: str) -> dict[str, int]:
    cls = REQUEST_CLASSES[CREATE_TOPICS][7]
    topic = cls.CreatableTopic
    response = client.request(
        CREATE_TOPICS,
        7,
        topics=[
            topic(name=n, num_partitions=1, replication_factor=1, assignments=[], configs=[])
            for n in names
        ],
        timeout_ms=5000,
        validate_only=False,
    )
    return {t.name: t.error_code for t in response.topics}


def metadata(client: RawKafka, names: list[str] | None, auto_create: bool = False) -> dict:
    cls = REQUEST_CLASSES[METADATA][9]
    topics = None if names is None else [cls.MetadataRequestTopic(name=n) for n in names]
    response = client.request(
        METADATA,
        9,
        topics=topics,
        allow_auto_topic_creation=auto_create,
        include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False,
    )
    return {t.name: t.error_code for t in response.topics}


# --- topics ------------------------------------------------------------------------------------
def test_create_produce_fetch_delete_topic_codes(raw):
    assert create_topics(raw, "open.a", "closed.a") == {"open.a": 0, "closed.a": TOPIC_DENIED}
    batch = build_batch([(None, b"v", [], 0)])
    assert produce(raw, "open.a", 0, batch).responses[0].partition_responses[0].error_code == 0
    denied = produce(raw, "closed.t", 0, batch).responses[0].partition_responses[0]
    assert denied.error_code == TOPIC_DENIED
    assert fetch(raw, "open.a", 0, 0).error_code == 0
    assert fetch(raw, "closed.t", 0, 0).error_code == TOPIC_DENIED
    cls = REQUEST_CLASSES[LIST_OFFSETS][6]
    listed = raw.request(
        LIST_OFFSETS,
        6,
        replica_id=-1,
        isolation_level=0,
        topics=[
            cls.ListOffsetsTopic(
                name="closed.t",
                partitions=[cls.ListOffsetsTopic.ListOffsetsPartition(partition_index=0,
                                                                      timestamp=-1)],
            )
        ],
    )  # fmt: skip
    assert listed.topics[0].partitions[0].error_code == TOPIC_DENIED
    deleted = raw.request(DELETE_TOPICS, 4, topic_names=["closed.t", "open.a"], timeout_ms=5000)
    assert {r.name: r.error_code for r in deleted.responses} == {"closed.t": TOPIC_DENIED,
                                                                 "open.a": 0}  # fmt: skip


def test_metadata_hides_what_the_client_may_not_describe(raw):
    assert create_topics(raw, "open.m") == {"open.m": 0}
    listed = metadata(raw, None)
    assert "open.m" in listed and not {"closed.t", "orders", "secret"} & set(listed)
    assert metadata(raw, ["closed.t", "open.m"]) == {"closed.t": TOPIC_DENIED, "open.m": 0}
    # Auto-creation needs ``create``: refused with 29 as Kafka does, allowed on open.*.
    assert metadata(raw, ["closed.new"], auto_create=True) == {"closed.new": TOPIC_DENIED}
    assert metadata(raw, ["open.new"], auto_create=True) == {"open.new": 0}


# --- groups and the cluster -------------------------------------------------------------------------
def test_group_apis_need_the_group(raw):
    found = raw.request(FIND_COORDINATOR, 4, key_type=0, coordinator_keys=["g-bad", "g-ok"])
    assert [c.error_code for c in found.coordinators] == [GROUP_DENIED, 0]
    cls = REQUEST_CLASSES[JOIN_GROUP][5]
    joined = raw.request(
        JOIN_GROUP,
        5,
        group_id="g-bad",
        session_timeout_ms=10000,
        rebalance_timeout_ms=10000,
        member_id="",
        group_instance_id=None,
        protocol_type="consumer",
        protocols=[cls.JoinGroupRequestProtocol(name="range", metadata=b"")],
    )
    assert joined.error_code == GROUP_DENIED
    commit_cls = REQUEST_CLASSES[OFFSET_COMMIT][8].OffsetCommitRequestTopic
    part = commit_cls.OffsetCommitRequestPartition

    def commit(group: str, topic: str) -> int:
        response = raw.request(
            OFFSET_COMMIT,
            8,
            group_id=group,
            generation_id_or_member_epoch=-1,
            member_id="",
            group_instance_id=None,
            topics=[
                commit_cls(
                    name=topic,
                    partitions=[part(partition_index=0, committed_offset=0,
                                     committed_leader_epoch=-1, committed_metadata=None)],
                )
            ],
        )  # fmt: skip
        return response.topics[0].partitions[0].error_code

    assert commit("g-bad", "open.g") == GROUP_DENIED
    assert commit("g-ok", "closed.t") == TOPIC_DENIED
    described = raw.request(
        DESCRIBE_GROUPS, 5, groups=["g-bad"], include_authorized_operations=False
    )
    assert described.groups[0].error_code == GROUP_DENIED
    dropped = raw.request(DELETE_GROUPS, 2, groups_names=["g-ok", "g-bad"])
    assert [r.error_code for r in dropped.results] == [GROUP_DENIED, GROUP_DENIED]  # consume only


def test_cluster_apis_need_the_namespace(raw):
    described = raw.request(DESCRIBE_CLUSTER, 0, include_cluster_authorized_operations=False)
    assert described.error_code == CLUSTER_DENIED
    cls = REQUEST_CLASSES[DESCRIBE_CONFIGS][4]
    configs = raw.request(
        DESCRIBE_CONFIGS,
        4,
        resources=[
            cls.DescribeConfigsResource(resource_type=4, resource_name="0", configuration_keys=None),
            cls.DescribeConfigsResource(resource_type=2, resource_name="closed.t",
                                        configuration_keys=None),
        ],
        include_synonyms=False,
        include_documentation=False,
    )  # fmt: skip
    assert [r.error_code for r in configs.results] == [CLUSTER_DENIED, TOPIC_DENIED]
    # Idempotent producers need produce on some stream (KIP-679): anonymous has open.*.
    pid = raw.request(INIT_PRODUCER_ID, 4, transactional_id=None, transaction_timeout_ms=60000,
                      producer_id=-1, producer_epoch=-1)  # fmt: skip
    assert pid.error_code == 0


# --- SASL users with real clients ------------------------------------------------------------------
def _kafka_python(broker: BrokerProcess, user: str, cls=kafka.KafkaProducer, **extra):
    return cls(
        bootstrap_servers=bootstrap(broker),
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_plain_username=user,
        sasl_plain_password="pw",
        **extra,
    )


def test_kafka_python_produce_consume_and_denials(broker):
    producer = _kafka_python(broker, "alice", max_block_ms=10000, retries=0)
    try:
        assert producer.send("orders", b"o-1").get(timeout=15).offset == 0
        assert producer.send("billing", b"b-1").get(timeout=15).offset == 0  # stream:* produce
        with pytest.raises(kafka.errors.TopicAuthorizationFailedError):
            producer.send("secret", b"no").get(timeout=15)  # the explicit deny wins
    finally:
        producer.close()
    consumer = _kafka_python(
        broker,
        "alice",
        kafka.KafkaConsumer,
        group_id="orders-g",
        auto_offset_reset="earliest",
        consumer_timeout_ms=15000,
    )
    try:
        consumer.subscribe(["orders"])
        assert next(iter(consumer)).value == b"o-1"
    finally:
        consumer.close()
    bob = _kafka_python(broker, "bob", max_block_ms=5000, retries=0)
    try:
        with pytest.raises(
            (kafka.errors.TopicAuthorizationFailedError, kafka.errors.KafkaTimeoutError)
        ):
            bob.send("orders", b"no").get(timeout=15)
    finally:
        bob.close()


def _librdkafka_conf(broker: BrokerProcess, user: str) -> dict:
    return confluent_conf(
        broker,
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_username=user,
        sasl_password="pw",
    )


def test_librdkafka_lists_only_the_topics_it_may_describe(broker):
    alice = set(AdminClient(_librdkafka_conf(broker, "alice")).list_topics(timeout=10).topics)
    assert {"orders", "billing", "secret", "closed.t"} <= alice  # produce on stream:*
    create_stream(broker, "open.listed")
    # bob has no rule of his own: he gets what ``*`` may (open.*), nothing else.
    bob = set(AdminClient(_librdkafka_conf(broker, "bob")).list_topics(timeout=10).topics)
    assert bob and all(t.startswith("open.") for t in bob), bob


def test_librdkafka_consumer_gets_the_group_error(broker):
    conf = _librdkafka_conf(broker, "alice")
    consumer = ck.Consumer({**conf, "group.id": "not-hers", "auto.offset.reset": "earliest"})
    try:
        consumer.subscribe(["orders"])
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is not None:
                assert message.error().code() == ck.KafkaError.GROUP_AUTHORIZATION_FAILED
                return
        raise AssertionError("no GROUP_AUTHORIZATION_FAILED")
    finally:
        consumer.close()
