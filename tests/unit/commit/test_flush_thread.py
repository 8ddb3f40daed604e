"""The flush thread on the file object store and SQLite (no counting wrappers, which have
only async calls): a flush's write and transaction run back to back off the event loop, a
failure between them acknowledges nothing and leaves only what GC deletes."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from flowmq_commit import (
    GroupCommit,
    GroupCommitBatcher,
    MaintenanceOptions,
    StoreUnavailable,
    collect_garbage,
)
from flowmq_commit.refs import ABANDON_GRACE_MS
from flowmq_meta import MetaStore, Transaction, open_meta_store
from flowmq_meta.keys import SETTINGS
from flowmq_objstore import ObjectStore, ObjectStoreError
from tests.fixtures.waiting import wait_until_async

pytestmark = pytest.mark.timeout(30)


class Stored(GroupCommit):
    """One entry per chunk naming where its bytes went; ``committed`` is set (from whatever
    thread runs the transaction) once a commit ran."""

    def __init__(self) -> None:
        self.committed = threading.Event()

    def commit(
        self, tr: Transaction, group: Any, object_key: str, chunks: list[tuple[int, int, Any]]
    ) -> tuple[list[str], int]:
        for start, end, tag in chunks:
            tr.set(SETTINGS.pack("test", tag), f"{object_key}|{start}|{end}".encode())
        self.committed.set()
        return [object_key] * len(chunks), len(chunks)


async def test_a_flush_commits_while_the_event_loop_is_blocked(
    stores: tuple[MetaStore, ObjectStore],
) -> None:
    """Once its object is written the flush's transaction needs nothing of the loop: the
    flush thread hands it to the meta store's thread itself."""
    meta, objects = stores
    loop = asyncio.get_running_loop()
    stored = Stored()
    committed_while_blocked: list[bool] = []

    def block_the_loop() -> None:
        # Only a transaction queued without the loop can commit meanwhile.
        committed_while_blocked.append(stored.committed.wait(5))

    def faults(point: str) -> None:
        if point == "flush.before_put":  # on the loop; the write starts right after
            loop.call_soon(block_the_loop)

    batcher = GroupCommitBatcher(meta, objects, faults=faults)
    await batcher.start()
    future = batcher.submit("g", b"payload", stored, "t")
    key = await future
    assert committed_while_blocked == [True], "the transaction waited for the event loop"
    assert await objects.get(key) == b"payload"
    assert await meta.get(SETTINGS.pack("test", "t")) == f"{key}|0|7".encode()
    await batcher.close()


async def test_pipelined_flushes_commit_in_order(stores: tuple[MetaStore, ObjectStore]) -> None:
    """Chunks submitted while a flush writes go in the next one, which commits after it."""
    meta, objects = stores
    batcher = GroupCommitBatcher(meta, objects)
    await batcher.start()
    order: list[str] = []

    class Ordered(GroupCommit):
        def commit(
            self, tr: Transaction, group: Any, object_key: str, chunks: list[tuple[int, int, Any]]
        ) -> tuple[list[str], int]:
            order.append(object_key)
            return [object_key] * len(chunks), len(chunks)

    ordered = Ordered()
    futures = []
    for i in range(200):
        futures.append(batcher.submit(i % 3, b"x" * 100, ordered))
        if i % 20 == 0:
            await asyncio.sleep(0)
    keys = await asyncio.gather(*futures)
    assert batcher.stats.flushes > 1
    flushed = list(dict.fromkeys(order))  # one commit per group per flush
    assert flushed == sorted(set(keys))  # keys grow with the flush sequence
    for key in set(keys):
        assert len(await objects.get(key)) == 100 * keys.count(key)
    await batcher.close()


