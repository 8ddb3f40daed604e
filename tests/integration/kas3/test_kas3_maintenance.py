"""Retention, compaction and object GC — and the crash-safety invariant: whatever step a
crash interrupts, no object is left that is neither referenced nor listed for deletion, and
no index entry points at a missing object."""

from __future__ import annotations

import asyncio
import collections
from pathlib import Path

import pytest

from flowmq_commit import GroupCommitBatcher, MaintenanceOptions, collect_garbage
from flowmq_commit.refs import ABANDON_GRACE_MS, decode_listing
from flowmq_kas3 import (
    OffsetOutOfRange,
    PageCache,
    RetentionPolicy,
    StreamStore,
    apply_retention,
    compact_partition,
    decode_batches,
    delete_partition,
)
from flowmq_kas3.index import decode_entry
from flowmq_meta import MetaStore, decode_int, open_meta_store
from flowmq_meta.keys import OBJECT_REFS, OBJECTS_TO_DELETE, STREAM_INDEX
from flowmq_objstore import ObjectStore, open_object_store

from .conftest import make_batch

pytestmark = pytest.mark.timeout(60)

NS, STREAM = "default", "events"
T0 = 1_700_000_000_000
GRACE = 1_000


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


class Stack:
    """One broker's KaS3 objects on shared stores."""

    def __init__(self, meta_url: str, objects_url: str, clock: Clock, faults=None) -> None:
        self.meta = open_meta_store(meta_url)
        self.objects = open_object_store(objects_url)
        self.maintenance = MaintenanceOptions(clock, GRACE, faults)
        # Unreferenced objects may go at the next GC pass.
        self.no_grace = MaintenanceOptions(clock, 0, faults)
        self.batcher = GroupCommitBatcher(
            self.meta,
            self.objects,
            node_id="n1",
            size_threshold=1 << 30,
            flush_interval=3600,
            min_flush_gap=None,
            clock=clock,
            faults=faults,
        )
        self.store = StreamStore(self.meta, self.objects, self.batcher, PageCache())

    async def append_flush(self, batches: list[tuple[int, bytes]]) -> list[int]:
        """Append several partitions' batches as one flush."""
        futures = [self.store.append_nowait(NS, STREAM, p, b) for p, b in batches]
        await self.batcher.flush()
        return [f.result() for f in futures]

    async def retention(self, policy: RetentionPolicy) -> None:
        for p in range(3):
            await apply_retention(self.meta, (NS, STREAM, p), policy, self.maintenance)

    async def compact(self, partition: int) -> None:
        await compact_partition(
            self.meta, self.objects, (NS, STREAM, partition), self.maintenance, node_id="n1"
        )

    async def gc(self) -> None:
        await collect_garbage(self.meta, self.objects, self.maintenance)

    async def close(self) -> None:
        await self.batcher.close()
        await self.objects.close()
        await self.meta.close()

    async def abandon(self) -> None:
        """What survives a crash is what is in the stores: drop the process state."""
        task = self.batcher._task
        if task is not None and not task.done():
            task.cancel()
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)
        await self.objects.close()
        await self.meta.close()


async def check_invariants(meta: MetaStore, objects: ObjectStore) -> tuple[set[str], set[str]]:
    """Returns (referenced, listed) object keys after asserting the invariants."""

    def read(tr):
        return (
            tr.get_range(*STREAM_INDEX.range()),
            tr.get_range(*OBJECT_REFS.range()),
            tr.get_range(*OBJECTS_TO_DELETE.range()),
        )

    index_rows, ref_rows, listed_rows = await meta.transact(read)
    stored = set(await objects.list())
    entries = [decode_entry(k, v) for k, v in index_rows]
    refs = {OBJECT_REFS.unpack(k)[0]: decode_int(v) for k, v in ref_rows}
    listed = {OBJECTS_TO_DELETE.unpack(k)[0]: decode_listing(v) for k, v in listed_rows}
    pointed = collections.Counter(e.object_key for e in entries)
    for obj in stored:
        assert refs.get(obj, 0) > 0 or obj in listed, f"orphan object {obj}"
    for e in entries:
        assert e.object_key in stored, f"index entry {e} points at a missing object"
    assert dict(pointed) == {k: v for k, v in refs.items() if v > 0}, "reference counts drift"
    for obj in listed:
        assert refs.get(obj, 0) == 0, f"{obj} listed for deletion while referenced"
    return set(refs), set(listed)


async def read_partition(store: StreamStore, p: int) -> list[tuple[int, bytes]]:
    out = []
    start = await store.log_start_offset(NS, STREAM, p)
    offset = start
    while True:
        result = await store.fetch(NS, STREAM, p, offset, 1 << 20)
        if not result.records:
            return out
        records = [r for r in decode_batches(result.records) if r.offset >= offset]
        out.extend((r.offset, r.value) for r in records)
        offset = records[-1].offset + 1


@pytest.fixture
def urls(tmp_path: Path) -> tuple[str, str]:
    return f"sqlite:///{tmp_path / 'meta.db'}", (tmp_path / "objects").as_uri()


