"""An idempotent producer's retry that reaches another broker (all brokers are stateless and
take any partition's produce requests): it is recognised from the state stored with the data,
even when that broker's memory of the producer is stale, and never written twice."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from flowmq_wire.kafka import REQUEST_CLASSES, ErrorCode
from tests.fixtures.cluster import BrokerCluster
from tests.fixtures.counting import CountingObjectStore, hold_puts
from tests.fixtures.inprocess import joined_pair
from tests.fixtures.waiting import wait_until_async
from tests.integration.kafka.conftest import RawKafka, wait_until
from tests.integration.kafka.test_kafka_protocol import (
    PRODUCE,
    _idempotent_batch,
    create_topic,
    fetch,
    init_producer_id,
    produce,
)


def test_a_retry_on_another_broker_after_a_lost_answer_is_written_once(tmp_path, uid) -> None:
    cluster = BrokerCluster(tmp_path, "t", names=("a", "b")).start_all()
    clients: list[RawKafka] = []
    try:
        a, b = (RawKafka(cluster[name].ports["kafka"]) for name in ("a", "b"))
        clients += [a, b]
        topic = f"idem-{uid}"
        create_topic(a, topic)
        pid = init_producer_id(a).producer_id

        def send(client: RawKafka, seq: int, value: bytes) -> tuple[int, int]:
            part = produce(client, topic, 0, _idempotent_batch(pid, 0, seq, [value]))
            answer = part.responses[0].partition_responses[0]
            return answer.error_code, answer.base_offset

        # B learns the producer (in memory): its sequence 0 is at offset 0.
        assert send(b, 0, b"r0") == (0, 0)
        # Sequence 1 goes through A and lands, but the answer is lost: the connection closes
        # without it being read.
        lost = RawKafka(cluster["a"].ports["kafka"])
        clients.append(lost)
        lost.send(
            PRODUCE,
            9,
            transactional_id=None,
            acks=-1,
            timeout_ms=5000,
            topic_data=[_topic_data(topic, _idempotent_batch(pid, 0, 1, [b"r1"]))],
        )
        wait_until(lambda: fetch(b, topic, 0, 0).high_watermark == 2)
        lost.close()
        # The producer retries it on B, whose memory still ends at sequence 0: B's first
        # guess is "next in sequence", and the check stored with the data says "already
        # written at offset 1".
        assert send(b, 1, b"r1") == (0, 1)
        assert send(a, 1, b"r1") == (0, 1)
        assert send(b, 2, b"r2") == (0, 2)
        assert fetch(a, topic, 0, 0).high_watermark == 3
    finally:
        for client in clients:
            client.close()
        cluster.stop_all()


def _topic_data(topic: str, records: bytes):
    data = REQUEST_CLASSES[PRODUCE][9].TopicProduceData
    return data(name=topic, partition_data=[data.PartitionProduceData(index=0, records=records)])


async def test_a_retry_written_elsewhere_while_the_first_copy_waits_is_stored_once(
    tmp_path, uid
) -> None:
    """A broker stalls with a batch in its flush (a paused process, a slow PUT); the producer
    gives up on it and retries on the other broker, which writes the batch; then the first
    broker's flush goes through.  Its transaction finds the batch stored and leaves its copy
    out, answering with the other broker's offset."""
    async with joined_pair(tmp_path, ["kafka", "admin"]) as (a, b):
        gated = CountingObjectStore(a.batcher.objects)
        a.batcher.objects = gated
        a_client, b_client = RawKafka(a.ports["kafka"]), RawKafka(b.ports["kafka"])
        try:
            topic = f"idem-{uid}"
            await asyncio.to_thread(create_topic, b_client, topic)
            pid = (await asyncio.to_thread(init_producer_id, b_client)).producer_id
            records = _idempotent_batch(pid, 0, 0, [b"once"])
            gated.put_gate = asyncio.Event()
            first = asyncio.create_task(asyncio.to_thread(produce, a_client, topic, 0, records))
            await gated.put_waiting.wait()  # A holds the batch, not yet stored
            retried = await asyncio.to_thread(produce, b_client, topic, 0, records)
            assert _answer(retried) == (0, 0)
            gated.put_gate.set()
            assert _answer(await first) == (0, 0)
            got = await asyncio.to_thread(fetch, b_client, topic, 0, 0)
            assert got.high_watermark == 1
        finally:
            a_client.close()
            b_client.close()


