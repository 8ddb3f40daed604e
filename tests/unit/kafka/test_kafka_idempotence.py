"""Idempotent-producer bookkeeping: duplicates answered with their first offset, gaps and
old epochs refused by the flush-transaction hook (never from memory alone), and the state
persisted by that hook."""

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


async def refusal(states: ProducerStates, meta, b: ProducerBatch) -> ErrorCode | None:
    """What the flush transaction says of ``b``: its sequence error, or None (written)."""
    hook, _ = states.accept(KEY, b)
    refused = await meta.transact(lambda tr: hook(tr, 99))
    assert refused is None or isinstance(refused, SequenceRefused)
    return refused.error if refused is not None else None


async def test_sequences_duplicates_gaps_epochs_and_persistence() -> None:
    meta = open_meta_store("memory://")
    states = ProducerStates(meta)
    await states.load([KEY])
    first = ProducerBatch(1000, 0, 0, 4)
    assert states.earlier_copy(KEY, first) is None
    await commit(states, meta, first, 0)
    assert states.earlier_copy(KEY, first) == 0
    second = ProducerBatch(1000, 0, 5, 5)
    gap = ProducerBatch(1000, 0, 7, 7)
    assert states.earlier_copy(KEY, gap) is None  # memory does not refuse: the store does
    assert await refusal(states, meta, gap) == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    await commit(states, meta, second, 5)

    # Another broker (or this one after a restart) knows the same from the meta store.
    other = ProducerStates(meta)
    await other.load([KEY])
    assert other.earlier_copy(KEY, first) == 0
    assert other.earlier_copy(KEY, second) == 5
    assert await refusal(other, meta, ProducerBatch(1000, 0, 6, 6)) is None

    bumped = ProducerBatch(1000, 1, 0, 0)
    assert states.earlier_copy(KEY, bumped) is None
    await commit(states, meta, bumped, 6)
    old_epoch = ProducerBatch(1000, 0, 6, 6)
    assert await refusal(states, meta, old_epoch) == ErrorCode.INVALID_PRODUCER_EPOCH
    # A new epoch must start at sequence 0 ...
    assert await refusal(states, meta, ProducerBatch(1000, 2, 3, 3)) == (
        ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    )
    # ... and a batch of the stored epoch continues it, whatever the memory says.
    assert await refusal(states, meta, ProducerBatch(1000, 1, 1, 1)) is None
    await meta.close()


async def test_a_pending_duplicate_waits_for_the_original() -> None:
    meta = open_meta_store("memory://")
    states = ProducerStates(meta)
    await states.load([KEY])
    b = ProducerBatch(1000, 0, 0, 0)
    _, track = states.accept(KEY, b)
    fut = asyncio.get_running_loop().create_future()
    track(fut)
    assert states.earlier_copy(KEY, b) is fut
    fut.set_exception(RuntimeError("flush failed"))
    # Failed but not yet forgotten (its callbacks have not run): a new attempt all the same.
    assert states.earlier_copy(KEY, b) is None
    await asyncio.sleep(0)
    # The failed write is forgotten, so the retry is written rather than "deduplicated".
    assert states.earlier_copy(KEY, b) is None
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
    assert a.earlier_copy(KEY, first) is None and b.earlier_copy(KEY, first) is None
    hook_a, track_a = a.accept(KEY, first)
    hook_b, _ = b.accept(KEY, first)
    assert await meta.transact(lambda tr: hook_b(tr, 7)) is None
    refused = await meta.transact(lambda tr: hook_a(tr, 10))
    assert isinstance(refused, DuplicateBatch) and refused.offset == 7
    fut = asyncio.get_running_loop().create_future()
    track_a(fut)
    fut.set_exception(refused)
    await asyncio.sleep(0)
    assert a.earlier_copy(KEY, first) == 7

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
