"""Consumer groups with real clients: a 3-member librdkafka group rebalances when a member
leaves and, per committed offsets, every record is consumed exactly once."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from flowmq_meta import open_meta_store
from flowmq_meta.keys import GROUP_GENERATIONS
from tests.fixtures.broker_process import BrokerProcess, start_broker
from tests.integration.kafka.conftest import confluent_conf
from tests.integration.kafka.test_kafka_clients import create, produce_all

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import AdminClient  # noqa: E402

PARTITIONS = 6
PER_PARTITION = 100
LEAVE_AFTER = 40


@pytest.mark.parametrize("strategy", ["range", "cooperative-sticky"])
def test_three_members_rebalance_on_leave_and_consume_each_record_once(
    broker, uid, strategy
) -> None:
    topic, group = f"grp-{uid}", f"grp-{uid}"
    create(broker, topic, PARTITIONS)
    produce_all(
        broker,
        topic,
        [(p, None, b"%d-%d" % (p, i)) for p in range(PARTITIONS) for i in range(PER_PARTITION)],
    )
    total = PARTITIONS * PER_PARTITION
    lock = threading.Lock()
    processed: list[tuple[int, int]] = []
    per_member: dict[int, int] = {0: 0, 1: 0, 2: 0}
    assignments: dict[int, set[int]] = {0: set(), 1: set(), 2: set()}
    ever_assigned: set[int] = set()
    stop = threading.Event()
    errors: list[BaseException] = []

    def member(n: int) -> None:
        def on_assign(consumer, partitions):
            assignments[n] |= {p.partition for p in partitions}
            if partitions:
                with lock:
                    ever_assigned.add(n)

        consumer = ck.Consumer(
            confluent_conf(
                broker,
                group_id=group,
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                session_timeout_ms=6000,
                heartbeat_interval_ms=300,
                partition_assignment_strategy=strategy,
            )
        )
        consumer.subscribe([topic], on_assign=on_assign)
        try:
            while not stop.is_set():
                if n == 2 and per_member[2] >= LEAVE_AFTER:
                    return  # this member leaves the group (LeaveGroup on close)
                m = consumer.poll(0.2)
                if m is None or m.error():
                    continue
                if len(ever_assigned) < 3:
                    # Nobody works until all three members had a share: put the record back.
                    try:
                        consumer.seek(ck.TopicPartition(topic, m.partition(), m.offset()))
                    except ck.KafkaException:
                        pass  # the partition moved away meanwhile; its next owner gets it
                    time.sleep(0.02)
                    continue
                time.sleep(0.002)  # "processing"
                try:
                    consumer.commit(message=m, asynchronous=False)
                except ck.KafkaException:
                    # Not committed (a rebalance under way): read it again, here if the
                    # partition stays (cooperative rebalancing keeps it) or at its next owner.
                    try:
                        consumer.seek(ck.TopicPartition(topic, m.partition(), m.offset()))
                    except ck.KafkaException:
                        pass
                    continue
                with lock:
                    processed.append((m.partition(), m.offset()))
                    per_member[n] += 1
        except BaseException as exc:  # surfaced in the test thread
            errors.append(exc)
        finally:
            consumer.close()

    threads = [threading.Thread(target=member, args=(n,), daemon=True) for n in range(3)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(processed) < total:
        time.sleep(0.1)
    stop.set()
    for t in threads:
        t.join(15)
    assert not errors, errors
    assert per_member[2] >= LEAVE_AFTER, per_member
    assert per_member[0] and per_member[1], per_member
    assert len(processed) == total, f"{len(processed)} of {total}: {per_member}"
    assert len(set(processed)) == total, "a record was processed twice"
    # The survivors took over the leaver's partitions.
    assert assignments[0] | assignments[1] == set(range(PARTITIONS))

    checker = ck.Consumer(confluent_conf(broker, group_id=group))
    try:
        committed = checker.committed(
            [ck.TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=10
        )
    finally:
        checker.close()
    assert [tp.offset for tp in committed] == [PER_PARTITION] * PARTITIONS


def test_groups_are_listed_and_described(broker, uid) -> None:
    topic, group = f"desc-{uid}", f"desc-{uid}"
    create(broker, topic, 2)
    produce_all(broker, topic, [(0, None, b"a"), (1, None, b"b")])
    consumer = ck.Consumer(confluent_conf(broker, group_id=group, auto_offset_reset="earliest"))
    consumer.subscribe([topic])
    try:
        got = 0
        deadline = time.monotonic() + 15
        while got < 2 and time.monotonic() < deadline:
            m = consumer.poll(0.2)
            if m is not None and not m.error():
                got += 1
        consumer.commit(asynchronous=False)
        admin = AdminClient(confluent_conf(broker))
        listed = admin.list_consumer_groups().result(10)
        assert group in {g.group_id for g in listed.valid}
        described = admin.describe_consumer_groups([group])[group].result(10)
        assert str(described.state).endswith("STABLE")
        assert len(described.members) == 1
        assert {tp.partition for tp in described.members[0].assignment.topic_partitions} == {0, 1}
        with pytest.raises(ck.KafkaException) as busy:
            admin.delete_consumer_groups([group])[group].result(10)
        assert busy.value.args[0].code() == ck.KafkaError.NON_EMPTY_GROUP
    finally:
        consumer.close()
    # Once empty, the group and its committed offsets can be deleted.
    admin.delete_consumer_groups([group])[group].result(10)
    assert group not in {g.group_id for g in admin.list_consumer_groups().result(10).valid}
    fresh = ck.Consumer(confluent_conf(broker, group_id=group))
    try:
        committed = fresh.committed([ck.TopicPartition(topic, 0)], timeout=10)
        assert committed[0].offset < 0
    finally:
        fresh.close()


def _stored_generation(broker: BrokerProcess, group: str) -> bytes | None:
    """The group's generation key, read from the broker's meta store (another process)."""

    async def read() -> bytes | None:
        meta = open_meta_store(f"sqlite:///{broker.data_dir / 'meta.db'}")
        try:
            key = GROUP_GENERATIONS.pack("default", group)
            return await meta.transact(lambda tr: tr.get(key))
        finally:
            await meta.close()

    return asyncio.run(read())


def _first_message(consumer: ck.Consumer) -> ck.Message | None:
    """The consumer's first message (None after 15 s): the group has formed once it came."""
    deadline = time.monotonic() + 15
    message = None
    while message is None and time.monotonic() < deadline:
        message = consumer.poll(0.2)
    return message


