"""Kafka SASL: PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512 with three client libraries
(librdkafka through confluent-kafka, kafka-python, aiokafka) against the users of the meta
store, and what an unauthenticated connection may do while anonymous clients are refused:
ApiVersions and SASL only, frames up to 512 KiB, and not for long.

Clients retry a refused login at once, and five failures from one address block it for a
minute (docs/security.md), so every wrong-password case runs against a broker of its own;
raw-socket cases connect from an address of their own."""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Iterator

import aiokafka
import kafka
import pytest
from kafka.net.sasl.scram import ScramClient

from flowmq_kas3.records import build_batch
from flowmq_wire.kafka import ErrorCode
from tests.fixtures.addresses import loopback_address
from tests.fixtures.broker_process import BrokerProcess, start_broker
from tests.fixtures.cli import flowmq_user
from tests.fixtures.waiting import wait_until
from tests.integration.kafka.conftest import RawKafka, bootstrap, confluent_conf, metric
from tests.integration.kafka.test_kafka_protocol import API_VERSIONS, METADATA, produce

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import AdminClient  # noqa: E402

SASL_HANDSHAKE, SASL_AUTHENTICATE = 17, 36
SCRAM = ["SCRAM-SHA-256", "SCRAM-SHA-512"]
SASL_TIMEOUT_S = 2.0  # the broker's, shortened for these tests (FLOWMQ_TEST_…)
ROLES = ("--roles", "kafka,admin")


def _secured(data_dir, *args: str) -> BrokerProcess:
    """A broker that refuses anonymous clients and knows alice (password s3cret)."""
    added = flowmq_user(data_dir, "add", "alice", "--password", "s3cret")
    assert added.returncode == 0, added.stderr
    return start_broker(
        data_dir,
        *ROLES,
        "--allow-anonymous",
        "false",
        "--acl-default",  # authentication is under test: authorization left open
        "allow",
        *args,
        env={"FLOWMQ_TEST_KAFKA_SASL_TIMEOUT_S": str(SASL_TIMEOUT_S)},
    )


@pytest.fixture(scope="module")
def secured(tmp_path_factory) -> Iterator[BrokerProcess]:
    """Shared by the cases that log in from 127.0.0.1 with the right password only."""
    broker = _secured(tmp_path_factory.mktemp("sasl") / "data")
    yield broker
    broker.stop()


@pytest.fixture
def own_secured(tmp_path) -> Iterator[BrokerProcess]:
    """A secured broker for one test (refused logins block 127.0.0.1 there)."""
    broker = _secured(tmp_path / "data")
    yield broker
    broker.stop()


def refusals(broker: BrokerProcess, mechanism: str) -> list[str]:
    return [x for x in broker.output if f"SASL {mechanism} authentication refused" in x]


def wait_for_refusal(broker: BrokerProcess, mechanism: str, reason: str) -> None:
    """The broker logged refusing ``mechanism`` for ``reason`` (its log is read by a thread:
    polled, bounded)."""
    wait_until(
        lambda: any(f"({reason})" in x for x in refusals(broker, mechanism)),
        10,
        what=f"a {mechanism} refusal for {reason} in the log",
    )


# --- the three libraries ------------------------------------------------------------------
def confluent_round_trip(broker: BrokerProcess, mechanism: str, password: str, topic: str):
    conf = confluent_conf(
        broker,
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism=mechanism,
        sasl_username="alice",
        sasl_password=password,
    )
    producer = ck.Producer({**conf, "acks": "all"})
    producer.produce(topic, b"via librdkafka")
    assert producer.flush(15) == 0
    consumer = ck.Consumer({**conf, "group.id": f"g-{topic}", "auto.offset.reset": "earliest"})
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                assert message.value() == b"via librdkafka"
                return
        raise AssertionError("nothing consumed")
    finally:
        consumer.close()


def confluent_refused(broker: BrokerProcess, mechanism: str, password: str) -> None:
    admin = AdminClient(
        confluent_conf(
            broker,
            security_protocol="SASL_PLAINTEXT",
            sasl_mechanism=mechanism,
            sasl_username="alice",
            sasl_password=password,
            socket_timeout_ms=3000,
        )
    )
    with pytest.raises(ck.KafkaException) as refused:
        admin.list_topics(timeout=5)
    assert refused.value.args[0].code() in (ck.KafkaError._AUTHENTICATION, ck.KafkaError._TRANSPORT)


def kafka_python_producer(broker: BrokerProcess, mechanism: str, password: str):
    return kafka.KafkaProducer(
        bootstrap_servers=bootstrap(broker),
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism=mechanism,
        sasl_plain_username="alice",
        sasl_plain_password=password,
        bootstrap_timeout_ms=5000,
        max_block_ms=10000,
    )


def kafka_python_round_trip(broker: BrokerProcess, mechanism: str, password: str, topic: str):
    producer = kafka_python_producer(broker, mechanism, password)
    try:
        metadata = producer.send(topic, b"via kafka-python").get(timeout=15)
        assert metadata.offset == 0
    finally:
        producer.close()