async def test_retention_by_time_removes_data_and_then_its_objects(urls) -> None:
    clock = Clock()
    s = Stack(*urls, clock)
    for i in range(4):  # 4 flushes = 4 objects, each holding a chunk of every partition
        clock.now = T0 + i * 1000
        await s.append_flush(
            [(p, make_batch([f"{p}-{i}".encode()], timestamp=clock.now)) for p in range(3)]
        )
    assert len(await s.objects.list()) == 4
    clock.now = T0 + 10_000
    await s.retention(RetentionPolicy(retention_ms=8_500))  # the chunks of flushes 0 and 1
    for p in range(3):
        assert await s.store.log_start_offset(NS, STREAM, p) == 2
        assert [v for _, v in await read_partition(s.store, p)] == [
            f"{p}-2".encode(),
            f"{p}-3".encode(),
        ]
        with pytest.raises(OffsetOutOfRange):
            await s.store.fetch(NS, STREAM, p, 1, 1000)
    await check_invariants(s.meta, s.objects)
    await s.gc()  # within the grace period: kept, for fetches already under way
    assert len(await s.objects.list()) == 4
    clock.now += GRACE
    await s.gc()
    assert len(await s.objects.list()) == 2
    referenced, listed = await check_invariants(s.meta, s.objects)
    assert set(await s.objects.list()) == referenced
    await s.close()


async def test_retention_by_bytes(urls) -> None:
    clock = Clock()
    s = Stack(*urls, clock)
    sizes = []
    for i in range(6):
        batch = make_batch([f"r{i}".encode() * 50])
        sizes.append(len(batch))
        await s.append_flush([(0, batch), (1, make_batch([b"other"]))])
    limit = sum(sizes[-2:])  # keep the last two chunks only
    result = await apply_retention(
        s.meta, (NS, STREAM, 0), RetentionPolicy(retention_bytes=limit), s.no_grace
    )
    assert result.chunks_removed == 4 and result.log_start_offset == 4
    info = await s.store.partition_info(NS, STREAM, 0)
    assert info.size_bytes == limit and info.high_watermark == 6
    assert [o for o, _ in await read_partition(s.store, 0)] == [4, 5]
    # partition 1 still references every object: nothing may go
    await s.gc()
    assert len(await s.objects.list()) == 6
    await apply_retention(s.meta, (NS, STREAM, 1), RetentionPolicy(retention_bytes=1), s.no_grace)
    await s.gc()
    assert len(await s.objects.list()) == 2  # only the objects with partition 0's last chunks
    await check_invariants(s.meta, s.objects)
    # new appends continue after the HWM
    assert (await s.append_flush([(0, make_batch([b"new"]))])) == [6]
    await s.close()


async def test_retention_pages_through_many_chunks(urls) -> None:
    clock = Clock()
    s = Stack(*urls, clock)
    for i in range(30):  # one chunk per flush
        await s.append_flush([(0, make_batch([f"{i}".encode()], timestamp=T0))])
    clock.now = T0 + 10_000
    result = await apply_retention(
        s.meta, (NS, STREAM, 0), RetentionPolicy(retention_ms=1), s.no_grace, page=7
    )
    assert result.chunks_removed == 30 and result.log_start_offset == 30
    await s.gc()
    assert await s.objects.list() == []
    await check_invariants(s.meta, s.objects)
    await s.close()


async def test_compaction_keeps_every_record_readable_at_the_same_offsets(urls) -> None:
    clock = Clock()
    s = Stack(*urls, clock)
    for i in range(12):
        await s.append_flush(
            [(p, make_batch([f"{p}-{i}-{j}".encode() for j in range(i % 3 + 1)])) for p in range(3)]
        )
    before = {p: await read_partition(s.store, p) for p in range(3)}
    entries_before = len(
        await s.meta.transact(lambda tr: tr.get_range(*STREAM_INDEX.range(NS, STREAM, 0)))
    )
    await s.compact(0)
    entries_after = len(
        await s.meta.transact(lambda tr: tr.get_range(*STREAM_INDEX.range(NS, STREAM, 0)))
    )
    assert entries_before == 12 and entries_after == 1
    s.store.page_cache.clear()
    for p in range(3):
        assert await read_partition(s.store, p) == before[p]
    # fetching from inside the merged chunk starts at the batch holding the offset
    # (batch sizes 1, 2, 3, 1, 2, ...: offset 8 is the second record of the batch at 7)
    result = await s.store.fetch(NS, STREAM, 0, 8, 1 << 20)
    assert decode_batches(result.records)[0].offset == 7
    assert await s.store.offset_for_timestamp(NS, STREAM, 0, 0) == (0, 1_000)
    # the old objects are still referenced by partitions 1 and 2
    clock.now += GRACE
    await s.gc()
    assert len(await s.objects.list()) == 13
    await s.compact(1)
    await s.compact(2)
    clock.now += GRACE
    await s.gc()
    assert len(await s.objects.list()) == 3  # one compacted object per partition
    for p in range(3):
        assert await read_partition(s.store, p) == before[p]
    await check_invariants(s.meta, s.objects)
    await s.close()


