"""``StreamStore``: append to and read from stream partitions (DESIGN.md §5 Stream).

Appends go through the shared ``GroupCommitBatcher``; offsets are assigned inside the flush
transaction (``index.append_entry``), so any broker may append to any partition.  Reads find
the chunk containing an offset with one reverse range read on the index and serve its bytes
from the page cache or one ranged GET per run of adjacent chunks.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from flowmq_commit.batcher import GroupCommit, GroupCommitBatcher
from flowmq_commit.flush_txn import RunCommit
from flowmq_commit.tasks import running_task
from flowmq_kas3 import index
from flowmq_kas3.errors import ChunkRefused, OffsetOutOfRange
from flowmq_kas3.index import ChunkEntry, Partition
from flowmq_kas3.page_cache import PageCache, RangeKey
from flowmq_kas3.reader import read_chunks
from flowmq_kas3.records import BASE_OFFSET, BatchesSummary, decode_batch, summarize
from flowmq_kas3.segment import assemble_fetch, batch_offsets
from flowmq_meta import MetaStore, Transaction, check_key, decode_int
from flowmq_objstore import ObjectNotFound, ObjectStore

# Kafka ListOffsets sentinels.
LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2

# Index entries looked at per fetch beyond the first; a fetch returns at most this many + 1
# chunks, which bounds the transaction however large max_bytes is.
DEFAULT_FETCH_LOOKAHEAD = 64
_SCAN_PAGE = 1000
# A fetch whose chunk vanished (retention + GC between index read and GET) re-plans.
_FETCH_ATTEMPTS = 3
# Chunks this broker committed to a partition while long polls waited on it, kept so that
# the polls they woke read them without asking the meta store (``fetch_committed``): the
# last few per partition, for a bounded number of partitions (their bytes stay in the page
# cache, which may evict them: the poll then reads the usual way).
_RECENT_PER_PARTITION = 4
_RECENT_PARTITIONS = 4096
# A long poll over at most this many partitions reads their high watermarks with
# ``MetaStore.read`` (on the loop's thread with SQLite: tens of microseconds); more go to
# ``transact``, so that one Fetch of hundreds of partitions never holds the loop for ms.
_LOOP_READ_PARTITIONS = 16


class FetchResult(NamedTuple):
    records: bytearray  # whole v2 batches, base offsets patched; empty at the HWM
    high_watermark: int
    log_start_offset: int


class PartitionInfo(NamedTuple):
    log_start_offset: int
    high_watermark: int
    size_bytes: int


def _hooked(chunks: list[tuple[int, int, Any]]) -> bool:
    """Whether a chunk of the run asks to be checked as it commits (``on_commit``)."""
    return any(on_commit is not None for _, _, (_, _, on_commit) in chunks)


class _PartitionCommit(GroupCommit):
    """All chunks a flush carries for one partition become ONE index entry (they are
    adjacent in the object); each producer gets the base offset of its own chunk."""

    def __init__(self, store: StreamStore) -> None:
        self._store = store

    def check(self, group: Partition) -> None:
        # Every key of a partition is at most as long as its index entry at the largest offset.
        check_key(index.entry_key(group, 2**63 - 1))

    def commit(
        self, tr: Transaction, group: Partition, object_key: str, chunks: list[tuple[int, int, Any]]
    ) -> tuple[list[Any], int]:
        if _hooked(chunks):
            return self._commit_checked(tr, group, object_key, chunks)
        return index.append_run(group, chunks, tr, object_key)

    def portable(self, group: Partition, chunks: list[tuple[int, int, Any]]) -> RunCommit | None:
        if _hooked(chunks):
            return None  # its hooks (idempotent producers) live in this process
        return functools.partial(index.append_run, group, chunks)

    @staticmethod
    def _commit_checked(
        tr: Transaction, group: Partition, object_key: str, chunks: list[tuple[int, int, Any]]
    ) -> tuple[list[Any], int]:
        """Chunks with hooks: each hook is asked, with the base offset its chunk would get,
        whether to append it; a refused chunk is left out (its result is the refusal) and
        the accepted ones around it become one index entry per adjacent stretch."""
        results: list[Any] = []
        entries = 0
        offset = index.read_hwm(tr, group)
        stretch: list[tuple[int, int, int, int]] = []  # (start, end, count, max_ts)

        def close_stretch() -> None:
            nonlocal entries
            if not stretch:
                return
            count = sum(c for _, _, c, _ in stretch)
            max_ts = max(ts for _, _, _, ts in stretch)
            index.append_entry(tr, group, object_key, stretch[0][0], stretch[-1][1], count, max_ts)
            entries += 1
            stretch.clear()

        for start, end, (count, ts, on_commit) in chunks:
            refused = on_commit(tr, offset) if on_commit is not None else None
            if refused is not None:
                results.append(refused)
                close_stretch()
                continue
            results.append(offset)
            stretch.append((start, end, count, ts))
            offset += count
        close_stretch()
        return results, entries

    def before_commit(
        self, group: Partition, object_key: str, start: int, end: int, data: bytes
    ) -> None:
        # Cached before the index can point at it: the commit is made off the loop, and a
        # Fetch on the loop that read the new index entry before ``after_commit`` ran read
        # the chunk back from the object store (a third of the Fetches at 10k msgs/s).
        self._store.page_cache.put((object_key, start, end), data, len(data))

    def after_commit(
        self,
        group: Partition,
        results: list[Any],
        object_key: str,
        start: int,
        end: int,
        data: bytes,
    ) -> None:
        self._store._committed(group, (object_key, start, end), results)


class StreamStore:
    def __init__(
        self,
        meta: MetaStore,
        objects: ObjectStore,
        batcher: GroupCommitBatcher,
        page_cache: PageCache | None = None,
        *,
        fetch_lookahead: int = DEFAULT_FETCH_LOOKAHEAD,
        watch_remote: bool = True,
    ) -> None:
        """``watch_remote``: long polls also watch the HWM key in the meta store, so appends
        by other brokers wake them (off: only this broker's appends do)."""
        self.meta = meta
        self.objects = objects
        self.batcher = batcher
        self.page_cache = page_cache if page_cache is not None else PageCache()
        self.fetch_lookahead = fetch_lookahead
        self.watch_remote = watch_remote
        self._waiters: dict[Partition, list[asyncio.Future[None]]] = {}
        self._commit = _PartitionCommit(self)
        # Commits of this broker so far, and per partition (base offset, chunk location,
        # commit number) of the last ones a long poll waited for; see ``fetch_committed``.
        self._commits = 0
        self._recent: dict[Partition, collections.deque[tuple[int, RangeKey, int]]] = {}

    # -- append ------------------------------------------------------------------------------

    def append_nowait(
        self,
        ns: str,
        stream: str,
        partition: int,
        records: bytes,
        *,
        on_commit: Callable[[Transaction, int], ChunkRefused | None] | None = None,
        summary: BatchesSummary | None = None,
    ) -> asyncio.Future[int]:
        """Submit one produced record set (one or more whole v2 batches) and return the
        future of its base offset, resolved once durable.  Raises ``InvalidRecordBatch``
        at once for malformed framing.  Lets an adapter submit every partition of a Produce
        request before awaiting any.  ``on_commit(tr, base_offset)`` runs inside the flush
        transaction that assigns the offsets (maybe more than once, if it retries), so state
        that must be exactly as durable as the records (an idempotent producer's sequence
        numbers) is written with them.  ``summary``: ``summarize(records)``, from a caller
        that has already walked the batches (the Kafka adapter checks their CRCs).  The
        hook may return a ``ChunkRefused`` instead of None: the chunk is then not appended
        and its future fails with that error (a retried idempotent batch another broker
        already wrote)."""
        if summary is None:
            summary = summarize(records)
        return self.batcher.submit(
            (ns, stream, partition),
            records,
            self._commit,
            (summary.offset_count, summary.max_timestamp, on_commit),
        )

    async def append(self, ns: str, stream: str, partition: int, records: bytes) -> int:
        """Append and wait until durable; returns the base offset assigned to the first
        batch (the following batches take the next offsets)."""
        return await self.append_nowait(ns, stream, partition, records)

    async def append_many(
        self, items: Sequence[tuple[str, str, int, bytes]], *, return_exceptions: bool = False
    ) -> list[Any]:
        """Append several record sets (any partitions) in the same flush where possible."""
        futures = []
        for ns, stream, partition, records in items:
            try:
                futures.append(self.append_nowait(ns, stream, partition, records))
            except Exception as exc:
                if not return_exceptions:
                    for f in futures:
                        f.add_done_callback(_consume)
                    raise
                futures.append(_failed(exc))
        return list(await asyncio.gather(*futures, return_exceptions=return_exceptions))

    def _committed(self, p: Partition, location: RangeKey, results: list[Any]) -> None:
        # (the chunk went into the page cache before the commit: ``before_commit``)
        self._commits += 1
        waiters = self._waiters.pop(p, None)
        if waiters or p in self._recent:
            self._remember(p, location, results)
        if waiters:
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)

    def _remember(self, p: Partition, location: RangeKey, results: list[Any]) -> None:
        """Keep a committed chunk for ``fetch_committed``, if it is one index entry whose base
        offset is its first result (a chunk refused by its hook splits the run: forget the
        partition's chunks then, as they no longer follow each other)."""
        if not all(type(r) is int for r in results):
            self._recent.pop(p, None)
            return
        recent = self._recent.get(p)
        if recent is None:
            if len(self._recent) >= _RECENT_PARTITIONS:
                self._recent.clear()
            recent = self._recent[p] = collections.deque(maxlen=_RECENT_PER_PARTITION)
        recent.append((results[0], location, self._commits))

    def commit_mark(self) -> int:
        """What ``fetch_committed`` takes as ``since``: the commits of this broker so far."""
        return self._commits

    def fetch_committed(
        self, ns: str, stream: str, partition: int, offset: int, max_bytes: int, since: int
    ) -> tuple[bytearray, int] | None:
        """A long poll's read without the meta store: whole batches from ``offset`` out of
        the chunks this broker committed to the partition after ``commit_mark()`` returned
        ``since``, if the first of them starts exactly at ``offset``, from the page cache;
        with the offset after the last of them (the high watermark as far as this broker
        knows: another broker's later appends are read the usual way by the next fetch).
        None when they do not hold ``offset`` (read with ``fetch``).

        ``offset`` must be the high watermark a meta read returned before ``since`` was
        taken: a chunk committed after that with its base offset at that high watermark is
        exactly what the partition holds there now, even if the stream was deleted and made
        again meanwhile (a chunk committed before ``since`` is never used)."""
        recent = self._recent.get((ns, stream, partition))
        if not recent:
            return None
        chunks: list[tuple[int, bytes | memoryview]] = []
        expected = offset
        for base, location, number in recent:
            if number <= since or base != expected:
                if chunks:
                    break
                continue
            data = self.page_cache.get(location)
            if data is None:
                break
            chunks.append((base, data))
            expected = base + summarize(data).offset_count
        if not chunks:
            return None
        return assemble_fetch(chunks, offset, max_bytes), expected

    # -- offsets -----------------------------------------------------------------------------

    async def partition_info(self, ns: str, stream: str, partition: int) -> PartitionInfo:
        p: Partition = (ns, stream, partition)

        def txn(tr: Transaction) -> PartitionInfo:
            hwm = index.read_hwm(tr, p)
            size = decode_int(tr.get(index.bytes_key(p)))
            return PartitionInfo(index.log_start(tr, p, hwm), hwm, size)

        return await self.meta.transact(txn)

    async def high_watermark(self, ns: str, stream: str, partition: int) -> int:
        p: Partition = (ns, stream, partition)
        return await self.meta.transact(lambda tr: index.read_hwm(tr, p))

    async def log_start_offset(self, ns: str, stream: str, partition: int) -> int:
        return (await self.partition_info(ns, stream, partition)).log_start_offset

    async def offset_for_timestamp(
        self, ns: str, stream: str, partition: int, timestamp: int
    ) -> tuple[int, int] | None:
        """Kafka ListOffsets: ``(offset, timestamp)`` of the earliest record whose timestamp
        is >= ``timestamp``, or None if there is none (Kafka answers offset -1).  The
        sentinels -1 (latest) and -2 (earliest) give ``(hwm, -1)`` and ``(log start, -1)``."""
        if timestamp in (LATEST_TIMESTAMP, EARLIEST_TIMESTAMP):
            info = await self.partition_info(ns, stream, partition)
            if timestamp == LATEST_TIMESTAMP:
                return info.high_watermark, -1
            return info.log_start_offset, -1
        p: Partition = (ns, stream, partition)
        cursor: int | None = None
        while True:
            # The max timestamps are not monotonic (producers set them), so scan in order
            # for the first chunk that reaches ``timestamp``, as Kafka's time index does.
            page = await self.meta.transact(
                lambda tr, c=cursor: index.first_entries(tr, p, _SCAN_PAGE, c)
            )
            for entry in page:
                if entry.max_timestamp >= timestamp:
                    found = await self._timestamp_in_chunk(entry, timestamp)
                    if found is not None:
                        return found
            if len(page) < _SCAN_PAGE:
                return None
            cursor = page[-1].next_offset

    async def _timestamp_in_chunk(
        self, entry: ChunkEntry, timestamp: int
    ) -> tuple[int, int] | None:
        ((_, data),) = await read_chunks(self.objects, self.page_cache, [entry])
        for offset, pos, size in batch_offsets(entry.base_offset, data):
            batch = bytearray(memoryview(data)[pos : pos + size])
            for record in decode_batch(_with_base(batch, offset)):
                if record.timestamp >= timestamp:
                    return record.offset, record.timestamp
        return None

    # -- fetch -------------------------------------------------------------------------------

    async def fetch(
        self, ns: str, stream: str, partition: int, offset: int, max_bytes: int
    ) -> FetchResult:
        """Whole batches from the one containing ``offset``, up to ``max_bytes`` (at least
        one batch if there is any).  Raises ``OffsetOutOfRange`` outside
        ``[log_start_offset, high_watermark]``; at the HWM returns no records."""
        p: Partition = (ns, stream, partition)
        with running_task():
            for attempt in range(_FETCH_ATTEMPTS):
                hwm, start, entries = await self.meta.read(
                    lambda tr: self._plan_fetch(tr, p, offset, max_bytes)
                )
                if not entries:
                    return FetchResult(bytearray(), hwm, start)
                try:
                    chunks = await read_chunks(self.objects, self.page_cache, entries)
                except ObjectNotFound:
                    if attempt == _FETCH_ATTEMPTS - 1:
                        raise
                    continue
                return FetchResult(assemble_fetch(chunks, offset, max_bytes), hwm, start)
        raise AssertionError("unreachable")

    def _plan_fetch(
        self, tr: Transaction, p: Partition, offset: int, max_bytes: int
    ) -> tuple[int, int, list[ChunkEntry]]:
        hwm = index.read_hwm(tr, p)
        start = index.log_start(tr, p, hwm)
        if offset < start or offset > hwm:
            raise OffsetOutOfRange(offset, start, hwm)
        if offset == hwm:
            return hwm, start, []
        first = index.entry_containing(tr, p, offset)
        if first is None:  # the index and HWM disagree: treat as retention racing us
            raise OffsetOutOfRange(offset, start, hwm)
        entries = [first]
        total = first.size
        if total < max_bytes and first.next_offset < hwm:
            for entry in index.first_entries(tr, p, self.fetch_lookahead, first.next_offset):
                if total >= max_bytes:
                    break
                entries.append(entry)
                total += entry.size
        return hwm, start, entries

    # -- long poll ---------------------------------------------------------------------------

    def waiting(self, ns: str, stream: str, partition: int) -> int:
        """Long polls of this broker now waiting on the partition (for metrics and tests)."""
        return len(self._waiters.get((ns, stream, partition), ()))

    async def wait_for_data(
        self, ns: str, stream: str, partition: int, offset: int, timeout: float
    ) -> bool:
        """Wait until the partition's HWM passes ``offset`` or ``timeout`` seconds pass;
        True if data arrived (or may have: wake-ups can be spurious, fetch to see)."""
        return await self.wait_for_any([(ns, stream, partition, offset)], timeout)

    async def wait_for_any(
        self, positions: Sequence[tuple[str, str, int, int]], timeout: float
    ) -> bool:
        """As ``wait_for_data`` for several partitions (a Fetch request): returns when any
        of them has data past its offset."""
        if not positions:
            return False
        loop = asyncio.get_running_loop()
        local: asyncio.Future[None] = loop.create_future()
        parts: list[tuple[Partition, int]] = [((ns, s, p), o) for ns, s, p, o in positions]
        # Registered before reading the HWMs, so an append committing in between still wakes.
        for p, _ in parts:
            self._waiters.setdefault(p, []).append(local)
        watch_tasks: list[asyncio.Future[Any]] = []
        watches: list[Any] = []
        try:

            def check(tr: Transaction) -> list[Any] | None:
                for p, o in parts:
                    if index.read_hwm(tr, p) > o:
                        return None
                if not self.watch_remote:
                    return []
                return [tr.watch(index.hwm_key(p)) for p, _ in parts]

            if len(parts) <= _LOOP_READ_PARTITIONS:
                found = await self.meta.read(check)
            else:
                found = await self.meta.transact(check)
            if found is None:
                return True
            watches = found
            watch_tasks = [asyncio.ensure_future(w) for w in watches]
            for task in watch_tasks:
                task.add_done_callback(lambda _, local=local: _wake(local))
            # One future to await, not ``asyncio.wait`` over all: a commit's wake-up reaches
            # the fetch in one loop turn instead of two.
            try:
                async with asyncio.timeout(timeout):
                    await local
            except TimeoutError:
                return False
            return True
        finally:
            for p, _ in parts:
                waiters = self._waiters.get(p)
                if waiters is not None:
                    with contextlib.suppress(ValueError):
                        waiters.remove(local)
                    if not waiters:
                        del self._waiters[p]
            if not local.done():
                local.cancel()
            # Cancelled, not awaited: they end in the next loop turns while the woken fetch
            # is already answering (awaiting them cost it one or two turns of a busy loop).
            for w in watches:
                w.cancel()
            for t in watch_tasks:
                t.cancel()


def _with_base(batch: bytearray, offset: int) -> bytearray:
    BASE_OFFSET.pack_into(batch, 0, offset)
    return batch


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _failed(exc: BaseException) -> asyncio.Future[Any]:
    fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    fut.set_exception(exc)
    return fut


def _consume(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()
