"""Idempotent producers: producer ids and per (producer, partition) sequence checks.

As the Java broker does, the last few batches of each producer on each partition are kept
(first and last sequence, offset); a batch that repeats one of them is a retry of something
already written and is answered with its original offset without appending again, and a
batch that does not continue the sequence is refused with OUT_OF_ORDER_SEQUENCE_NUMBER (or,
of an epoch older than the stored one, INVALID_PRODUCER_EPOCH).

The state lives in the meta store next to the data: each batch's entry is written by a hook
running in the very flush transaction that gives the batch its offsets
(``StreamStore.append_nowait(on_commit=...)``), and that hook checks the batch against the
stored state first, refusing a repeat (``DuplicateBatch``: answered with the stored offset)
or a gap (``SequenceRefused``) instead of writing it.  The meta store's serializable
transactions make that the one decision that cannot race, and the only one that refuses:
after a crash, or on another broker, the state matches exactly what was acknowledged.

A copy in memory (loaded the first time a broker sees a producer on a partition) answers
most retries at once: a batch it holds with its offset, or still being written here, is a
repeat for certain.  Everything else goes to the flush transaction, even a batch that looks
like a gap in memory, because memory can be wrong both ways: brokers are stateless and any
of them may take a partition's produce requests, so another broker may have written batches
since this one loaded the state, or since a batch of an old epoch got stuck in this
broker's flush while the producer gave up on it and bumped its epoch (KIP-360: an
idempotent producer bumps its epoch itself).  Refusing such a batch from memory answered
OUT_OF_ORDER_SEQUENCE_NUMBER for the first batch the producer had not had acknowledged,
which librdkafka takes for a broker that lost its state: a fatal error ("sequence
desynchronization", issue #11).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import struct
from collections.abc import Iterable
from typing import Any, NamedTuple

import fdb.tuple as fdbtuple

from flowmq_kas3.errors import ChunkRefused, InvalidRecordBatch
from flowmq_kas3.records import iter_batches
from flowmq_meta import Transaction, decode_int, encode_int
from flowmq_meta.api import MetaStore
from flowmq_meta.keys import KAFKA_PRODUCERS
from flowmq_wire.kafka import ErrorCode

log = logging.getLogger(__name__)

# Batches remembered per producer and partition: a producer has at most 5 in flight.
KEEP_BATCHES = 5
ID_BLOCK = 100
MAX_STATES = 200_000
_SEQ_WRAP = 1 << 31
_PRODUCER = struct.Struct(">qhi")  # producerId, producerEpoch, baseSequence at byte 43
_NEXT_ID_KEY = KAFKA_PRODUCERS.pack("next_id")
FIRST_PRODUCER_ID = 1000

StateKey = tuple[str, str, int, int]
"""(namespace, stream, partition, producer id)."""


class ProducerBatch(NamedTuple):
    """What the producer fields of a produced chunk say (all its batches together)."""

    producer_id: int
    epoch: int
    first_seq: int
    last_seq: int


def producer_batch(records: bytes | memoryview) -> ProducerBatch | None:
    """The producer id, epoch and sequence range of a chunk, or None if it is not from an
    idempotent producer.  Raises ``InvalidRecordBatch`` when the batches of one chunk
    disagree (different producers, or a sequence that is not continuous)."""
    found: ProducerBatch | None = None
    for info in iter_batches(records):
        pid, epoch, seq = _PRODUCER.unpack_from(records, info.position + 43)
        if pid < 0:
            if found is not None:
                raise InvalidRecordBatch("idempotent and plain batches mixed in one partition")
            continue
        last = (seq + info.offset_count - 1) % _SEQ_WRAP
        if found is None:
            found = ProducerBatch(pid, epoch, seq, last)
        elif pid != found.producer_id or epoch != found.epoch:
            raise InvalidRecordBatch("batches of several producers in one partition")
        elif seq != (found.last_seq + 1) % _SEQ_WRAP:
            raise InvalidRecordBatch("batch sequence numbers are not continuous")
        else:
            found = found._replace(last_seq=last)
    return found


class _Entry:
    __slots__ = ("first_seq", "future", "last_seq", "offset")

    def __init__(self, first_seq: int, last_seq: int, offset: int | None) -> None:
        self.first_seq = first_seq
        self.last_seq = last_seq
        self.offset = offset
        self.future: asyncio.Future[int] | None = None


class _State:
    __slots__ = ("batches", "epoch", "pending")

    def __init__(self, epoch: int | None = None, batches: Iterable[_Entry] = ()) -> None:
        self.epoch = epoch
        self.batches: collections.deque[_Entry] = collections.deque(batches, maxlen=KEEP_BATCHES)
        self.pending = 0


EarlierCopy = int | asyncio.Future[int]
"""The offset of a batch already written, or the future of a copy still being written."""


class DuplicateBatch(ChunkRefused):
    """The batch is already stored (found by the flush transaction): answer with its offset."""

    code = "kafka_duplicate_batch"

    def __init__(self, offset: int) -> None:
        super().__init__(f"batch already written at offset {offset}")
        self.offset = offset


class SequenceRefused(ChunkRefused):
    """The flush transaction found the batch out of sequence (or of a fenced epoch)."""

    code = "kafka_sequence_refused"

    def __init__(self, error: ErrorCode) -> None:
        super().__init__(f"sequence check failed in the flush transaction: {error.name}")
        self.error = error


def _judge(
    epoch: int | None, batches: Iterable[Any], batch: ProducerBatch
) -> tuple[ErrorCode, Any]:
    """The sequence rules (Kafka's ProducerStateManager): ``(error, None)`` to refuse,
    ``(NONE, entry)`` for a batch equal to one of ``batches`` (objects with ``first_seq``
    and ``last_seq``, oldest first) and ``(NONE, None)`` to append."""
    if epoch is not None and batch.epoch < epoch:
        return ErrorCode.INVALID_PRODUCER_EPOCH, None
    if epoch is None or batch.epoch > epoch:
        ok = batch.first_seq == 0
        return (ErrorCode.NONE if ok else ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER), None
    last = None
    for entry in batches:
        if entry.first_seq == batch.first_seq and entry.last_seq == batch.last_seq:
            return ErrorCode.NONE, entry
        last = entry
    expected = (last.last_seq + 1) % _SEQ_WRAP if last is not None else 0
    if batch.first_seq != expected:
        return ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, None
    return ErrorCode.NONE, None


class _Stored(NamedTuple):
    first_seq: int
    last_seq: int
    offset: int


def _check_and_persist(
    key: bytes, batch: ProducerBatch, tr: Transaction, base: int
) -> ChunkRefused | None:
    """In the flush transaction: check ``batch`` against the stored state (read from the
    transaction itself, so several batches in one flush chain correctly) and, if it is
    new and in sequence, add it with the offset it gets."""
    raw = tr.get(key)
    epoch: int | None = None
    entries: list[_Stored] = []
    if raw is not None:
        epoch, stored = fdbtuple.unpack(raw)
        entries = [_Stored(*e) for e in stored]
    error, same = _judge(epoch, entries, batch)
    if error:
        return SequenceRefused(error)
    if same is not None:
        return DuplicateBatch(same.offset)
    if epoch != batch.epoch:
        entries = []
    entries.append(_Stored(batch.first_seq, batch.last_seq, base))
    tr.set(key, fdbtuple.pack((batch.epoch, tuple(entries[-KEEP_BATCHES:]))))
    return None


class ProducerStates:
    def __init__(self, meta: MetaStore, *, max_states: int = MAX_STATES) -> None:
        self.meta = meta
        self.max_states = max_states
        self._states: dict[StateKey, _State] = {}
        self._next_id = 0
        self._id_limit = 0
        self._id_lock = asyncio.Lock()

    # -- producer ids ------------------------------------------------------------------------

    async def allocate_id(self) -> int:
        """A producer id no broker sharing the meta store has handed out; blocks of ids are
        reserved in one transaction."""
        async with self._id_lock:
            if self._next_id >= self._id_limit:

                def reserve(tr: Transaction) -> int:
                    start = max(decode_int(tr.get(_NEXT_ID_KEY)), FIRST_PRODUCER_ID)
                    tr.set(_NEXT_ID_KEY, encode_int(start + ID_BLOCK))
                    return start

                start = await self.meta.transact(reserve)
                self._next_id, self._id_limit = start, start + ID_BLOCK
            pid = self._next_id
            self._next_id += 1
            return pid

    # -- state -------------------------------------------------------------------------------

    @staticmethod
    def _key(key: StateKey) -> bytes:
        return KAFKA_PRODUCERS.pack("seq", *key)

    def known(self, key: StateKey) -> bool:
        return key in self._states

    async def load(self, keys: Iterable[StateKey]) -> None:
        """Read the stored state of ``keys`` not in memory, in one transaction."""
        wanted = [k for k in dict.fromkeys(keys) if k not in self._states]
        if not wanted:
            return
        packed = [self._key(k) for k in wanted]
        rows = await self.meta.transact(lambda tr: [tr.get(k) for k in packed])
        for key, raw in zip(wanted, rows, strict=True):
            if key in self._states:
                continue  # learned meanwhile, by a batch in flight: newer than the store
            if raw is None:
                self._states[key] = _State()
                continue
            epoch, stored = fdbtuple.unpack(raw)
            self._states[key] = _State(epoch, (_Entry(f, last, off) for f, last, off in stored))
        self._evict()

    def earlier_copy(self, key: StateKey, batch: ProducerBatch) -> EarlierCopy | None:
        """The copy of ``batch`` this broker knows is written (its offset) or being written
        here (its future); None: submit it, and the flush transaction decides."""
        state = self._states.get(key)
        if state is None or state.epoch != batch.epoch:
            return None
        for entry in state.batches:
            if entry.first_seq == batch.first_seq and entry.last_seq == batch.last_seq:
                if entry.offset is not None:
                    return entry.offset
                if entry.future is not None and not entry.future.done():
                    return entry.future
                return None  # its write failed: this is a new attempt
        return None

    def accept(self, key: StateKey, batch: ProducerBatch) -> tuple[Any, Any]:
        """Record ``batch`` as written (pending); returns the hook for the flush transaction
        and a callback for the append future."""
        state = self._states.get(key)
        if state is None:  # evicted since it was loaded: memory only serves repeats
            state = self._states[key] = _State()
        if state.epoch != batch.epoch:
            state.epoch = batch.epoch
            state.batches.clear()
        entry = _Entry(batch.first_seq, batch.last_seq, None)
        state.batches.append(entry)
        state.pending += 1
        hook = functools.partial(_check_and_persist, self._key(key), batch)

        def done(fut: asyncio.Future[int]) -> None:
            state.pending -= 1
            exc = None if fut.cancelled() else fut.exception()
            if isinstance(exc, DuplicateBatch):
                entry.offset = exc.offset  # written before, by this broker or another
            elif fut.cancelled() or exc is not None:
                # Not written: forget it, so the producer's retry is not a "duplicate".
                try:
                    state.batches.remove(entry)
                except ValueError:
                    pass
            else:
                entry.offset = fut.result()
            entry.future = None

        def track(fut: asyncio.Future[int]) -> None:
            entry.future = fut
            fut.add_done_callback(done)

        return hook, track

    def _evict(self) -> None:
        if len(self._states) <= self.max_states:
            return
        drop = len(self._states) - self.max_states * 9 // 10
        for key in list(self._states):
            if drop <= 0:
                break
            if not self._states[key].pending:
                del self._states[key]
                drop -= 1

    async def forget_stream(self, namespace: str, stream: str) -> None:
        for key in [k for k in self._states if k[0] == namespace and k[1] == stream]:
            del self._states[key]
        begin, end = KAFKA_PRODUCERS.range("seq", namespace, stream)
        await self.meta.transact(lambda tr: tr.clear_range(begin, end))


__all__ = [
    "KEEP_BATCHES",
    "DuplicateBatch",
    "ProducerBatch",
    "ProducerStates",
    "SequenceRefused",
    "EarlierCopy",
    "StateKey",
    "producer_batch",
]
