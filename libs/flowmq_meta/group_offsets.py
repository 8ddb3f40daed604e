"""Consumer-group committed offsets in the meta store (DESIGN.md §5 Stream).

``GROUP_OFFSETS(ns, group, stream, partition)`` -> tuple-packed ``(offset, metadata,
leader epoch, commit timestamp ms)``.

Commits are coalesced: while one transaction is in flight, every commit that arrives waits
for the next, which then writes all of them at once; each ``commit`` future resolves only
after the transaction holding it has committed (is durable), so a consumer's OffsetCommit is
acknowledged exactly then.  A busy broker therefore pays one transaction per round trip of
the meta store, not one per commit request.

Fencing: ``GROUP_GENERATIONS(ns, group)`` holds the group's latest generation, which its
coordinator stores (``next_generation``) before any member learns it.  A member's commit
carries its generation and the transaction that would write it first reads the stored one:
older means the group has rebalanced since (maybe on another coordinator, while this write
waited for a locked meta store or a paused broker), and the commit is refused with
``StaleGeneration`` (Kafka's ILLEGAL_GENERATION) instead of moving the offset back under the
new members.  Commits without a generation (-1: simple consumers, admin resets) are not
fenced, as in Kafka.  Deleting the group (``delete_group``: Kafka's DeleteGroups, only
for a group without members) deletes its generation with its offsets.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import fdb.tuple as fdbtuple

from flowmq_meta import keys
from flowmq_meta.api import MetaStore, Transaction, decode_int, encode_int

log = logging.getLogger(__name__)

# Offsets written per transaction: ~150 bytes each, far below FoundationDB's 10 MB.
DEFAULT_MAX_BATCH = 5000


class CommittedOffset(NamedTuple):
    offset: int
    metadata: str | None = None
    leader_epoch: int = -1
    commit_timestamp_ms: int = -1

    def encode(self) -> bytes:
        return fdbtuple.pack(
            (self.offset, self.metadata, self.leader_epoch, self.commit_timestamp_ms)
        )

    @classmethod
    def decode(cls, raw: bytes) -> CommittedOffset:
        return cls(*fdbtuple.unpack(raw))


OffsetEntry = tuple[str, int, CommittedOffset]
"""(stream, partition, committed offset)."""


class StaleGeneration(Exception):
    """The group moved to a newer generation than the commit's (Kafka's ILLEGAL_GENERATION)."""


class _Pending(NamedTuple):
    namespace: str
    group: str
    entries: Sequence[OffsetEntry]
    generation: int  # -1: not fenced
    future: asyncio.Future[None]


def _stored_generation(tr: Transaction, namespace: str, group: str) -> int:
    return decode_int(tr.get(keys.GROUP_GENERATIONS.pack(namespace, group)))


class GroupOffsetStore:
    def __init__(self, meta: MetaStore, *, max_batch: int = DEFAULT_MAX_BATCH) -> None:
        self.meta = meta
        self.max_batch = max_batch
        self.transactions = 0  # for tests and benchmarks: commits cost this many txns
        self._pending: collections.deque[_Pending] = collections.deque()
        self._writer: asyncio.Task[None] | None = None

    # -- commit ------------------------------------------------------------------------------

    def commit(
        self, namespace: str, group: str, entries: Sequence[OffsetEntry], generation: int = -1
    ) -> asyncio.Future[None]:
        """Queue ``entries`` for the next transaction; the future resolves once it is
        durable, or fails with ``StaleGeneration`` if ``generation`` (>= 0) is older than the
        group's stored one, or with the transaction's error."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        if not entries:
            future.set_result(None)
            return future
        self._pending.append(_Pending(namespace, group, entries, generation, future))
        if self._writer is None or self._writer.done():
            self._writer = loop.create_task(self._write_loop(), name="group-offset-commits")
        return future

    async def _write_loop(self) -> None:
        while self._pending:
            batch: list[_Pending] = []
            size = 0
            while self._pending and (
                not batch or size + len(self._pending[0].entries) <= self.max_batch
            ):
                item = self._pending.popleft()
                batch.append(item)
                size += len(item.entries)

            def txn(tr: Transaction, batch: list[_Pending] = batch) -> list[bool]:
                """Write each commit whose generation is still current; which were."""
                generations: dict[tuple[str, str], int] = {}
                written = []
                for p in batch:
                    if p.generation >= 0:
                        stored = generations.get((p.namespace, p.group))
                        if stored is None:
                            stored = _stored_generation(tr, p.namespace, p.group)
                            generations[(p.namespace, p.group)] = stored
                        if p.generation < stored:
                            written.append(False)
                            continue
                    for stream, partition, c in p.entries:
                        key = keys.GROUP_OFFSETS.pack(p.namespace, p.group, stream, partition)
                        tr.set(key, c.encode())
                    written.append(True)
                return written

            try:
                written = await self.meta.transact(txn)
                self.transactions += 1
            except Exception as exc:
                log.warning("group offset commit failed: %s", exc)
                for p in batch:
                    if not p.future.done():
                        p.future.set_exception(exc)
                continue
            for p, ok in zip(batch, written, strict=True):
                if p.future.done():
                    continue
                if ok:
                    p.future.set_result(None)
                else:
                    p.future.set_exception(StaleGeneration(f"{p.group}: generation {p.generation}"))

    async def close(self) -> None:
        """Wait for queued commits to be written."""
        if self._writer is not None:
            with contextlib.suppress(Exception):
                await self._writer

    # -- generations -------------------------------------------------------------------------

    async def next_generation(self, namespace: str, group: str, current: int) -> int:
        """Store and return the group's next generation: above ``current`` and above any
        generation stored for it (by this or an earlier coordinator of the group), so two
        coordinators never hand out the same one and every older commit is fenced."""
        key = keys.GROUP_GENERATIONS.pack(namespace, group)

        def txn(tr: Transaction) -> int:
            generation = max(current, decode_int(tr.get(key))) + 1
            tr.set(key, encode_int(generation))
            return generation

        return await self.meta.transact(txn)

    async def has_generation(self, namespace: str, group: str) -> bool:
        """Whether a generation is stored for ``group`` (it formed, maybe never committed)."""
        key = keys.GROUP_GENERATIONS.pack(namespace, group)
        return await self.meta.transact(lambda tr: tr.get(key) is not None)

    # -- read --------------------------------------------------------------------------------

    async def fetch(
        self,
        namespace: str,
        group: str,
        partitions: Iterable[tuple[str, int]] | None = None,
    ) -> dict[tuple[str, int], CommittedOffset]:
        """Committed offsets of ``group``: of the given ``(stream, partition)`` pairs (those
        never committed are absent), or all of them."""
        if partitions is None:
            begin, end = keys.GROUP_OFFSETS.range(namespace, group)

            def scan(tr: Transaction) -> dict[tuple[str, int], CommittedOffset]:
                out = {}
                for key, value in tr.get_range(begin, end):
                    _, _, stream, partition = keys.GROUP_OFFSETS.unpack(key)
                    out[(stream, partition)] = CommittedOffset.decode(value)
                return out

            return await self.meta.transact(scan)
        wanted = list(partitions)

        def point(tr: Transaction) -> dict[tuple[str, int], CommittedOffset]:
            out = {}
            for stream, partition in wanted:
                raw = tr.get(keys.GROUP_OFFSETS.pack(namespace, group, stream, partition))
                if raw is not None:
                    out[(stream, partition)] = CommittedOffset.decode(raw)
            return out

        return await self.meta.transact(point)

    async def groups(self, namespace: str) -> list[str]:
        """Groups with at least one committed offset, in name order."""
        begin, end = keys.GROUP_OFFSETS.range(namespace)

        def txn(tr: Transaction) -> list[str]:
            found: list[str] = []
            cursor = begin
            while True:
                rows = tr.get_range(cursor, end, limit=1)
                if not rows:
                    return found
                group = keys.GROUP_OFFSETS.unpack(rows[0][0])[1]
                found.append(group)
                cursor = keys.GROUP_OFFSETS.range(namespace, group)[1]

        return await self.meta.transact(txn)

    # -- delete ------------------------------------------------------------------------------

    async def delete_group(self, namespace: str, group: str) -> None:
        """Forget the group: its committed offsets and its generation, in one transaction
        (a group made again under the name starts from generation 1, as in Kafka)."""
        begin, end = keys.GROUP_OFFSETS.range(namespace, group)
        generation = keys.GROUP_GENERATIONS.pack(namespace, group)

        def txn(tr: Transaction) -> None:
            tr.clear_range(begin, end)
            tr.clear(generation)

        await self.meta.transact(txn)

    async def delete_stream(self, namespace: str, stream: str) -> None:
        """Forget every group's offsets of a deleted stream (as Kafka does with a deleted
        topic's offsets)."""
        for group in await self.groups(namespace):
            begin, end = keys.GROUP_OFFSETS.range(namespace, group, stream)
            await self.meta.transact(lambda tr, b=begin, e=end: tr.clear_range(b, e))


__all__ = ["CommittedOffset", "GroupOffsetStore", "OffsetEntry", "StaleGeneration"]