@pytest.mark.parametrize("write_fails", [False, True], ids=["write-ok", "write-fails"])
async def test_the_transaction_runs_beside_the_write_and_commits_only_after_it(
    stores: tuple[MetaStore, ObjectStore], tmp_path: Path, write_fails: bool
) -> None:
    """The flush's statements run while its object is written; COMMIT waits for the write's
    fdatasync, and a failed write rolls them back."""
    meta, objects = stores
    stored = Stored()
    release = threading.Event()
    write = objects.write_blocking  # type: ignore[attr-defined]

    def slow_write(key: str, data: bytes) -> None:
        assert release.wait(5)
        if write_fails:
            raise ObjectStoreError("disk full")
        write(key, data)

    objects.write_blocking = slow_write  # type: ignore[attr-defined]
    batcher = GroupCommitBatcher(meta, objects, outage_retry_s=0.0)
    await batcher.start()
    future = batcher.submit("g", b"payload", stored, "t")
    await wait_until_async(stored.committed.is_set, what="the statements ran")
    reader = open_meta_store(f"sqlite:///{tmp_path / 'meta.db'}")  # a second connection
    try:
        assert await reader.get(SETTINGS.pack("test", "t")) is None  # not committed yet
        assert not future.done()
        release.set()
        if write_fails:
            with pytest.raises(StoreUnavailable, match="disk full"):
                await future
            assert await reader.get(SETTINGS.pack("test", "t")) is None
        else:
            key = await future
            assert await reader.get(SETTINGS.pack("test", "t")) == f"{key}|0|7".encode()
    finally:
        await reader.close()
    objects.write_blocking = write  # type: ignore[attr-defined]
    assert await batcher.submit("g", b"next", Stored(), "n")  # the next flush commits
    await batcher.close()


async def test_a_crash_between_write_and_commit_acknowledges_nothing_and_gc_deletes_it(
    stores: tuple[MetaStore, ObjectStore],
) -> None:
    meta, objects = stores
    now = [1_000_000_000]
    crash = ["flush.after_put"]

    def faults(point: str) -> None:
        if crash and point == crash[0]:
            crash.clear()
            raise RuntimeError("crash after the write")

    batcher = GroupCommitBatcher(meta, objects, clock=lambda: now[0], faults=faults)
    await batcher.start()
    stored = Stored()
    with pytest.raises(RuntimeError, match="crash after the write"):
        await batcher.submit("g", b"lost", stored, "lost")
    # (Its statements may have run, overlapping the write: rolled back.)
    assert await meta.get(SETTINGS.pack("test", "lost")) is None
    kept = await batcher.submit("g", b"kept", stored, "kept")  # the next flush commits
    await batcher.close()
    now[0] += ABANDON_GRACE_MS
    await collect_garbage(meta, objects, MaintenanceOptions(clock=lambda: now[0]))
    assert await objects.list() == [kept]
    assert await objects.get(kept) == b"kept"


async def test_objects_are_created_ahead_written_in_place_and_left_to_gc_unused(
    stores: tuple[MetaStore, ObjectStore], tmp_path: Path
) -> None:
    meta, objects = stores
    now = [1_000_000_000]
    root = tmp_path / "objects"

    def files() -> dict[str, int]:
        found = (p for p in root.rglob("*") if p.is_file())
        return {p.relative_to(root).as_posix(): p.stat().st_ino for p in found}

    batcher = GroupCommitBatcher(meta, objects, clock=lambda: now[0])
    await batcher.start()
    ahead = await wait_until_async(lambda: len(f := files()) > 1 and f, what="created ahead")
    key = await batcher.submit("g", b"data", Stored(), "t")
    assert files()[key] == ahead[key]  # written in place: no temp file renamed over it
    assert await objects.get(key) == b"data"
    assert await objects.list() == [key]  # the empty ones are not objects yet
    await batcher.close()  # hands the unused ones to GC
    now[0] += ABANDON_GRACE_MS
    await collect_garbage(meta, objects, MaintenanceOptions(clock=lambda: now[0]))
    assert list(files()) == [key]