async def test_compaction_gives_up_when_retention_changed_the_run(urls) -> None:
    clock = Clock()
    s = Stack(*urls, clock)
    for i in range(4):
        await s.append_flush([(0, make_batch([f"{i}".encode()], timestamp=T0 + i))])

    # retention runs between the compactor's read and its swap
    original_put = s.objects.put

    async def put_then_retention(key: str, data: bytes) -> None:
        await original_put(key, data)
        if key.startswith("compacted/"):
            await apply_retention(
                s.meta, (NS, STREAM, 0), RetentionPolicy(retention_bytes=1), s.no_grace
            )

    s.objects.put = put_then_retention  # type: ignore[method-assign]
    result = await compact_partition(s.meta, s.objects, (NS, STREAM, 0), s.no_grace)
    assert result.conflicts == 1 and result.runs == 0
    clock.now += ABANDON_GRACE_MS
    await s.gc()
    await check_invariants(s.meta, s.objects)
    [left] = await s.objects.list()  # the last chunk's object; the compacted one is gone
    assert left.startswith("segments/")
    await s.close()


async def test_delete_partition(urls) -> None:
    clock = Clock()
    s = Stack(*urls, clock)
    await s.append_flush([(0, make_batch([b"a"])), (1, make_batch([b"b"]))])
    assert await delete_partition(s.meta, (NS, STREAM, 0), s.no_grace) == 1
    assert await s.store.high_watermark(NS, STREAM, 0) == 0
    await s.gc()
    assert len(await s.objects.list()) == 1  # still holds partition 1
    await check_invariants(s.meta, s.objects)
    await s.close()


CRASH_POINTS = [
    "flush.before_put",
    "flush.after_put",
    "flush.after_commit",
    "retention.after_commit",
    "compaction.after_intent",
    "compaction.after_put",
    "compaction.after_swap",
    "gc.after_claim",
    "gc.after_delete",
    "gc.after_clear",
]


class SimulatedCrash(BaseException):
    """Not an Exception: no cleanup handler of the code under test may run, as in a kill."""


@pytest.mark.parametrize("point", CRASH_POINTS)
async def test_crash_at_any_step_leaves_no_orphan_and_no_dangling_entry(urls, point: str) -> None:
    clock = Clock()
    crashed = asyncio.get_running_loop().create_future()
    seen = collections.Counter()

    def faults(at: str) -> None:
        seen[at] += 1
        # crash on the third flush, so there is committed data around the crash
        if at == point and (not at.startswith("flush.") or seen[at] == 3):
            if not crashed.done():
                crashed.set_result(at)
            raise SimulatedCrash(at)

    acked: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(3)}

    async def workload(s: Stack) -> None:
        for i in range(5):
            clock.now = T0 + i * 1000
            batches = [
                (p, make_batch([f"{p}-{i}".encode()], timestamp=clock.now)) for p in range(3)
            ]
            for (p, _), base in zip(batches, await s.append_flush(batches), strict=True):
                acked[p].append((base, f"{p}-{i}".encode()))
        clock.now = T0 + 10_000
        await s.retention(RetentionPolicy(retention_ms=8_500))  # flushes 0 and 1
        await s.compact(0)
        clock.now += GRACE
        await s.gc()

    s = Stack(*urls, clock, faults)
    await s.batcher.start()
    run = asyncio.ensure_future(workload(s))
    await asyncio.wait([run, crashed], return_when=asyncio.FIRST_COMPLETED)
    assert crashed.done(), f"the workload never reached {point}"
    run.cancel()
    await asyncio.gather(run, return_exceptions=True)
    await s.abandon()

    # right after the crash, from what is durable
    recovered = Stack(*urls, clock)
    await check_invariants(recovered.meta, recovered.objects)

    # recovery: GC after every lease has run out, then the maintenance again
    clock.now += recovered.batcher.intent_lease_ms + GRACE
    await recovered.gc()
    referenced, _ = await check_invariants(recovered.meta, recovered.objects)
    assert set(await recovered.objects.list()) == referenced  # everything left is in use
    clock.now = T0 + 10_000 + recovered.batcher.intent_lease_ms + GRACE
    await recovered.retention(
        RetentionPolicy(retention_ms=recovered.batcher.intent_lease_ms + GRACE + 8_500)
    )
    await recovered.compact(0)
    clock.now += GRACE
    await recovered.gc()
    referenced, _ = await check_invariants(recovered.meta, recovered.objects)
    assert set(await recovered.objects.list()) == referenced

    # every acknowledged record still at or after the log start is readable at its offset
    for p in range(3):
        got = dict(await read_partition(recovered.store, p))
        start = await recovered.store.log_start_offset(NS, STREAM, p)
        for offset, value in acked[p]:
            if offset >= start:
                assert got.get(offset) == value, (p, offset)
        assert sorted(got) == list(range(start, start + len(got)))
    await recovered.close()