async def aiokafka_round_trip(broker: BrokerProcess, mechanism: str, password: str, topic: str):
    common = {
        "bootstrap_servers": bootstrap(broker),
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": mechanism,
        "sasl_plain_username": "alice",
        "sasl_plain_password": password,
        "request_timeout_ms": 10000,
    }
    producer = aiokafka.AIOKafkaProducer(**common)
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"via aiokafka")
    finally:
        await producer.stop()
    consumer = aiokafka.AIOKafkaConsumer(topic, auto_offset_reset="earliest", **common)
    await consumer.start()
    try:
        message = await asyncio.wait_for(consumer.getone(), 15)
        assert message.value == b"via aiokafka"
    finally:
        await consumer.stop()


@pytest.mark.parametrize("mechanism", ["PLAIN", *SCRAM])
def test_librdkafka_logs_in(secured, mechanism, uid):
    confluent_round_trip(secured, mechanism, "s3cret", f"ck-{mechanism}-{uid}")


@pytest.mark.parametrize("mechanism", ["PLAIN", *SCRAM])
def test_kafka_python_logs_in(secured, mechanism, uid):
    kafka_python_round_trip(secured, mechanism, "s3cret", f"kp-{mechanism}-{uid}")


@pytest.mark.parametrize("mechanism", ["PLAIN", *SCRAM])
def test_aiokafka_logs_in(secured, mechanism, uid):
    asyncio.run(aiokafka_round_trip(secured, mechanism, "s3cret", f"ak-{mechanism}-{uid}"))


@pytest.mark.parametrize("mechanism", SCRAM)
def test_librdkafka_wrong_password_is_refused(own_secured, mechanism):
    confluent_refused(own_secured, mechanism, "wrong")
    wait_for_refusal(own_secured, mechanism, "bad_password")


@pytest.mark.parametrize("mechanism", SCRAM)
def test_kafka_python_wrong_password_is_refused(own_secured, mechanism):
    with pytest.raises(kafka.errors.KafkaError):
        kafka_python_producer(own_secured, mechanism, "wrong").close()
    wait_for_refusal(own_secured, mechanism, "bad_password")


@pytest.mark.parametrize("mechanism", SCRAM)
def test_aiokafka_wrong_password_is_refused(own_secured, mechanism, uid):
    with pytest.raises(aiokafka.errors.KafkaError):
        asyncio.run(aiokafka_round_trip(own_secured, mechanism, "wrong", f"ak-{uid}"))
    wait_for_refusal(own_secured, mechanism, "bad_password")


# --- the exchange on a raw socket ------------------------------------------------------------
def handshake(raw: RawKafka, mechanism: str, version: int = 1):
    return raw.request(SASL_HANDSHAKE, version, mechanism=mechanism)


def scram_login(raw: RawKafka, mechanism: str, user: str, password: str):
    """SaslHandshake v1 + two SaslAuthenticate v2 (kafka-python's SCRAM client); returns
    the last response."""
    assert handshake(raw, mechanism).error_code == 0
    client = ScramClient(user, password, mechanism)
    first = raw.request(SASL_AUTHENTICATE, 2, auth_bytes=client.first_message())
    if first.error_code:
        return first
    client.process_server_first_message(first.auth_bytes)
    final = raw.request(SASL_AUTHENTICATE, 2, auth_bytes=client.final_message())
    if final.error_code == 0:
        client.process_server_final_message(final.auth_bytes)  # the server proved itself
    return final


def test_handshake_lists_the_mechanisms(secured):
    raw = RawKafka(secured.ports["kafka"])
    response = handshake(raw, "GSSAPI")
    assert response.error_code == ErrorCode.UNSUPPORTED_SASL_MECHANISM
    assert response.mechanisms == ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
    raw.close()


@pytest.mark.parametrize("mechanism", SCRAM)
def test_scram_wrong_password_and_unknown_user_get_error_58(secured, mechanism):
    for user, password in (("alice", "wrong"), ("mallory", "s3cret")):
        raw = RawKafka(secured.ports["kafka"], loopback_address())
        response = scram_login(raw, mechanism, user, password)
        assert response.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED == 58
        assert "invalid credentials" in response.error_message
        assert raw.is_closed()


@pytest.mark.parametrize("mechanism", SCRAM)
def test_scram_over_bare_tokens_after_a_v0_handshake(secured, mechanism):
    """SaslHandshake v0: the tokens travel as bare size-prefixed frames."""
    raw = RawKafka(secured.ports["kafka"], loopback_address())
    assert handshake(raw, mechanism, version=0).error_code == 0
    client = ScramClient("alice", "s3cret", mechanism)
    first = client.first_message()
    raw.send_raw(struct.pack(">i", len(first)) + first)
    client.process_server_first_message(raw.recv_frame())
    final = client.final_message()
    raw.send_raw(struct.pack(">i", len(final)) + final)
    client.process_server_final_message(raw.recv_frame())
    assert raw.request(METADATA, 12, topics=None, allow_auto_topic_creation=False,
                       include_topic_authorized_operations=False).brokers  # fmt: skip
    raw.close()