def test_deleting_a_group_deletes_its_stored_generation(broker, uid) -> None:
    """The generation a coordinator stores to fence stale commits goes with the group."""
    topic, group = f"gen-{uid}", f"gen-{uid}"
    create(broker, topic, 1)
    produce_all(broker, topic, [(0, None, b"a")])
    consumer = ck.Consumer(confluent_conf(broker, group_id=group, auto_offset_reset="earliest"))
    consumer.subscribe([topic])
    try:
        message = _first_message(consumer)
        assert message is not None and not message.error()
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    assert _stored_generation(broker, group) is not None
    admin = AdminClient(confluent_conf(broker))
    admin.delete_consumer_groups([group])[group].result(10)
    assert _stored_generation(broker, group) is None


def test_a_group_known_only_by_its_generation_is_deleted_with_it(fresh_broker, uid) -> None:
    """A group that formed but never committed, whose coordinator restarted since: its stored
    generation is all that is left of it, and DeleteGroups deletes that too."""
    topic, group = f"gen-only-{uid}", f"gen-only-{uid}"
    create(fresh_broker, topic, 1)
    produce_all(fresh_broker, topic, [(0, None, b"a")])
    consumer = ck.Consumer(
        confluent_conf(
            fresh_broker, group_id=group, auto_offset_reset="earliest", enable_auto_commit=False
        )
    )
    consumer.subscribe([topic])
    try:
        message = _first_message(consumer)
        assert message is not None and not message.error()  # the group formed
    finally:
        consumer.close()
    assert _stored_generation(fresh_broker, group) is not None
    fresh_broker.stop()
    restarted = start_broker(fresh_broker.data_dir)
    try:
        admin = AdminClient(confluent_conf(restarted))
        admin.delete_consumer_groups([group])[group].result(10)
        assert _stored_generation(restarted, group) is None
    finally:
        restarted.stop()


def test_cluster_is_described(broker) -> None:
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=f"127.0.0.1:{broker.ports['kafka']}")
    try:
        cluster = admin.describe_cluster()
    finally:
        admin.close()
    assert cluster["cluster_id"] == "flowmq-py"
    assert [b["port"] for b in cluster["brokers"]] == [broker.ports["kafka"]]
