"""The generic group-commit batcher: one PUT + one transaction per flush, the flush policy,
and failures that acknowledge nothing — with a queue-like commit to show it is generic."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from flowmq_commit import (
    GroupCommit,
    GroupCommitBatcher,
    IntentLost,
    MaintenanceOptions,
    StoreUnavailable,
    collect_garbage,
    refs,
)
from flowmq_commit.refs import ABANDON_GRACE_MS, INTENT, decode_listing, ref_count
from flowmq_meta import MetaError, Transaction
from flowmq_meta.keys import OBJECT_REFS, OBJECTS_TO_DELETE, SETTINGS
from flowmq_metrics import REGISTRY
from flowmq_objstore import ObjectStoreError
from tests.fixtures.counting import CountingMetaStore, CountingObjectStore
from tests.fixtures.waiting import wait_until_async

pytestmark = pytest.mark.timeout(30)


class Recording(GroupCommit):
    """Writes one key per chunk, named by the chunk's ``ctx``, saying where its bytes went
    (as a queue's ready entry would) and returns that location: one entry per chunk."""

    def commit(
        self, tr: Transaction, group: Any, object_key: str, chunks: list[tuple[int, int, Any]]
    ) -> tuple[list[tuple[str, int, int]], int]:
        results = []
        for start, end, tag in chunks:
            tr.set(SETTINGS.pack("test", tag), f"{object_key}|{start}|{end}".encode())
            results.append((object_key, start, end))
        return results, len(chunks)


RECORDING = Recording()


class Fixed(GroupCommit):
    """Returns the object key for every chunk and says it wrote ``refs`` entries."""

    def __init__(self, refs: int) -> None:
        self.refs = refs

    def commit(
        self, tr: Transaction, group: Any, object_key: str, chunks: list[tuple[int, int, Any]]
    ) -> tuple[list[str], int]:
        return [object_key] * len(chunks), self.refs


async def read_setting(meta: CountingMetaStore, tag: str) -> bytes | None:
    return await meta.inner.get(SETTINGS.pack("test", tag))


async def started_batcher(
    meta: CountingMetaStore, objects: CountingObjectStore, **kwargs: Any
) -> GroupCommitBatcher:
    """A started batcher that flushes only when told to, unless ``kwargs`` say otherwise."""
    kwargs = {"size_threshold": 1 << 30, "flush_interval": 3600, "min_flush_gap": None, **kwargs}
    batcher = GroupCommitBatcher(meta, objects, **kwargs)
    await batcher.start()
    return batcher


async def flushed_alone(batcher: GroupCommitBatcher, tag: str) -> str:
    """Submit one chunk, flush it, and return the object it went to."""
    fut = batcher.submit("g", tag.encode(), RECORDING, tag)
    await batcher.flush()
    return fut.result()[0]


async def assert_flush_fails(
    batcher: GroupCommitBatcher, meta: CountingMetaStore, error: type[Exception]
) -> None:
    """A flush of chunks of several groups fails every one with ``StoreUnavailable`` caused
    by the store's ``error``; none is indexed."""
    futures = [batcher.submit(i % 3, b"data", RECORDING, f"f{i}") for i in range(9)]
    await batcher.flush()
    for f in futures:
        with pytest.raises(StoreUnavailable) as caught:
            f.result()
        assert isinstance(caught.value.__cause__, error)
    for i in range(9):
        assert await read_setting(meta, f"f{i}") is None


async def objects_after_grace(
    meta: CountingMetaStore, objects: CountingObjectStore, now: list[int]
) -> list[str]:
    """The objects left once abandoned ones are past their grace and GC has run."""
    now[0] += ABANDON_GRACE_MS
    await collect_garbage(meta, objects, MaintenanceOptions(clock=lambda: now[0]))
    return await objects.list()


async def test_one_put_and_one_transaction_per_flush_for_many_groups(
    meta: CountingMetaStore, objects: CountingObjectStore
) -> None:
    batcher = await started_batcher(meta, objects)
    puts, txns = objects.puts, meta.transactions
    futures = [
        batcher.submit(("ns", f"s{g % 50}", g % 7), f"chunk-{g}".encode(), RECORDING, str(g))
        for g in range(400)
    ]
    await batcher.flush()
    results = [f.result() for f in futures]
    assert objects.puts - puts == 1
    assert meta.transactions - txns == 1
    assert batcher.stats.flushes == 1
    key = results[0][0]
    assert all(r[0] == key for r in results)
    body = await objects.get(key)
    # every chunk's byte range holds its data; each group's chunks are contiguous, in order
    for g, (_, start, end) in enumerate(results):
        assert body[start:end] == f"chunk-{g}".encode()
    by_group: dict[tuple, list[tuple[int, int]]] = {}
    for g, (_, start, end) in enumerate(results):
        by_group.setdefault(("ns", f"s{g % 50}", g % 7), []).append((start, end))
    for ranges in by_group.values():
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
    assert await read_setting(meta, "399") == f"{key}|{results[399][1]}|{results[399][2]}".encode()
    # the object's reference count is the number of entries written, set in that same txn
    assert await meta.inner.transact(lambda tr: ref_count(tr, key)) == 400
    await batcher.close()


async def test_resolved_listeners_run_once_per_flush_after_its_futures_callbacks(
    meta: CountingMetaStore, objects: CountingObjectStore
) -> None:
    """A listener hears of a flush once, right after the callbacks of its futures ran (the
    AMQP channels answer all of the flush's publishes from those callbacks at once)."""
    batcher = await started_batcher(meta, objects)
    events: list[str] = []
    batcher.resolved_listeners.append(lambda: events.append("resolved"))
    futures = [batcher.submit("g", b"x%d" % i, RECORDING, f"r{i}") for i in range(3)]
    for i, f in enumerate(futures):
        f.add_done_callback(lambda _, i=i: events.append(f"done {i}"))
    await batcher.flush()
    await asyncio.sleep(0)  # the callbacks' iteration
    assert events == ["done 0", "done 1", "done 2", "resolved"]
    await batcher.close()


def flush_latency_count(stage: str) -> float:
    return REGISTRY.get_sample_value("kas3_flush_latency_count", {"stage": stage}) or 0.0


async def test_each_flush_is_timed_by_stage(
    meta: CountingMetaStore, objects: CountingObjectStore
) -> None:
    batcher = await started_batcher(meta, objects)
    before = {stage: flush_latency_count(stage) for stage in ("put", "commit", "total")}
    total_sum = REGISTRY.get_sample_value("kas3_flush_latency_sum", {"stage": "total"}) or 0.0
    await flushed_alone(batcher, "timed-1")
    await flushed_alone(batcher, "timed-2")
    assert {s: flush_latency_count(s) - n for s, n in before.items()} == {
        "put": 2,
        "commit": 2,
        "total": 2,
    }
    assert REGISTRY.get_sample_value("kas3_flush_latency_sum", {"stage": "total"}) > total_sum
    await batcher.close()


async def test_flushes_under_load_cost_one_put_and_one_transaction_each(
    meta: CountingMetaStore, objects: CountingObjectStore
) -> None:
    batcher = await started_batcher(meta, objects, size_threshold=64 * 1024, flush_interval=0.002)
    puts, txns = objects.puts, meta.transactions

    async def producer(n: int) -> None:
        for i in range(30):
            await batcher.submit(n % 12, b"x" * 4096, RECORDING, f"{n}-{i}")

    await asyncio.gather(*(producer(n) for n in range(24)))
    assert batcher.stats.flushes >= 2
    assert objects.puts - puts == batcher.stats.flushes
    assert meta.transactions - txns == batcher.stats.flushes
    assert batcher.stats.chunks == 24 * 30
    await batcher.close()


async def test_flush_by_size_does_not_wait_for_the_interval(
    meta: CountingMetaStore, objects: CountingObjectStore
) -> None:
    batcher = await started_batcher(meta, objects, size_threshold=10_000)
    small = batcher.submit("g", b"a" * 4000, RECORDING, "a")
    await asyncio.sleep(0.05)  # gives a wrongly eager batcher the chance to flush early
    assert not small.done() and batcher.stats.flushes == 0
    second = batcher.submit("g", b"b" * 4000, RECORDING, "b")
    third = batcher.submit("g", b"c" * 4000, RECORDING, "c")
    await asyncio.wait_for(asyncio.gather(small, second, third), 5)
    assert batcher.stats.flushes == 1
    await batcher.close()


async def test_flush_by_time_when_below_the_size_threshold(
    meta: CountingMetaStore, objects: CountingObjectStore
) -> None:
    interval = 0.05
    batcher = await started_batcher(meta, objects, flush_interval=interval)
    started = time.monotonic()
    await asyncio.wait_for(batcher.submit("g", b"tiny", RECORDING, "t"), 5)
    assert time.monotonic() - started >= interval * 0.9
    assert batcher.stats.flushes == 1
    await batcher.close()


@pytest.mark.parametrize(
    "policy", [{"flush_interval": 0.001}, {"min_flush_gap": 0.0}], ids=["interval", "adaptive"]
)
async def test_items_arriving_during_a_flush_wait_for_the_next(
    meta: CountingMetaStore, objects: CountingObjectStore, policy: dict[str, float]
) -> None:
    batcher = await started_batcher(meta, objects, **policy)
    gate = asyncio.Event()
    objects.put_gate = gate
    first = batcher.submit("g", b"first", RECORDING, "first")
    await objects.put_waiting.wait()
    later = [batcher.submit("g", f"later-{i}".encode(), RECORDING, f"l{i}") for i in range(5)]
    gate.set()
    objects.put_gate = None
    key1 = (await first)[0]
    keys = {(await f)[0] for f in later}
    assert len(keys) == 1 and key1 not in keys
    assert batcher.stats.flushes == 2
    # flushes commit in order: the later object's chunks were committed after the first's
    assert await read_setting(meta, "first") is not None
    await batcher.close()


async def test_the_next_flush_writes_its_object_while_the_previous_one_commits(
    meta: CountingMetaStore, objects: CountingObjectStore
) -> None:
    batcher = await started_batcher(meta, objects, min_flush_gap=0.0)
    txns = meta.transactions
    commit_gate, put_gate = asyncio.Event(), asyncio.Event()
    meta.transact_gate = commit_gate
    first = batcher.submit("g", b"first", RECORDING, "first")
    await meta.transact_waiting.wait()  # the first object is written, its commit held
    objects.put_gate = put_gate
    second = batcher.submit("g", b"second", RECORDING, "second")
    await objects.put_waiting.wait()  # the second flush's PUT started meanwhile
    assert not first.done()
    put_gate.set()
    objects.put_gate = None
    meta.transact_gate = None
    commit_gate.set()
    key1 = (await first)[0]
    key2 = (await second)[0]
    assert key1 != key2 and batcher.stats.flushes == 2
    # one transaction per flush, each registering the intent its successors take
    assert meta.transactions - txns == 2
    # flushes commit in order: the second object got the later index entry
    assert key1 < key2
    await batcher.close()


async def test_a_flush_finishing_lets_the_waiting_chunks_start_the_next_at_once(
    meta: CountingMetaStore, objects: CountingObjectStore
) -> None:
    """Two flushes in flight (one committing, one waiting for it): when the first has
    committed, chunks waiting for a free slot start writing their object while the second
    commits, without waiting for another submission to wake the batcher."""
    batcher = await started_batcher(meta, objects, min_flush_gap=0.0)
    first_commit, second_commit, third_put = asyncio.Event(), asyncio.Event(), asyncio.Event()
    meta.transact_gate = first_commit
    first = batcher.submit("g", b"first", RECORDING, "first")
    await meta.transact_waiting.wait()
    second = batcher.submit("g", b"second", RECORDING, "second")
    # the second object is written; its commit waits for the first
    await wait_until_async(lambda: objects.puts >= 2, step=0, what="the second object written")
    third = batcher.submit("g", b"third", RECORDING, "third")
    meta.transact_gate = second_commit
    meta.transact_waiting.clear()
    objects.put_gate = third_put
    objects.put_waiting.clear()
    first_commit.set()
    await first
    await meta.transact_waiting.wait()  # the second flush is committing, held
    await asyncio.wait_for(objects.put_waiting.wait(), 5)  # and the third one's PUT started
    meta.transact_gate = objects.put_gate = None
    second_commit.set()
    third_put.set()
    assert len({(await f)[0] for f in (second, third)}) == 2
    await batcher.close()


async def test_failed_put_fails_every_waiter_and_acknowledges_nothing(
    meta: CountingMetaStore, objects: CountingObjectStore
) -> None:
    batcher = await started_batcher(meta, objects, outage_retry_s=0)
    objects.fail_puts = 1
    await assert_flush_fails(batcher, meta, ObjectStoreError)
    assert batcher.outage is not None
    # the batcher recovers: the next flush works and ends the outage
    assert await flushed_alone(batcher, "ok")
    assert batcher.outage is None
    await batcher.close()


async def test_after_a_store_failure_new_writes_fail_at_once_then_probe_again(
    meta: CountingMetaStore, objects: CountingObjectStore
) -> None:
    """Fail fast (DESIGN.md §13): inside the window after a failed flush a write is refused
    without touching the store; each further failure doubles the window up to its cap;
    after the window the next flush probes the store and, once it commits, writes flow."""
    retry_s = 0.3
    batcher = await started_batcher(
        meta, objects, outage_retry_s=retry_s, outage_retry_max_s=2 * retry_s
    )
    objects.fail_puts = 2
    await assert_flush_fails(batcher, meta, ObjectStoreError)
    puts = objects.puts
    refused = batcher.submit("g", b"x", RECORDING, "refused")
    assert refused.done() and isinstance(refused.exception(), StoreUnavailable)
    assert objects.puts == puts and batcher.pending_bytes == 0

    await asyncio.sleep(retry_s)  # the window is time itself
    await assert_flush_fails(batcher, meta, ObjectStoreError)  # the probe fails: 2 x window
    assert batcher.submit("g", b"x", RECORDING, "refused again").done()
    await asyncio.sleep(retry_s)
    assert batcher.submit("g", b"x", RECORDING, "still refused").done()
    await asyncio.sleep(retry_s)
    assert await flushed_alone(batcher, "ok")
    assert batcher.outage is None
    accepted = batcher.submit("g", b"y", RECORDING, "accepted")
    assert not accepted.done()
    await batcher.flush()
    assert accepted.result()
    await batcher.close()


async def test_failed_transaction_fails_every_waiter_and_leaves_no_orphan(
    meta: CountingMetaStore, objects: CountingObjectStore
) -> None:
    now = [1_000_000_000]
    batcher = await started_batcher(meta, objects, clock=lambda: now[0], outage_retry_s=0)
    meta.fail_transactions = 1
    await assert_flush_fails(batcher, meta, MetaError)
    [orphan] = await objects.list()
    # the object whose commit failed is still listed (as the intent it was written under)
    assert await meta.inner.get(OBJECTS_TO_DELETE.pack(orphan)) is not None
    ok = await flushed_alone(batcher, "ok")
    assert ok != orphan
    # ... and the next flush handed it to GC, which deletes it after a grace period
    await collect_garbage(meta, objects, MaintenanceOptions(clock=lambda: now[0]))
    assert orphan in await objects.list()
    assert await objects_after_grace(meta, objects, now) == [ok]
    await batcher.close()


async def test_a_commit_raising_fails_the_whole_flush(
    meta: CountingMetaStore, objects: CountingObjectStore
) -> None:
    batcher = await started_batcher(meta, objects)

    class Refusing(GroupCommit):
        def commit(self, tr, group, object_key, chunks):
            raise ValueError("rejected")

    good = batcher.submit("a", b"1", RECORDING, "good")
    failing = batcher.submit("b", b"2", Refusing())
    await batcher.flush()
    with pytest.raises(ValueError):
        failing.result()
    with pytest.raises(ValueError):
        good.result()
    assert await read_setting(meta, "good") is None
    await batcher.close()


async def test_refs_follow_what_commits_report(
    meta: CountingMetaStore, objects: CountingObjectStore
) -> None:
    batcher = await started_batcher(meta, objects)

    declining = Fixed(0)  # e.g. a duplicate the commit chose not to index
    a = batcher.submit("q", b"abc", Fixed(3))
    b = batcher.submit("q", b"def", declining)
    await batcher.flush()
    key = a.result()
    assert await meta.inner.transact(lambda tr: ref_count(tr, key)) == 3
    # an object nobody indexed goes straight to the to-delete list
    only = batcher.submit("q", b"dup", declining)
    await batcher.flush()
    assert await meta.inner.get(OBJECTS_TO_DELETE.pack(only.result())) is not None
    assert await meta.inner.get(OBJECT_REFS.pack(only.result())) is None
    assert b.result() == key
    await batcher.close()


async def test_a_claimed_intent_fails_the_flush(
    meta: CountingMetaStore, objects: CountingObjectStore
) -> None:
    """If GC claimed the object key (lease expired during a stuck PUT), committing index
    entries would point them at an object being deleted: the flush fails instead."""
    now = [1_000_000_000]
    batcher = await started_batcher(meta, objects, clock=lambda: now[0])
    gate = asyncio.Event()
    objects.put_gate = gate
    fut = batcher.submit("g", b"data", RECORDING, "x")
    flushing = asyncio.ensure_future(batcher.flush())
    await objects.put_waiting.wait()
    now[0] += batcher.intent_lease_ms + 1
    await collect_garbage(
        meta, objects, MaintenanceOptions(clock=lambda: now[0])
    )  # claims the expired intent
    gate.set()
    await flushing
    with pytest.raises(IntentLost):
        fut.result()
    objects.put_gate = None
    again = await flushed_alone(batcher, "again")
    # the object written under the lost intent was listed again, and GC removes it
    assert await objects_after_grace(meta, objects, now) == [again]
    await batcher.close()


async def test_close_flushes_pending_and_releases_the_unused_intent(
    meta: CountingMetaStore, objects: CountingObjectStore
) -> None:
    batcher = await started_batcher(meta, objects)
    fut = batcher.submit("g", b"data", RECORDING, "c")
    await batcher.close()
    assert fut.result()
    listed = await meta.inner.transact(lambda tr: tr.get_range(*OBJECTS_TO_DELETE.range()))
    assert all(decode_listing(v).state != INTENT for _, v in listed)


class RecordingGroupCommit(GroupCommit):
    """Like a stream partition: one entry per group per flush, results per chunk."""

    def __init__(self) -> None:
        self.calls: list[tuple[object, str, list[tuple[int, int, object]]]] = []
        self.before: list[tuple[object, str, int, int, bytes]] = []
        self.before_at_commit: list[list[object]] = []  # groups told, as each commit ran
        self.after: list[tuple[object, list, int, int, bytes]] = []

    def commit(self, tr, group, object_key, chunks):
        self.calls.append((group, object_key, chunks))
        self.before_at_commit.append([g for g, key, *_ in self.before if key == object_key])
        tr.set(SETTINGS.pack("group", str(group)), object_key.encode())
        return [ctx for _, _, ctx in chunks], 1

    def before_commit(self, group, object_key, start, end, data) -> None:
        self.before.append((group, object_key, start, end, bytes(data)))

    def after_commit(self, group, results, object_key, start, end, data) -> None:
        self.after.append((group, results, start, end, bytes(data)))


async def test_group_commit_is_called_once_per_group_per_flush(
    meta: CountingMetaStore, objects: CountingObjectStore
) -> None:
    batcher = await started_batcher(meta, objects)
    gc = RecordingGroupCommit()
    futures = [batcher.submit(f"g{i % 3}", f"<{i}>".encode(), gc, ctx=i) for i in range(9)]
    other = batcher.submit("g0", b"<other>", RECORDING, "other")  # another commit: its own run
    await batcher.flush()
    assert [f.result() for f in futures] == list(range(9))
    assert sorted(g for g, _, _ in gc.calls) == ["g0", "g1", "g2"]
    key = other.result()[0]
    body = await objects.get(key)
    for _, _, chunks in gc.calls:
        assert all(a[1] == b[0] for a, b in zip(chunks, chunks[1:], strict=False))  # adjacent
        assert body[chunks[0][0] : chunks[-1][1]] == b"".join(
            f"<{ctx}>".encode() for _, _, ctx in chunks
        )
    for group, results, start, end, data in gc.after:
        assert data == body[start:end]
        assert results == [i for i in range(9) if f"g{i % 3}" == group]
    # Each run's bytes were handed over before the transaction that indexes them ran (a
    # reader that sees the commit before ``after_commit`` finds them in the page cache).
    assert sorted((g, s, e, d) for g, _, s, e, d in gc.before) == sorted(
        (g, s, e, d) for g, _, s, e, d in gc.after
    )
    assert all(sorted(told) == ["g0", "g1", "g2"] for told in gc.before_at_commit)
    # 3 group entries + 1 entry of the other commit point into the object
    assert await meta.inner.transact(lambda tr: ref_count(tr, key)) == 4
    await batcher.close()


async def test_a_zero_byte_chunk_rides_the_flush_transaction(
    meta: CountingMetaStore, objects: CountingObjectStore
) -> None:
    """As a queue's claim round does: its commit runs in the flush's transaction and sees
    the flush's object key, and the object holds only the other chunks' bytes."""
    batcher = await started_batcher(meta, objects)
    txns = meta.transactions
    order: list[str] = []

    class Rider(Fixed):
        def commit(self, tr, group, object_key, chunks):
            order.append("rider")
            return super().commit(tr, group, object_key, chunks)

    class Data(Recording):
        def commit(self, tr, group, object_key, chunks):
            order.append("data")
            return super().commit(tr, group, object_key, chunks)

    rider = batcher.submit(("round",), b"", Rider(0))
    data = batcher.submit("g", b"data", Data(), "data")
    await batcher.flush()
    key = data.result()[0]
    assert rider.result() == key
    # committed after the chunks with bytes, though submitted first: a claim riding the
    # flush sees what the flush enqueued
    assert order == ["data", "rider"]
    assert meta.transactions - txns == 1
    assert await objects.get(key) == b"data"
    assert await meta.inner.transact(lambda tr: ref_count(tr, key)) == 1
    await batcher.close()


async def test_a_commit_returning_the_wrong_number_of_results_fails_the_flush(
    meta: CountingMetaStore, objects: CountingObjectStore
) -> None:
    class Short(GroupCommit):
        def commit(self, tr, group, object_key, chunks):
            return [], 0

    batcher = await started_batcher(meta, objects)
    fut = batcher.submit("g", b"data", Short())
    await batcher.flush()
    with pytest.raises(ValueError):
        fut.result()
    await batcher.close()


async def test_a_flush_after_a_long_idle_period_renews_the_intent_first(
    meta: CountingMetaStore, objects: CountingObjectStore
) -> None:
    now = [1_000_000_000]
    batcher = await started_batcher(meta, objects, clock=lambda: now[0])
    now[0] += batcher.intent_lease_ms  # the first intent has expired meanwhile
    fut = batcher.submit("g", b"late", RECORDING, "late")
    await batcher.flush()
    assert fut.result()
    assert batcher.stats.intent_transactions == 2
    await batcher.close()


def test_default_flush_interval_depends_on_the_object_store(tmp_path) -> None:
    from flowmq_commit import default_flush_interval
    from flowmq_meta import open_meta_store
    from flowmq_objstore import FileObjectStore, S3ObjectStore

    files = FileObjectStore(tmp_path)
    assert default_flush_interval(files) <= 0.005
    s3 = S3ObjectStore("bucket", endpoint_url="http://127.0.0.1:1", url="s3://bucket")
    assert default_flush_interval(s3) == 0.1
    meta = open_meta_store("memory://")
    # Local disk flushes at once when idle; S3 keeps the interval between PUTs.
    assert GroupCommitBatcher(meta, files).prompt
    s3_batcher = GroupCommitBatcher(meta, s3)
    assert not s3_batcher.prompt and s3_batcher.min_flush_gap == 0.1


async def test_an_idle_adaptive_batcher_flushes_at_once_not_after_the_interval(
    meta: CountingMetaStore, objects: CountingObjectStore
) -> None:
    # flush_interval is an hour (started_batcher): only the adaptive policy can flush this.
    batcher = await started_batcher(meta, objects, min_flush_gap=0.0)
    # The same loop iteration's chunks share the flush.
    futures = [batcher.submit("g", f"c{i}".encode(), RECORDING, f"c{i}") for i in range(3)]
    await asyncio.wait_for(asyncio.gather(*futures), 5)
    assert batcher.stats.flushes == 1 and batcher.stats.chunks == 3
    await batcher.close()


async def test_the_minimum_gap_spaces_flushes_out(
    meta: CountingMetaStore, objects: CountingObjectStore
) -> None:
    gap = 0.2
    batcher = await started_batcher(meta, objects, min_flush_gap=gap)
    started = time.monotonic()
    await asyncio.wait_for(batcher.submit("g", b"one", RECORDING, "one"), 5)
    assert time.monotonic() - started < gap  # idle: at once
    await asyncio.wait_for(batcher.submit("g", b"two", RECORDING, "two"), 5)
    assert time.monotonic() - started >= gap * 0.9  # not before the gap
    assert batcher.stats.flushes == 2
    await batcher.close()


async def test_zero_byte_chunks_alone_cost_one_transaction_and_no_put(
    meta: CountingMetaStore, objects: CountingObjectStore
) -> None:
    batcher = await started_batcher(meta, objects, min_flush_gap=0.0)
    puts, txns = objects.puts, meta.transactions
    await asyncio.wait_for(batcher.submit("round", b"", RECORDING, "rider"), 5)
    assert await read_setting(meta, "rider") is not None
    assert objects.puts == puts and meta.transactions == txns + 1
    assert batcher.stats.meta_only_flushes == 1 and batcher.stats.flushes == 0
    # The intent stays for the next flush with bytes: still one PUT + one transaction.
    await asyncio.wait_for(batcher.submit("g", b"bytes", RECORDING, "bytes"), 5)
    assert objects.puts == puts + 1 and meta.transactions == txns + 2
    await batcher.close()


async def test_an_entry_whose_keys_cannot_fit_fails_alone_not_its_flush(
    meta: CountingMetaStore, objects: CountingObjectStore
) -> None:
    """The stream and queue commits check a group's keys when it is first submitted: an
    entry for a name past the key budget is refused to its submitter at once, and the
    entries submitted around it commit in the flush as usual."""
    from flowmq_core.message import Message
    from flowmq_kas3.page_cache import PageCache
    from flowmq_kas3.records import encode_messages
    from flowmq_kas3.store import StreamStore
    from flowmq_meta import KeyTooLarge
    from flowmq_queue.enqueue import EnqueueCommit

    batcher = await started_batcher(meta, objects)
    streams = StreamStore(meta, objects, batcher, PageCache(1 << 20))
    queue_commit = EnqueueCommit(lambda *args: None)
    before = batcher.submit("g", b"before", RECORDING, "before")
    with pytest.raises(KeyTooLarge):
        streams.append_nowait("ns", "s" * 20_000, 0, encode_messages([Message("t", b"x")]))
    with pytest.raises(KeyTooLarge):
        batcher.submit((0, "ns", "q" * 20_000), b"x", queue_commit, None)
    after = batcher.submit("g", b"after", RECORDING, "after")
    await batcher.flush()
    assert before.result()[0] == after.result()[0]  # one flush, both committed
    assert await read_setting(meta, "before") is not None
    assert await read_setting(meta, "after") is not None
    await batcher.close()


async def test_pending_bytes_past_the_high_water_mark_report_pressure_until_below_low_water(
    meta: CountingMetaStore, objects: CountingObjectStore, caplog: pytest.LogCaptureFixture
) -> None:
    """Backpressure (DESIGN.md §13): listeners hear True once pending bytes pass the high-water
    mark (not before, not twice) and False once a flush takes them below the low-water mark;
    one log line each, the end once no other pause followed for ``pressure_log_quiet_s``."""
    batcher = await started_batcher(
        meta, objects, flush_interval=0.001, high_water=1000, low_water=300, max_flush_bytes=400
    )
    batcher.pressure_log_quiet_s = 0.05
    heard: list[bool] = []
    batcher.pressure_listeners.append(heard.append)
    gate = asyncio.Event()
    objects.put_gate = gate
    futures = [batcher.submit("g", b"x" * 100, RECORDING, "first")]
    await objects.put_waiting.wait()  # that chunk is in the held flush, no longer pending
    for i in range(10):
        futures.append(batcher.submit("g", b"x" * 100, RECORDING, f"c{i}"))
    assert batcher.pending_bytes == 1000 and heard == [] and not batcher.under_pressure
    futures.append(batcher.submit("g", b"x" * 100, RECORDING, "over"))
    futures.append(batcher.submit("g", b"x" * 100, RECORDING, "more"))
    assert heard == [True] and batcher.under_pressure
    with caplog.at_level("INFO", logger="flowmq_commit.batcher"):
        objects.put_gate = None
        gate.set()
        await asyncio.gather(*futures)
        # 1200 pending, 400 per flush: below 300 once the third flush takes its share.
        assert heard == [True, False] and not batcher.under_pressure
        assert batcher.pending_bytes == 0
        while not any("publishers resumed" in r.message for r in caplog.records):
            await asyncio.sleep(0.01)  # the end line comes once quiet (a log: polled)
    ended = [r.message for r in caplog.records if "publishers resumed" in r.message]
    assert len(ended) == 1 and "pauses: 1," in ended[0]
    await batcher.close()


async def test_unsettled_chunks_past_their_mark_report_pressure_until_half_are_committed(
    meta: CountingMetaStore, objects: CountingObjectStore
) -> None:
    """Small chunks pass the chunk mark long before the byte mark; the chunks in a flush
    still count until it commits (their submitters' memory is held until then)."""
    batcher = await started_batcher(meta, objects, flush_interval=0.001, high_water_chunks=10)
    heard: list[bool] = []
    batcher.pressure_listeners.append(heard.append)
    gate = asyncio.Event()
    objects.put_gate = gate
    futures = [batcher.submit("g", b"x", RECORDING, f"c{i}") for i in range(10)]
    await objects.put_waiting.wait()  # all ten in the held flush, none waiting
    assert batcher.pending_bytes == 0 and batcher.unsettled_chunks == 10 and heard == []
    futures.append(batcher.submit("g", b"x", RECORDING, "over"))
    assert heard == [True] and batcher.under_pressure
    objects.put_gate = None
    gate.set()
    await asyncio.gather(*futures)
    assert heard == [True, False] and batcher.unsettled_chunks == 0
    await batcher.close()


async def test_high_water_zero_never_reports_pressure(
    meta: CountingMetaStore, objects: CountingObjectStore
) -> None:
    batcher = await started_batcher(meta, objects, high_water=0)
    heard: list[bool] = []
    batcher.pressure_listeners.append(heard.append)
    futures = [batcher.submit("g", b"x" * 10_000, RECORDING, f"c{i}") for i in range(100)]
    await batcher.flush()
    await asyncio.gather(*futures)
    assert heard == [] and not batcher.under_pressure
    await batcher.close()


async def test_gc_logs_a_pass_s_failed_deletes_once_and_retries_them(
    meta: CountingMetaStore,
    objects: CountingObjectStore,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    keys = [f"segments/gc/{i}" for i in range(5)]
    for key in keys:
        await objects.put(key, b"x")

    def listed(tr: Transaction) -> None:
        for key in keys:
            refs.mark_for_deletion(tr, key, deadline_ms=0)

    await meta.transact(listed)

    async def refuse(key: str) -> None:
        raise ObjectStoreError(f"delete {key!r}: Operation not permitted")

    monkeypatch.setattr(objects, "delete", refuse)
    with caplog.at_level("WARNING", logger="flowmq_commit.gc"):
        result = await collect_garbage(meta, objects)
    assert result.failed == 5
    [record] = [r for r in caplog.records if r.name == "flowmq_commit.gc"]
    assert "could not delete 5 object(s)" in record.getMessage()
    assert record.exc_info is None, "a store's refusal needs no traceback"
    monkeypatch.undo()
    assert (await collect_garbage(meta, objects)).deleted == 5
    assert await objects.list() == []