def test_failed_logins_from_one_address_are_rate_limited(secured):
    source = loopback_address()
    for _ in range(5):
        raw = RawKafka(secured.ports["kafka"], source)
        assert scram_login(raw, "SCRAM-SHA-256", "alice", "guess").error_code == 58
        raw.close()
    raw = RawKafka(secured.ports["kafka"], source)
    refused = scram_login(raw, "SCRAM-SHA-256", "alice", "s3cret")
    assert refused.error_code == 58 and "too many failed logins" in refused.error_message
    raw.close()
    other = RawKafka(secured.ports["kafka"], loopback_address())
    assert scram_login(other, "SCRAM-SHA-512", "alice", "s3cret").error_code == 0
    other.close()


def test_unknown_user_is_refused_even_when_anonymous_allowed(broker):
    """The module's broker allows anonymous clients (loopback); a SASL login as a user that
    does not exist is still refused, with every mechanism."""
    for mechanism in ("PLAIN", *SCRAM):
        raw = RawKafka(broker.ports["kafka"], loopback_address())
        if mechanism == "PLAIN":
            assert handshake(raw, mechanism).error_code == 0
            response = raw.request(SASL_AUTHENTICATE, 2, auth_bytes=b"\0nobody\0pw")
        else:
            response = scram_login(raw, mechanism, "nobody", "pw")
        assert response.error_code == 58, mechanism
        assert raw.is_closed()
    anonymous = RawKafka(broker.ports["kafka"])
    assert anonymous.request(API_VERSIONS, 3).error_code == 0
    assert anonymous.request(METADATA, 12, topics=None, allow_auto_topic_creation=False,
                             include_topic_authorized_operations=False).brokers  # fmt: skip
    anonymous.close()


# --- before authentication ------------------------------------------------------------------
def test_a_large_frame_before_authentication_closes_at_once(secured, uid):
    """A frame declaring 100 MiB (the limit once authenticated) closes the connection as
    soon as its size is read: nothing of it is buffered or awaited."""
    sample = 'limits_rejections_count{limit="kafka_pre_auth_request_bytes"}'
    before = metric(secured, sample)
    raw = RawKafka(secured.ports["kafka"], loopback_address())
    raw.send_raw(struct.pack(">i", 100 * 1024 * 1024) + b"\x00\x00\x00\x03" + b"x" * 1000)
    started = time.monotonic()
    assert raw.is_closed(timeout=5)
    assert time.monotonic() - started < SASL_TIMEOUT_S  # not the idle timeout
    raw.close()
    assert metric(secured, sample) == before + 1
    # Once authenticated, frames past 512 KiB are fine.
    client = RawKafka(secured.ports["kafka"], loopback_address())
    assert scram_login(client, "SCRAM-SHA-512", "alice", "s3cret").error_code == 0
    batch = build_batch([(None, b"v" * (600 * 1024), [], 0)])
    response = produce(client, f"big-{uid}", 0, batch)
    assert response.responses[0].partition_responses[0].error_code == 0
    client.close()


def test_an_unauthenticated_connection_times_out(secured):
    raw = RawKafka(secured.ports["kafka"], loopback_address())
    started = time.monotonic()
    assert raw.request(API_VERSIONS, 3).error_code == 0  # served before authentication
    assert raw.is_closed(timeout=SASL_TIMEOUT_S + 5)
    assert time.monotonic() - started >= SASL_TIMEOUT_S - 0.5
    raw.close()


def test_an_authenticated_connection_does_not_time_out(secured):
    raw = RawKafka(secured.ports["kafka"], loopback_address())
    assert scram_login(raw, "SCRAM-SHA-256", "alice", "s3cret").error_code == 0
    assert not raw.is_closed(timeout=SASL_TIMEOUT_S + 1)  # nothing arrives, nothing closes
    assert raw.request(API_VERSIONS, 3).error_code == 0
    raw.close()


def test_no_frame_cap_while_anonymous_clients_are_allowed(broker, uid):
    raw = RawKafka(broker.ports["kafka"])
    batch = build_batch([(None, b"v" * (600 * 1024), [], 0)])
    response = produce(raw, f"anon-big-{uid}", 0, batch)
    assert response.responses[0].partition_responses[0].error_code == 0
    raw.close()


def test_refusals_are_logged_with_address_and_reason_but_no_password(secured):
    source = loopback_address()
    raw = RawKafka(secured.ports["kafka"], source)
    assert handshake(raw, "PLAIN").error_code == 0
    assert raw.request(SASL_AUTHENTICATE, 2, auth_bytes=b"\0alice\0pw-xyzzy").error_code == 58
    raw.close()
    lines = wait_until(
        lambda: [x for x in refusals(secured, "PLAIN") if f"kafka {source}:" in x], 10
    )
    line = lines[0]
    assert "(bad_password)" in line and "'alice'" in line
    assert not [x for x in secured.output if "pw-xyzzy" in x]


def test_a_client_without_sasl_is_refused(secured):
    admin = AdminClient(confluent_conf(secured, socket_timeout_ms=3000))
    with pytest.raises(ck.KafkaException):
        admin.list_topics(timeout=5)