def _answer(response) -> tuple[int, int]:
    part = response.responses[0].partition_responses[0]
    return part.error_code, part.base_offset


# (epoch, sequence) of what the producer sends through B while A holds (0, 1), then of what it
# sends through A, A's answer to it, and A's answer to the stalled copy.
_THROUGH_B = {
    # it gave up on (0, 1), bumped its epoch itself and started again at 0
    "bumped epoch": ([(1, 0)], (1, 1), (0, 2), (ErrorCode.INVALID_PRODUCER_EPOCH, -1)),
    # it retried (0, 1) through B, which wrote it, and went on there
    "same epoch": ([(0, 1), (0, 2)], (0, 3), (0, 3), (0, 1)),
}


@pytest.mark.parametrize("case", list(_THROUGH_B))
async def test_a_batch_continuing_the_stored_sequence_is_written_by_a_broker_whose_memory_lags(
    tmp_path, uid, case: str
) -> None:
    """Issue #11 (librdkafka's fatal "sequence desynchronization"): broker A holds sequence 1
    of epoch 0 in a stalled flush; the producer gives up on it and goes on through B (after
    bumping its epoch, KIP-360: an idempotent producer does that itself; or retrying it
    there), then sends its next batch through A.  A's memory (epoch 0, sequence 1 in flight)
    calls that a gap, but it continues the stored sequence, and only the stored state
    decides: written, as Kafka would, where A refused it with OUT_OF_ORDER_SEQUENCE_NUMBER
    for the first batch the producer had not had acknowledged (fatal for librdkafka).  The
    stalled copy is then fenced, or found written by B."""
    through_b, through_a, a_answer, stalled_answer = _THROUGH_B[case]
    async with joined_pair(tmp_path, ["kafka", "admin"]) as (a, b):
        a_client, b_client = RawKafka(a.ports["kafka"]), RawKafka(b.ports["kafka"])
        other = RawKafka(a.ports["kafka"])  # the producer's new connection to A
        try:
            topic = f"idem-{uid}"
            await asyncio.to_thread(create_topic, b_client, topic)
            pid = (await asyncio.to_thread(init_producer_id, b_client)).producer_id

            def send(client: RawKafka, epoch: int, seq: int) -> Any:
                value = f"e{epoch}-{seq}".encode()
                return produce(client, topic, 0, _idempotent_batch(pid, epoch, seq, [value]))

            assert _answer(await asyncio.to_thread(send, a_client, 0, 0)) == (0, 0)
            gated = hold_puts(a.batcher)
            stalled = asyncio.create_task(asyncio.to_thread(send, a_client, 0, 1))
            try:
                await gated.put_waiting.wait()  # A holds sequence 1 of epoch 0, not stored
                for offset, (epoch, seq) in enumerate(through_b, start=1):
                    assert _answer(await asyncio.to_thread(send, b_client, epoch, seq)) == (
                        0,
                        offset,
                    )
                continued = asyncio.create_task(asyncio.to_thread(send, other, *through_a))
                # Either answered from A's memory at once, or queued behind the stalled flush.
                await wait_until_async(
                    lambda: continued.done() or a.batcher.unsettled_chunks == 2, 10
                )
                if continued.done():
                    assert _answer(continued.result()) == a_answer
            finally:
                gated.put_gate.set()
            assert _answer(await continued) == a_answer
            assert _answer(await stalled) == stalled_answer
            got = await asyncio.to_thread(fetch, b_client, topic, 0, 0)
            assert got.high_watermark == a_answer[1] + 1
        finally:
            for client in (a_client, b_client, other):
                client.close()
