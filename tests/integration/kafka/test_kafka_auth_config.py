"""SASL PLAIN with users from the meta store, and broker settings that change Kafka
behaviour (anonymous access, topic auto-creation)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from flowmq_kas3.records import build_batch
from flowmq_wire.kafka import REQUEST_CLASSES
from tests.fixtures.broker_process import start_broker
from tests.integration.kafka.conftest import RawKafka, confluent_conf
from tests.integration.kafka.test_kafka_protocol import API_VERSIONS, METADATA, produce

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import AdminClient  # noqa: E402


@pytest.fixture
def secured(tmp_path):
    data_dir = tmp_path / "data"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "flowmq_broker.cli",
            "user",
            "--data-dir",
            str(data_dir),
            "add",
            "alice",
            "--password",
            "s3cret",
        ],
        check=True,
        capture_output=True,
        timeout=30,
    )
    broker = start_broker(data_dir, "--allow-anonymous", "false", "--acl-default", "allow")
    yield broker
    broker.stop()


def sasl(broker, password: str, **extra) -> dict:
    return confluent_conf(
        broker,
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_username="alice",
        sasl_password=password,
        **extra,
    )


def test_sasl_plain_users_from_the_meta_store(secured) -> None:
    producer = ck.Producer(sasl(secured, "s3cret", acks="all"))
    producer.produce("secure.topic", b"hello")
    assert producer.flush(15) == 0
    admin = AdminClient(sasl(secured, "wrong", socket_timeout_ms=3000))
    with pytest.raises(ck.KafkaException) as refused:
        admin.list_topics(timeout=5)
    assert refused.value.args[0].code() in (ck.KafkaError._AUTHENTICATION, ck.KafkaError._TRANSPORT)
    # Without authentication only ApiVersions and the SASL requests are served.
    raw = RawKafka(secured.ports["kafka"])
    assert raw.request(API_VERSIONS, 3).error_code == 0
    raw.send(
        METADATA,
        12,
        topics=None,
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )
    assert raw.is_closed()


def test_auto_create_can_be_switched_off(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("FLOWMQ_KAFKA_AUTO_CREATE_TOPICS", "false")
    broker = start_broker(tmp_path / "data")
    try:
        raw = RawKafka(broker.ports["kafka"])
        response = produce(raw, "never.created", 0, build_batch([(None, b"x", [], 0)]))
        assert (
            response.responses[0].partition_responses[0].error_code == 3
        )  # UNKNOWN_TOPIC_OR_PARTITION
        topic = REQUEST_CLASSES[METADATA][12].MetadataRequestTopic(
            topic_id=None, name="never.created"
        )
        meta = raw.request(
            METADATA,
            12,
            topics=[topic],
            allow_auto_topic_creation=True,
            include_topic_authorized_operations=False,
        )
        assert [(t.name, t.error_code) for t in meta.topics] == [("never.created", 3)]
        raw.close()
    finally:
        broker.stop()
