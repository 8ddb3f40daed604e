"""StreamStore on a real SQLite meta store and file object store (and S3 for the main path):
offsets, fetch, timestamps, long polls, restart."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from flowmq_commit import GroupCommitBatcher
from flowmq_kas3 import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    TOPIC_HEADER,
    InvalidRecordBatch,
    OffsetOutOfRange,
    PageCache,
    StreamStore,
    build_batch,
    decode_batches,
    encode_messages,
)
from flowmq_kas3.errors import ChunkRefused
from flowmq_kas3.records import CODEC_LZ4, CODEC_ZSTD
from flowmq_meta import open_meta_store
from flowmq_objstore import open_object_store

from .conftest import CountingMetaStore, CountingObjectStore, make_batch

pytestmark = pytest.mark.timeout(60)

NS, STREAM = "default", "orders"


async def read_all(store: StreamStore, partition: int, start: int = 0, max_bytes: int = 1 << 16):
    """Every record from ``start`` to the HWM as (offset, value), fetching like a consumer:
    from the next offset after the last record seen, skipping records below it."""
    out: list[tuple[int, bytes]] = []
    offset = start
    while True:
        result = await store.fetch(NS, STREAM, partition, offset, max_bytes)
        if not result.records:
            return out
        records = [r for r in decode_batches(result.records) if r.offset >= offset]
        out.extend((r.offset, r.value) for r in records)
        offset = records[-1].offset + 1


@pytest.mark.parametrize("object_url", ["file", "s3"], indirect=True)
async def test_append_then_fetch_returns_exactly_the_records_in_order(
    stream_store: StreamStore, objects: CountingObjectStore
) -> None:
    expected: dict[int, list[bytes]] = {0: [], 1: []}
    for i in range(20):
        p = i % 2
        values = [f"p{p}-r{i}-{j}".encode() for j in range(1 + i % 4)]
        base = await stream_store.append(NS, STREAM, p, make_batch(values))
        assert base == len(expected[p])
        expected[p].extend(values)
    for p in (0, 1):
        got = await read_all(stream_store, p)
        assert [v for _, v in got] == expected[p]
        assert [o for o, _ in got] == list(range(len(expected[p])))
    # the same, served by GETs instead of the write-through cache
    stream_store.page_cache.clear()
    gets = objects.gets
    got = await read_all(stream_store, 1)
    assert [v for _, v in got] == expected[1]
    assert objects.gets > gets


async def test_concurrent_appends_to_many_partitions_get_contiguous_offsets(
    stream_store: StreamStore, batcher: GroupCommitBatcher, objects: CountingObjectStore
) -> None:
    partitions, producers, per_producer = 12, 24, 15
    acked: dict[int, list[tuple[int, list[bytes]]]] = {p: [] for p in range(partitions)}
    puts = objects.puts

    async def producer(n: int) -> None:
        rng = random.Random(n)
        for i in range(per_producer):
            p = rng.randrange(partitions)
            values = [f"{n}-{i}-{j}".encode() for j in range(rng.randint(1, 5))]
            base = await stream_store.append(NS, STREAM, p, make_batch(values))
            acked[p].append((base, values))

    await asyncio.gather(*(producer(n) for n in range(producers)))
    assert objects.puts - puts == batcher.stats.flushes
    for p in range(partitions):
        chunks = sorted(acked[p])
        offset = 0
        expected = []
        for base, values in chunks:
            assert base == offset  # dense: no gaps, no overlaps
            offset += len(values)
            expected.extend(values)
        assert await stream_store.high_watermark(NS, STREAM, p) == offset
        assert [v for _, v in await read_all(stream_store, p)] == expected


async def test_one_index_entry_per_partition_per_flush(
    stream_store: StreamStore, batcher: GroupCommitBatcher, meta: CountingMetaStore
) -> None:
    from flowmq_meta.keys import STREAM_INDEX

    bases = await stream_store.append_many(
        [(NS, STREAM, i % 3, make_batch([f"{i}".encode()] * (i + 1))) for i in range(30)]
    )
    assert batcher.stats.flushes == 1
    rows = await meta.inner.transact(lambda tr: tr.get_range(*STREAM_INDEX.range(NS, STREAM)))
    assert len(rows) == 3
    for p in range(3):  # every producer still got the base offset of its own batch
        sizes = [i + 1 for i in range(30) if i % 3 == p]
        assert [bases[i] for i in range(30) if i % 3 == p] == [sum(sizes[:k]) for k in range(10)]
        records = await read_all(stream_store, p)
        assert [v for _, v in records] == [
            f"{i}".encode() for i in range(30) if i % 3 == p for _ in range(i + 1)
        ]


async def test_per_producer_order_is_kept(stream_store: StreamStore) -> None:
    """A producer that pipelines appends (submits before the previous is acknowledged) sees
    them committed in submission order."""
    futures = [
        stream_store.append_nowait(NS, STREAM, 0, make_batch([f"m{i}".encode()])) for i in range(50)
    ]
    bases = await asyncio.gather(*futures)
    assert bases == list(range(50))


async def test_fetch_across_chunk_boundaries_and_max_bytes(stream_store: StreamStore) -> None:
    batches = [make_batch([f"b{i}-{j}".encode() * 20 for j in range(4)]) for i in range(10)]
    for b in batches:  # one chunk per flush, several chunks per flush for the last ones
        await stream_store.append(NS, STREAM, 0, b)
    await stream_store.append_many([(NS, STREAM, 0, make_batch([b"x", b"y"])) for _ in range(3)])
    size = len(batches[0])

    # from the middle of chunk 2: starts at that batch, whole batches only
    result = await stream_store.fetch(NS, STREAM, 0, 9, 3 * size)
    records = decode_batches(result.records)
    assert records[0].offset == 8 and records[-1].offset == 19
    assert len(result.records) == 3 * size
    assert result.high_watermark == 46 and result.log_start_offset == 0

    # max_bytes smaller than one batch still returns that whole batch
    result = await stream_store.fetch(NS, STREAM, 0, 5, 10)
    assert [r.offset for r in decode_batches(result.records)] == [4, 5, 6, 7]

    # the tail, crossing into the small chunks of one flush
    result = await stream_store.fetch(NS, STREAM, 0, 39, 1 << 20)
    assert [r.offset for r in decode_batches(result.records)] == list(range(36, 46))

    # at the HWM: nothing, no error
    result = await stream_store.fetch(NS, STREAM, 0, 46, 1 << 20)
    assert result.records == b"" and result.high_watermark == 46


async def test_offset_out_of_range(stream_store: StreamStore) -> None:
    with pytest.raises(OffsetOutOfRange):
        await stream_store.fetch(NS, STREAM, 0, 1, 1000)
    await stream_store.append(NS, STREAM, 0, make_batch([b"a", b"b"]))
    with pytest.raises(OffsetOutOfRange) as info:
        await stream_store.fetch(NS, STREAM, 0, 3, 1000)
    assert (info.value.log_start_offset, info.value.high_watermark) == (0, 2)
    with pytest.raises(OffsetOutOfRange):
        await stream_store.fetch(NS, STREAM, 0, -1, 1000)


async def test_invalid_batches_are_rejected_before_anything_is_written(
    stream_store: StreamStore, objects: CountingObjectStore
) -> None:
    good = make_batch([b"ok"])
    for bad in (b"", b"garbage", good[:-1], good + b"\x00" * 5):
        with pytest.raises(InvalidRecordBatch):
            await stream_store.append(NS, STREAM, 0, bad)
    assert await stream_store.high_watermark(NS, STREAM, 0) == 0


async def test_offset_for_timestamp(stream_store: StreamStore) -> None:
    # timestamps within a batch and across chunks, not monotonic across chunks
    await stream_store.append(
        NS, STREAM, 0, build_batch([(None, b"a", [], 100), (None, b"b", [], 200)])
    )
    await stream_store.append(
        NS, STREAM, 0, build_batch([(None, b"c", [], 150), (None, b"d", [], 300)])
    )
    await stream_store.append(
        NS, STREAM, 0, build_batch([(None, b"e", [], 400)], compression=CODEC_ZSTD)
    )
    find = stream_store.offset_for_timestamp
    assert await find(NS, STREAM, 0, 50) == (0, 100)
    assert await find(NS, STREAM, 0, 150) == (1, 200)
    assert await find(NS, STREAM, 0, 250) == (3, 300)
    assert await find(NS, STREAM, 0, 301) == (4, 400)
    assert await find(NS, STREAM, 0, 401) is None
    assert await find(NS, STREAM, 0, LATEST_TIMESTAMP) == (5, -1)
    assert await find(NS, STREAM, 0, EARLIEST_TIMESTAMP) == (0, -1)


async def test_compressed_batches_are_stored_and_fetched_intact(stream_store: StreamStore) -> None:
    batch = build_batch(
        [(b"k", b"v" * 500, [("h", b"1")], 5) for _ in range(10)], compression=CODEC_LZ4
    )
    await stream_store.append(NS, STREAM, 0, make_batch([b"first"]))
    await stream_store.append(NS, STREAM, 0, batch)
    result = await stream_store.fetch(NS, STREAM, 0, 1, 1 << 20)
    assert bytes(result.records[8:]) == batch[8:]  # only the base offset differs
    records = decode_batches(result.records)
    assert [r.offset for r in records] == list(range(1, 11))
    assert records[0].value == b"v" * 500 and records[0].headers == [("h", b"1")]


async def test_messages_from_mqtt_carry_topic_and_user_properties(
    stream_store: StreamStore,
) -> None:
    from flowmq_core.message import Message

    msgs = [
        Message("sensors/dev-1/telemetry", b"21.5", headers=[("unit", b"C"), ("unit", b"K")]),
        Message("sensors/dev-2/telemetry", b"19.0", key=b"dev-2"),
    ]
    await stream_store.append(NS, STREAM, 0, encode_messages(msgs))
    records = decode_batches((await stream_store.fetch(NS, STREAM, 0, 0, 1 << 20)).records)
    assert records[0].headers == [
        (TOPIC_HEADER, b"sensors/dev-1/telemetry"),
        ("unit", b"C"),
        ("unit", b"K"),
    ]
    assert records[0].value == b"21.5" and records[0].timestamp == msgs[0].timestamp_ms
    assert records[1].key == b"dev-2"
    assert records[1].headers == [(TOPIC_HEADER, b"sensors/dev-2/telemetry")]


async def test_long_poll_wakes_on_append(stream_store: StreamStore) -> None:
    waiter = asyncio.ensure_future(stream_store.wait_for_data(NS, STREAM, 3, 0, timeout=30))
    started = time.monotonic()
    await stream_store.append(NS, STREAM, 3, make_batch([b"wake"]))
    assert await waiter is True
    assert time.monotonic() - started < 5
    assert stream_store.waiting(NS, STREAM, 3) == 0
    # data already there: returns at once; nothing new: times out
    assert await stream_store.wait_for_data(NS, STREAM, 3, 0, timeout=30) is True
    assert await stream_store.wait_for_data(NS, STREAM, 3, 1, timeout=0.05) is False


async def test_long_poll_on_any_of_several_partitions(stream_store: StreamStore) -> None:
    waiter = asyncio.ensure_future(
        stream_store.wait_for_any([(NS, STREAM, 0, 0), (NS, STREAM, 1, 0)], timeout=30)
    )
    await stream_store.append(NS, STREAM, 1, make_batch([b"x"]))
    assert await waiter is True
    assert stream_store.waiting(NS, STREAM, 0) == 0


async def test_a_woken_long_poll_reads_what_was_committed_without_the_meta_store(
    stream_store: StreamStore, meta: CountingMetaStore
) -> None:
    await stream_store.append(NS, STREAM, 0, make_batch([b"old"]))
    mark = stream_store.commit_mark()
    waiter = asyncio.ensure_future(stream_store.wait_for_data(NS, STREAM, 0, 1, timeout=30))
    await stream_store.append(NS, STREAM, 0, make_batch([b"new-1", b"new-2"]))
    assert await waiter is True
    transactions = meta.transactions
    records, hwm = stream_store.fetch_committed(NS, STREAM, 0, 1, 1 << 20, mark)
    assert meta.transactions == transactions
    assert hwm == 3
    assert [(r.offset, r.value) for r in decode_batches(records)] == [(1, b"new-1"), (2, b"new-2")]
    # Only chunks committed after the mark, starting exactly at the offset asked for.
    assert (
        stream_store.fetch_committed(NS, STREAM, 0, 1, 1 << 20, stream_store.commit_mark()) is None
    )
    assert stream_store.fetch_committed(NS, STREAM, 0, 0, 1 << 20, 0) is None
    assert stream_store.fetch_committed(NS, STREAM, 1, 1, 1 << 20, mark) is None


async def test_woken_reads_stop_where_another_broker_appended(
    tmp_path: Path, meta_url: str
) -> None:
    """Chunks this broker committed that do not follow each other (another broker appended
    between them) are not served as one run: the woken read ends at the gap."""
    async with two_brokers(tmp_path, meta_url, flush_interval=0.002) as (a, b):
        mark = b.commit_mark()
        waiter = asyncio.ensure_future(b.wait_for_data(NS, STREAM, 0, 0, timeout=30))
        await b.append(NS, STREAM, 0, make_batch([b"b-1"]))
        assert await waiter is True
        await a.append(NS, STREAM, 0, make_batch([b"a-1"]))
        await b.append(NS, STREAM, 0, make_batch([b"b-2"]))
        records, hwm = b.fetch_committed(NS, STREAM, 0, 0, 1 << 20, mark)
        assert hwm == 1
        assert [(r.offset, r.value) for r in decode_batches(records)] == [(0, b"b-1")]
        records, hwm = b.fetch_committed(NS, STREAM, 0, 2, 1 << 20, mark)
        assert (hwm, [r.value for r in decode_batches(records)]) == (3, [b"b-2"])
        assert [v for _, v in await read_all(b, 0)] == [b"b-1", b"a-1", b"b-2"]


@contextlib.asynccontextmanager
async def two_brokers(
    tmp_path: Path, meta_url: str, *, flush_interval: float
) -> AsyncIterator[tuple[StreamStore, StreamStore]]:
    """The stream stores of brokers "a" and "b", each with its own meta connection, object
    store and batcher, on one SQLite file and object directory."""
    objects_url = (tmp_path / "objects").as_uri()
    stacks = []
    for node in ("a", "b"):
        meta = open_meta_store(meta_url)
        objects = open_object_store(objects_url)
        batcher = GroupCommitBatcher(meta, objects, node_id=node, flush_interval=flush_interval)
        stacks.append((meta, objects, batcher, StreamStore(meta, objects, batcher)))
    try:
        yield stacks[0][3], stacks[1][3]
    finally:
        for meta, objects, batcher, _ in stacks:
            await batcher.close()
            await objects.close()
            await meta.close()


async def test_long_poll_wakes_on_append_by_another_broker(tmp_path: Path, meta_url: str) -> None:
    """Two brokers (own meta connection, batcher, store) on one SQLite file and object dir:
    an append on A wakes a long poll on B through the meta store watch."""
    async with two_brokers(tmp_path, meta_url, flush_interval=0.002) as (a, b):
        waiter = asyncio.ensure_future(b.wait_for_data(NS, STREAM, 0, 0, timeout=30))
        while not b.waiting(NS, STREAM, 0):
            await asyncio.sleep(0)
        started = time.monotonic()
        await a.append(NS, STREAM, 0, make_batch([b"remote"]))
        assert await waiter is True
        assert time.monotonic() - started < 5
        records = decode_batches((await b.fetch(NS, STREAM, 0, 0, 1000)).records)
        assert [r.value for r in records] == [b"remote"]


async def test_two_brokers_appending_to_the_same_partitions(tmp_path: Path, meta_url: str) -> None:
    """No partition leaders: both brokers append to every partition; offsets stay dense
    because each flush transaction reads and bumps the HWM (conflicts retry)."""
    acked: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(3)}

    async def producer(store: StreamStore, name: str) -> None:
        for i in range(40):
            value = f"{name}-{i}".encode()
            base = await store.append(NS, STREAM, i % 3, make_batch([value]))
            acked[i % 3].append((base, value))

    async with two_brokers(tmp_path, meta_url, flush_interval=0.001) as stores:
        await asyncio.gather(
            *(
                producer(store, f"{node}{k}")
                for store, node in zip(stores, "ab", strict=True)
                for k in range(4)
            )
        )
        for p in range(3):
            assert sorted(o for o, _ in acked[p]) == list(range(len(acked[p])))
            got = await read_all(stores[0], p)
            assert got == sorted(acked[p])


async def test_restart_keeps_every_acknowledged_record(tmp_path: Path, meta_url: str) -> None:
    objects_url = (tmp_path / "objects").as_uri()

    async def open_stack() -> tuple:
        meta = open_meta_store(meta_url)
        objects = open_object_store(objects_url)
        batcher = GroupCommitBatcher(meta, objects, node_id="n1", flush_interval=0.002)
        return meta, objects, batcher, StreamStore(meta, objects, batcher, PageCache())

    meta, objects, batcher, store = await open_stack()
    expected: dict[int, list[bytes]] = {p: [] for p in range(4)}
    for i in range(40):
        p = i % 4
        values = [f"{p}-{i}-{j}".encode() for j in range(3)]
        await store.append(NS, STREAM, p, make_batch(values))
        expected[p].extend(values)
    await batcher.close()
    await objects.close()
    await meta.close()

    meta, objects, batcher, store = await open_stack()
    for p in range(4):
        assert await store.high_watermark(NS, STREAM, p) == len(expected[p])
        assert [v for _, v in await read_all(store, p)] == expected[p]
    assert await store.append(NS, STREAM, 0, make_batch([b"after"])) == len(expected[0])
    await batcher.close()
    await objects.close()
    await meta.close()


async def test_append_many_reports_per_item_errors(stream_store: StreamStore) -> None:
    results = await stream_store.append_many(
        [
            (NS, STREAM, 0, make_batch([b"a"])),
            (NS, STREAM, 1, b"bad"),
            (NS, STREAM, 0, make_batch([b"b"])),
        ],
        return_exceptions=True,
    )
    assert results[0] == 0 and results[2] == 1
    assert isinstance(results[1], InvalidRecordBatch)


async def test_fetch_counts_page_cache_hits_and_misses(
    stream_store: StreamStore, meta: CountingMetaStore
) -> None:
    from flowmq_metrics import kas3_page_cache_hit_count, kas3_page_cache_miss_count

    await stream_store.append(NS, STREAM, 0, make_batch([b"cached"]))
    hits, misses = kas3_page_cache_hit_count.value(), kas3_page_cache_miss_count.value()
    await stream_store.fetch(NS, STREAM, 0, 0, 1000)  # write-through: a hit
    stream_store.page_cache.clear()
    await stream_store.fetch(NS, STREAM, 0, 0, 1000)  # a miss, then cached
    await stream_store.fetch(NS, STREAM, 0, 0, 1000)
    assert kas3_page_cache_hit_count.value() - hits == 2
    assert kas3_page_cache_miss_count.value() - misses == 1


async def test_a_chunk_its_hook_refuses_is_left_out_of_the_flush(
    stream_store: StreamStore, meta: CountingMetaStore
) -> None:
    """An ``on_commit`` hook that returns ``ChunkRefused`` (a retried idempotent batch found
    in the flush transaction) fails its own chunk only: nothing of it is indexed, and the
    chunks around it in the same flush keep dense offsets, each hook told its own."""
    seen: list[tuple[bytes, int]] = []

    def hook(value: bytes, refuse: bool):
        def on_commit(tr, base: int) -> ChunkRefused | None:
            seen.append((value, base))
            return ChunkRefused(f"{value!r} refused") if refuse else None

        return on_commit

    plan = [(b"a", False), (b"b", True), (b"c", False), (b"d", True)]
    before = meta.transactions
    futures = [
        stream_store.append_nowait(NS, STREAM, 0, make_batch([v]), on_commit=hook(v, refuse))
        for v, refuse in plan
    ]
    results = await asyncio.gather(*futures, return_exceptions=True)
    assert meta.transactions - before <= 2  # one flush (and maybe its write intent)
    assert results[0] == 0 and results[2] == 1
    assert isinstance(results[1], ChunkRefused) and isinstance(results[3], ChunkRefused)
    assert seen[-4:] == [(b"a", 0), (b"b", 1), (b"c", 1), (b"d", 2)]
    assert await stream_store.high_watermark(NS, STREAM, 0) == 2
    assert await read_all(stream_store, 0) == [(0, b"a"), (1, b"c")]
    assert await stream_store.append(NS, STREAM, 0, make_batch([b"e"])) == 2
    assert [v for _, v in await read_all(stream_store, 0)] == [b"a", b"c", b"e"]
