"""Idempotent-producer bookkeeping: duplicates answered with their first offset, gaps and
old epochs refused, and the state persisted by the flush-transaction hook."""

from __future__ import annotations

import asyncio

import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder

from flowmq_broker.kafka.idempotence import (
    DuplicateBatch,
    ProducerBatch,
    ProducerStates,
    SequenceRefused,
    producer_batch,
)
from flowmq_kas3.errors import InvalidRecordBatch
from flowmq_kas3.records import build_batch
from flowmq_meta import open_meta_store
from flowmq_wire.kafka import ErrorCode

KEY = ("default", "orders", 0, 1000)


def batch(pid: int, epoch: int, seq: int, n: int) -> bytes:
    builder = DefaultRecordBatchBuilder(2, 0, False, pid, epoch, seq, 1 << 20)
    for i in range(n):
        builder.append(i, 0, None, b"v", [])
    return bytes(builder.build())


def test_producer_fields_are_read_from_batch_headers() -> None:
    assert producer_batch(build_batch([(None, b"v", [], 0)])) is None
    assert producer_batch(batch(7, 2, 10, 3)) == ProducerBatch(7, 2, 10, 12)
    assert producer_batch(batch(7, 2, 10, 3) + batch(7, 2, 13, 1)) == ProducerBatch(7, 2, 10, 13)
    with pytest.raises(InvalidRecordBatch):
        producer_batch(batch(7, 2, 10, 3) + batch(7, 2, 20, 1))
    with pytest.raises(InvalidRecordBatch):
        producer_batch(batch(7, 2, 0, 1) + batch(8, 0, 0, 1))


async def commit(states: ProducerStates, meta, b: ProducerBatch, offset: int) -> None:
    hook, track = states.accept(KEY, b)
    await meta.transact(lambda tr: hook(tr, offset))
    fut = asyncio.get_running_loop().create_future()
    track(fut)
    fut.set_result(offset)
    await asyncio.sleep(0)


async def test_sequences_duplicates_gaps_epochs_and_persistence() -> None:
    meta = open_meta_store("memory://")
    states = ProducerStates(meta)
    await states.load([KEY])
    first = ProducerBatch(1000, 0, 0, 4)
    assert states.check(KEY, first).error == ErrorCode.NONE
    await commit(states, meta, first, 0)
    assert states.check(KEY, first).duplicate == 0
    second = ProducerBatch(1000, 0, 5, 5)
    assert (
        states.check(KEY, ProducerBatch(1000, 0, 7, 7)).error
        == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    )
    await commit(states, meta, second, 5)

    # Another broker (or this one after a restart) knows the same from the meta store.
    other = ProducerStates(meta)
    await other.load([KEY])
    assert other.check(KEY, first).duplicate == 0
    assert other.check(KEY, second).duplicate == 5
    assert other.check(KEY, ProducerBatch(1000, 0, 6, 6)).error == ErrorCode.NONE

    bumped = ProducerBatch(1000, 1, 0, 0)
    assert states.check(KEY, bumped).error == ErrorCode.NONE
    await commit(states, meta, bumped, 6)
    assert states.check(KEY, ProducerBatch(1000, 0, 6, 6)).error == ErrorCode.INVALID_PRODUCER_EPOCH
    await meta.close()


async def test_a_pending_duplicate_waits_for_the_original() -> None:
    meta = open_meta_store("memory://")
    states = ProducerStates(meta)
    await states.load([KEY])
    b = ProducerBatch(1000, 0, 0, 0)
    _, track = states.accept(KEY, b)
    fut = asyncio.get_running_loop().create_future()
    track(fut)
    assert states.check(KEY, b).duplicate is fut
    fut.set_exception(RuntimeError("flush failed"))
    await asyncio.sleep(0)
    # The failed write is forgotten, so the retry is written rather than "deduplicated".
    assert states.check(KEY, b).error == ErrorCode.NONE and states.check(KEY, b).duplicate is None
    await meta.close()


async def test_the_flush_transaction_refuses_what_another_broker_wrote_meanwhile() -> None:
    """Brokers A and B both pass a retried batch on their (stale) memory: B's copy is written
    first; A's, in its own flush transaction, finds it stored and is left out, answered with
    B's offset, and A remembers that offset for the next retry.  A gap found there is
    refused with OUT_OF_ORDER_SEQUENCE_NUMBER."""
    meta = open_meta_store("memory://")
    a, b = ProducerStates(meta), ProducerStates(meta)
    await a.load([KEY])
    await b.load([KEY])
    first = ProducerBatch(1000, 0, 0, 2)
    assert a.check(KEY, first).error == b.check(KEY, first).error == ErrorCode.NONE
    hook_a, track_a = a.accept(KEY, first)
    hook_b, _ = b.accept(KEY, first)
    assert await meta.transact(lambda tr: hook_b(tr, 7)) is None
    refused = await meta.transact(lambda tr: hook_a(tr, 10))
    assert isinstance(refused, DuplicateBatch) and refused.offset == 7
    fut = asyncio.get_running_loop().create_future()
    track_a(fut)
    fut.set_exception(refused)
    await asyncio.sleep(0)
    assert a.check(KEY, first).duplicate == 7

    gap = ProducerBatch(1000, 0, 5, 5)
    hook_gap, _ = b.accept(KEY, gap)
    refused = await meta.transact(lambda tr: hook_gap(tr, 10))
    assert isinstance(refused, SequenceRefused)
    assert refused.error == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    await meta.close()


async def test_producer_ids_are_unique_across_brokers() -> None:
    meta = open_meta_store("memory://")
    a, b = ProducerStates(meta), ProducerStates(meta)
    ids = [await a.allocate_id() for _ in range(150)] + [await b.allocate_id() for _ in range(150)]
    assert len(set(ids)) == 300
    await meta.close()
