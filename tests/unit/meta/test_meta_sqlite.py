"""SQLite backend specifics: URLs, files, errors, conflicts between connections, polling."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time

import pytest

from flowmq_meta import (
    MetaError,
    RetryLimitExceeded,
    decode_int,
    encode_int,
    open_meta_store,
)
from flowmq_meta.memory import MemoryMetaStore
from flowmq_meta.sqlite import BEGIN_MODES, SqliteMetaStore
from tests.fixtures.meta_lock import meta_store_locked

K = b"\x02counter\x00"
WAIT = 5.0


async def increment(store, key: bytes, n: int) -> None:
    """n read-modify-write increments through get + set (no atomic add): lost updates show."""

    def fn(tr):
        tr.set(key, encode_int(decode_int(tr.get(key)) + 1))

    for _ in range(n):
        await store.transact(fn)


async def test_relative_url_creates_parent_dirs(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    store = open_meta_store("sqlite:///data/sub/meta.db")
    try:
        assert isinstance(store, SqliteMetaStore)
        assert store.path == str(tmp_path / "data" / "sub" / "meta.db")
        await store.transact(lambda tr: tr.set(K, b"x"))
    finally:
        await store.close()
    assert (tmp_path / "data" / "sub" / "meta.db").is_file()


async def test_absolute_url_persists_across_reopen(tmp_path) -> None:
    url = f"sqlite:///{tmp_path}/abs/meta.db"
    assert url.startswith("sqlite:////")
    store = open_meta_store(url)
    await store.transact(lambda tr: tr.set(K, b"kept"))
    await store.close()
    reopened = open_meta_store(url)
    try:
        assert await reopened.get(K) == b"kept"
    finally:
        await reopened.close()


def test_wal_mode_and_full_sync_by_default(tmp_path) -> None:
    store = SqliteMetaStore(str(tmp_path / "m.db"))
    assert store.synchronous == "FULL"
    asyncio.run(store.close())
    conn = sqlite3.connect(tmp_path / "m.db")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()


def test_url_options(tmp_path) -> None:
    store = open_meta_store(
        f"sqlite:///{tmp_path}/o.db?synchronous=normal&begin=immediate&poll_interval=0.2"
    )
    assert (store.synchronous, store.begin) == ("NORMAL", "immediate")
    asyncio.run(store.close())


def test_unwritable_path_names_the_path(tmp_path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where a directory should be")
    bad = blocker / "meta" / "meta.db"
    with pytest.raises(MetaError, match="not-a-dir") as info:
        open_meta_store(f"sqlite:///{bad}")
    assert "\n" not in str(info.value)


def test_directory_as_database_path(tmp_path) -> None:
    (tmp_path / "dir.db").mkdir()
    with pytest.raises(MetaError, match="dir.db"):
        open_meta_store(f"sqlite:///{tmp_path}/dir.db")


@pytest.mark.parametrize(
    "url",
    [
        "",
        "meta.db",
        "redis://localhost/0",
        "sqlite://",
        "sqlite:///",
        "sqlite://host/meta.db",
        "sqlite:///data/",
        "sqlite:///x.db?bogus=1",
        "sqlite:///x.db?begin=sometimes",
        "sqlite:///x.db?synchronous=maybe",
        "memory://somewhere",
    ],
)
def test_bad_urls(url: str, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(MetaError) as info:
        open_meta_store(url)
    message = str(info.value)
    assert "\n" not in message and len(message) < 300
    assert repr(url) in message


def test_fdb_missing_cluster_file(tmp_path) -> None:
    with pytest.raises(MetaError, match="nowhere.cluster"):
        open_meta_store(f"fdb://{tmp_path}/nowhere.cluster")


def test_memory_url() -> None:
    assert isinstance(open_meta_store("memory://"), MemoryMetaStore)


@pytest.mark.parametrize("begin", BEGIN_MODES)
async def test_two_stores_one_file_no_lost_updates(tmp_path, begin: str) -> None:
    url = f"sqlite:///{tmp_path}/race.db?begin={begin}"
    a, b = open_meta_store(url), open_meta_store(url)
    try:
        n = 200
        await asyncio.gather(increment(a, K, n), increment(b, K, n))
        assert decode_int(await a.get(K)) == 2 * n
    finally:
        await a.close()
        await b.close()


def writing_elsewhere(path, value: int) -> sqlite3.Connection:
    """Another connection holding the write lock with ``K = value`` written, uncommitted."""
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    other.execute("INSERT OR REPLACE INTO kv VALUES (?, ?)", (K, encode_int(value)))
    return other


class RerunIncrement:
    """A transaction incrementing ``K`` and returning what it read; ``rerun`` is set once it
    runs a second time (after a conflict)."""

    def __init__(self) -> None:
        self.calls = 0
        self.rerun = threading.Event()

    def __call__(self, tr):
        self.calls += 1
        if self.calls >= 2:
            self.rerun.set()
        value = decode_int(tr.get(K))
        tr.set(K, encode_int(value + 1))
        return value


async def test_conflict_reruns_fn(tmp_path) -> None:
    """A deferred transaction that read a snapshot cannot write while another connection
    holds the write lock: it is rolled back and rerun until it gets through."""
    path = tmp_path / "c.db"
    store = SqliteMetaStore(str(path), begin="deferred")
    await store.transact(lambda tr: tr.set(K, encode_int(1)))
    other = writing_elsewhere(path, 10)
    fn = RerunIncrement()

    try:
        task = asyncio.create_task(store.transact(fn))
        assert await asyncio.to_thread(fn.rerun.wait, WAIT)
        other.execute("COMMIT")
        assert await asyncio.wait_for(task, WAIT) == 10  # saw the other commit: no lost update
        assert decode_int(await store.get(K)) == 11
        assert store.conflicts >= 1
    finally:
        other.close()
        await store.close()


async def test_retry_limit(tmp_path) -> None:
    path = tmp_path / "l.db"
    store = SqliteMetaStore(str(path), busy_timeout=0.01, retry_timeout=0.2)
    await store.transact(lambda tr: tr.set(K, b"x"))
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(RetryLimitExceeded, match="conflicting"):
            await store.transact(lambda tr: tr.set(K, b"y"))
    finally:
        other.execute("ROLLBACK")
        other.close()
    await store.transact(lambda tr: tr.set(K, b"z"))  # usable again
    assert await store.get(K) == b"z"
    await store.close()


async def test_a_locked_store_fails_a_transaction_within_its_retry_timeout(tmp_path) -> None:
    """Another process's exclusive lock: the wait is bounded by ``retry_timeout`` even when
    one busy wait (``busy_timeout``) would be longer, so a locked meta store makes durable
    writes fail in bounded time instead of hanging."""
    path = tmp_path / "locked.db"
    store = SqliteMetaStore(str(path), busy_timeout=30.0, retry_timeout=0.5)
    await store.transact(lambda tr: tr.set(K, b"x"))
    with meta_store_locked(path):
        started = time.monotonic()
        with pytest.raises(RetryLimitExceeded):
            await store.transact(lambda tr: tr.set(K, b"y"))
        assert time.monotonic() - started < 3
        assert await store.get(K) == b"x"  # reads still answer
    await store.transact(lambda tr: tr.set(K, b"z"))
    assert await store.get(K) == b"z"
    await store.close()


async def test_watch_sees_commit_from_another_store(tmp_path) -> None:
    url = f"sqlite:///{tmp_path}/w.db?poll_interval=0.01"
    watcher, writer = open_meta_store(url), open_meta_store(url)
    try:
        watch = await watcher.watch(K)
        await writer.transact(lambda tr: tr.set(K, b"from elsewhere"))
        await asyncio.wait_for(watch, WAIT)
    finally:
        await watcher.close()
        await writer.close()


async def test_a_read_runs_on_the_loop_and_sees_other_connections_commits(tmp_path) -> None:
    url = f"sqlite:///{tmp_path}/r.db"
    reader, writer = open_meta_store(url), open_meta_store(url)
    try:
        await writer.transact(lambda tr: tr.set(K, b"1"))
        threads: list[int] = []

        def fn(tr) -> bytes | None:
            threads.append(threading.get_ident())
            return tr.get(K)

        assert await reader.read(fn) == b"1"
        assert threads == [threading.get_ident()], "the read left the loop's thread"
        await writer.transact(lambda tr: tr.set(K, b"2"))
        assert await reader.read(fn) == b"2"
    finally:
        await reader.close()
        await writer.close()


async def test_a_read_answers_while_another_process_holds_the_lock(tmp_path) -> None:
    path = tmp_path / "locked.db"
    store = SqliteMetaStore(str(path))
    await store.transact(lambda tr: tr.set(K, b"x"))
    try:
        with meta_store_locked(path):
            assert await store.read(lambda tr: tr.get(K)) == b"x"
    finally:
        await store.close()


def test_a_read_from_another_thread_s_loop_takes_the_store_s_thread(tmp_path) -> None:
    store = SqliteMetaStore(str(tmp_path / "t.db"))
    asyncio.run(store.transact(lambda tr: tr.set(K, b"v")))
    asyncio.run(store.read(lambda tr: tr.get(K)))  # the reader belongs to this thread now
    answers: list[bytes | None] = []
    other = threading.Thread(
        target=lambda: answers.append(asyncio.run(store.read(lambda tr: tr.get(K))))
    )
    other.start()
    other.join(10)
    assert answers == [b"v"]
    asyncio.run(store.close())


async def test_closed_store(tmp_path) -> None:
    store = SqliteMetaStore(str(tmp_path / "x.db"))
    watch = await store.watch(K)
    await store.close()
    with pytest.raises(asyncio.CancelledError):
        await watch
    with pytest.raises(MetaError, match="closed"):
        await store.transact(lambda tr: tr.get(K))
    await store.close()  # idempotent


async def test_a_transaction_queued_from_a_thread_reruns_before_the_next_one(tmp_path) -> None:
    """``transact_from_thread`` (the batcher's flush thread): a conflict reruns in the store's
    thread, so a transaction queued after it sees its commit."""
    path = tmp_path / "q.db"
    store = SqliteMetaStore(str(path), begin="deferred")
    loop = asyncio.get_running_loop()
    await store.transact(lambda tr: tr.set(K, encode_int(1)))
    other = writing_elsewhere(path, 10)
    first = RerunIncrement()
    futures = [loop.create_future(), loop.create_future()]

    def queue_both() -> None:
        store.transact_from_thread(first, loop, futures[0])
        store.transact_from_thread(lambda tr: decode_int(tr.get(K)), loop, futures[1])

    try:
        await asyncio.to_thread(queue_both)
        assert await asyncio.to_thread(first.rerun.wait, WAIT)
        other.execute("COMMIT")
        assert await asyncio.wait_for(asyncio.gather(*futures), WAIT) == [10, 11]
    finally:
        other.close()
        await store.close()
