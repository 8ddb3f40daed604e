"""The flush process on the file object store and SQLite: flushes whose commits can leave the
broker write and commit in a child process; the others, and every flush while the child is
down, take the flush thread, and the two routes commit in submission order."""

from __future__ import annotations

import asyncio
import functools
import os
import signal
from collections.abc import AsyncIterator
from typing import Any

import pytest

from flowmq_commit import GroupCommit, GroupCommitBatcher, StoreUnavailable, flush_process
from flowmq_commit.flush_txn import RunCommit
from flowmq_meta import MetaStore, Transaction
from flowmq_meta.keys import SETTINGS
from flowmq_objstore import ObjectStore
from tests.fixtures.waiting import wait_until_async

pytestmark = pytest.mark.timeout(60)

LOG_KEY = SETTINGS.pack("test", "log")


def log_chunks(
    group: str, chunks: list[tuple[int, int, Any]], tr: Transaction, object_key: str
) -> tuple[list[str], int]:
    """Append each chunk's tag to one log key, and where (and in which process) it went."""
    log = tr.get(LOG_KEY) or b""
    for start, end, tag in chunks:
        log += f"{tag},".encode()
        tr.set(SETTINGS.pack("test", tag), f"{object_key}|{start}|{end}|{os.getpid()}".encode())
    tr.set(LOG_KEY, log)
    return [object_key] * len(chunks), len(chunks)


class Logged(GroupCommit):
    """``log_chunks``, in the broker's process only."""

    def commit(
        self, tr: Transaction, group: Any, object_key: str, chunks: list[tuple[int, int, Any]]
    ) -> tuple[list[str], int]:
        return log_chunks(group, chunks, tr, object_key)


class PortableLogged(Logged):
    """``log_chunks``, which the flush process may run."""

    def portable(self, group: Any, chunks: list[tuple[int, int, Any]]) -> RunCommit | None:
        return functools.partial(log_chunks, group, chunks)


@pytest.fixture
async def batcher(stores: tuple[MetaStore, ObjectStore]) -> AsyncIterator[GroupCommitBatcher]:
    meta, objects = stores
    batcher = GroupCommitBatcher(meta, objects)
    await batcher.start()
    yield batcher
    await batcher.close()


async def child_up(batcher: GroupCommitBatcher) -> flush_process.FlushProcess:
    """Submit portable chunks until the flush process (started by the first) is up."""
    process = batcher._flush_process
    assert process is not None, "file + SQLite without fault hooks takes the flush process"
    await batcher.submit("g", b"warm-up", PortableLogged(), "warm-up")
    await wait_until_async(lambda: process.ready, timeout=30)
    return process


async def where(meta: MetaStore, tag: str) -> tuple[str, int, int, int]:
    key, start, end, pid = (await meta.get(SETTINGS.pack("test", tag)) or b"").decode().split("|")
    return key, int(start), int(end), int(pid)


async def test_portable_flushes_commit_in_the_child(
    stores: tuple[MetaStore, ObjectStore], batcher: GroupCommitBatcher
) -> None:
    meta, objects = stores
    await child_up(batcher)
    commit = PortableLogged()
    futures = [batcher.submit("g", f"body-{i}".encode(), commit, f"t{i}") for i in range(5)]
    keys = await asyncio.gather(*futures)
    for i, key in enumerate(keys):
        object_key, start, end, pid = await where(meta, f"t{i}")
        assert object_key == key
        assert pid != os.getpid(), "committed in the broker's process, not the child"
        assert await objects.get(key, start, end) == f"body-{i}".encode()


async def test_commits_in_the_child_fire_this_process_s_watches(
    stores: tuple[MetaStore, ObjectStore], batcher: GroupCommitBatcher
) -> None:
    meta, _ = stores
    await child_up(batcher)
    watch = await meta.watch(SETTINGS.pack("test", "watched"))
    await batcher.submit("g", b"x", PortableLogged(), "watched")
    # The store polls every 600 s: only the child's commit, handed over, fires it.
    await asyncio.wait_for(watch, 10)


async def test_routes_commit_in_submission_order(
    stores: tuple[MetaStore, ObjectStore], batcher: GroupCommitBatcher
) -> None:
    """Chunks alternating between a portable commit (child) and one that is not (thread),
    each submitted once the one before is in a flush, so that consecutive flushes (two in
    flight at a time) take different routes."""
    meta, _ = stores
    await child_up(batcher)
    portable, local = PortableLogged(), Logged()
    futures = []
    for i in range(120):
        futures.append(batcher.submit("g", b"x", portable if i % 2 else local, f"o{i}"))
        await wait_until_async(lambda: not batcher._pending, step=0)
    await asyncio.gather(*futures)
    log = (await meta.get(LOG_KEY) or b"").decode().split(",")
    ordered = [tag for tag in log if tag.startswith("o")]
    assert ordered == [f"o{i}" for i in range(120)]
    pids = {(await where(meta, f"o{i}"))[3] for i in range(120)}
    assert len(pids) == 2, "both routes were taken"


async def test_a_dead_child_fails_its_flush_and_a_new_one_takes_over(
    stores: tuple[MetaStore, ObjectStore],
    batcher: GroupCommitBatcher,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    meta, objects = stores
    monkeypatch.setattr(flush_process, "RESTART_GAP_S", 0.0)
    batcher.outage_retry_s = batcher.outage_retry_max_s = 0.0  # no window refusing writes
    process = await child_up(batcher)
    child = process._child
    assert child is not None
    os.kill(child.pid, signal.SIGSTOP)
    stuck = batcher.submit("g", b"lost", PortableLogged(), "lost")
    await wait_until_async(lambda: process._pending, what="the flush sent to the child")
    os.kill(child.pid, signal.SIGKILL)
    with pytest.raises(StoreUnavailable):
        await stuck
    assert await meta.get(SETTINGS.pack("test", "lost")) is None
    # Durable writes go on: through the thread at first, then a new child.
    key = await batcher.submit("g", b"after", PortableLogged(), "after")
    assert await objects.get(key) == b"after"
    new_process = await child_up(batcher)
    assert new_process._child is not None and new_process._child.pid != child.pid
