"""``sqlite:///path`` — the embedded meta store: one SQLite file in WAL mode, shared safely by
several broker processes on one host.

Threading.  sqlite3 calls block, so each store owns ONE worker thread with its own connection
(``isolation_level=None``, explicit ``BEGIN``/``COMMIT``); ``transact`` ships ``fn`` to it and
awaits the result, and the event loop never blocks.  Transactions of one store are therefore
serialized in that thread and never conflict with each other; conflicts only come from other
connections (other processes, or other stores on the same file).  ``transact_from_thread``
queues a transaction from another thread (the batcher's flush thread, before its object
write, with a ``before_commit`` that waits for the write) without a hop through the event
loop; it reruns conflicts in the worker thread itself, so transactions queued after it never
commit before it.

Isolation.  SQLite serializes writers on the WAL write lock, and a transaction that read a
snapshot older than the latest commit cannot upgrade to a writer (SQLITE_BUSY_SNAPSHOT) —
which is exactly FoundationDB's optimistic-conflict rule, at whole-database granularity.  So
reads go straight to SQLite, point writes and adds are kept in the transaction (reads see
them) and applied in a few statements once ``fn`` returns (``_SqliteTransaction.apply``; a
range read or clear applies them first), and any SQLITE_BUSY/LOCKED rolls back and reruns
``fn`` after a jittered backoff.  ``add`` is a read-modify-write inside the transaction, the
reads of all the adds to keys it has not read done in one statement.  Why keep them: the
sqlite3 module gives up the GIL for every statement, and a store thread waits to get it back
behind a busy event loop; a flush's transaction was nine statements and is five.

``BEGIN`` mode (``begin=`` URL option):
- ``deferred``: plain BEGIN.  Read-only transactions never take the write lock; a writer that
  loses a race finds out at its first write and reruns, and may keep losing (no queueing).
- ``immediate``: BEGIN IMMEDIATE takes the write lock up front and waits for it in SQLite's
  busy handler — no reruns, but read-only transactions serialize on the lock too.
- ``adaptive`` (default): the first attempt is deferred, every rerun is IMMEDIATE.  Readers
  stay concurrent, and a writer that lost once queues on the lock instead of losing again.
Measured with ``benchmarks/meta_txn.py`` (2 CPUs, ext4 on virtio, median of 3 x 3 s; the
transaction gets a counter, sets it + 1 and sets one small key):
- writers only, FULL: all three modes ~4.6-5.0k txn/s in one process, ~5.1-5.3k total with
  two processes (bound by the fsync); NORMAL: ~11k and ~13-14k; differences are within noise,
  and reruns stay under 0.05 per transaction.
- one writer process + one read-only process (FULL): deferred 5.6k writes/s + 26k reads/s,
  adaptive 5.7k + 27k, immediate 4.8k + 0.96k — IMMEDIATE starves readers.
Hence adaptive: the readers' behaviour of deferred with a bound on repeated losses.

Durability.  ``synchronous=FULL`` (default): the WAL is fsynced at every commit, so a
transaction that returned survives an OS crash or power loss, which acknowledged messages
require.  It costs about 100 us per commit here (5k vs 11k txn/s single-process with
``NORMAL``).  ``NORMAL`` in WAL mode survives a process crash (SIGKILL) but may lose the last
commits on an OS crash; it is accepted as a URL option for tests and benchmarks only.

Locked store.  Another process holding the write lock (a backup, an operator's ``sqlite3``
shell, a stuck broker) makes writers wait in SQLite's busy handler (``busy_timeout`` per
attempt) and rerun; ``retry_timeout`` bounds the whole wait, busy waits included, after which
the transaction fails with ``RetryLimitExceeded`` (a ``MetaError``: the commit engine then
refuses durable writes fast until the store answers again).  Every transaction of a store
runs in its one thread, so the bound is also how long a locked file can stall the broker's
reads; the defaults (1 s and 5 s) keep that short without failing under ordinary contention,
whose waits are milliseconds.

Reads on the loop.  ``read`` (a transaction that only reads) runs on the event loop's own
thread with a read-only connection of its own and a busy timeout of 0: WAL readers never wait
for the writer, and a Fetch's few reads take tens of microseconds there, where the hop to the
store's thread and back waited for the GIL behind the loop.  A read SQLite cannot answer at
once, or from another thread's loop, goes through the store's thread.

Watches.  Other processes' commits are invisible to this process, so watched keys are polled
(one query for all of them, every ``poll_interval`` s, only while watches exist); commits made
through this store notify watches at once, from the values the transaction wrote, and so do
those the batcher's flush process makes for it (``committed_elsewhere``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar
from urllib.parse import parse_qsl

from flowmq_meta._base import (
    ChangeTracker,
    GuardedTransaction,
    ValueWatch,
    WatchRegistry,
    add_int,
    backoff_delay,
    reject_coroutine,
)
from flowmq_meta.api import (
    MetaError,
    MetaStore,
    ReadOnlyTransaction,
    RetryLimitExceeded,
    Transaction,
    TransactionConflict,
)

T = TypeVar("T")

BEGIN_MODES = ("deferred", "immediate", "adaptive")
SYNCHRONOUS_MODES = ("OFF", "NORMAL", "FULL", "EXTRA")
# See the module docstring for the measurements behind this choice.
DEFAULT_BEGIN = "adaptive"
DEFAULT_BUSY_TIMEOUT_S = 1.0
DEFAULT_RETRY_TIMEOUT_S = 5.0

_BUSY_CODES = (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
_POLL_CHUNK = 500  # bound the number of SQL variables per poll query
# Rows per statement of a transaction's kept writes: 2 variables each, under SQLite's
# smallest limit on variables (999 before 3.32).
_BATCH_ROWS = 400


def _is_busy(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return (code & 0xFF) in _BUSY_CODES
    return "locked" in str(exc) or "busy" in str(exc)


class _SqliteTransaction(GuardedTransaction):
    """Reads go to SQLite at once; point writes and adds are kept and applied together
    before the commit (``apply``; the module docstring's "Isolation" says why)."""

    def __init__(self, conn: sqlite3.Connection, path: str) -> None:
        super().__init__()
        self._conn = conn
        self._path = path
        self.tracker = ChangeTracker()
        self.watches: list[ValueWatch] = []
        # Set when SQLite reported a conflict, so the attempt is rerun even if ``fn`` caught
        # the TransactionConflict we raised.
        self.conflict = False
        # Point writes not yet applied: the value, or None for a clear; and the deltas of
        # adds to keys whose value this transaction has not seen yet.
        self._writes: dict[bytes, bytes | None] = {}
        self._adds: dict[bytes, int] = {}

    def _execute(self, sql: str, params: Sequence[Any]) -> sqlite3.Cursor:
        try:
            return self._conn.execute(sql, params)
        except sqlite3.Error as exc:
            if isinstance(exc, sqlite3.OperationalError) and _is_busy(exc):
                self.conflict = True
                raise TransactionConflict(f"{self._path}: {exc}") from exc
            raise MetaError(f"SQLite meta store {self._path}: {exc}") from exc

    def _read(self, key: bytes) -> bytes | None:
        row = self._execute("SELECT value FROM kv WHERE key = ?", (key,)).fetchone()
        return None if row is None else row[0]

    def _get(self, key: bytes) -> bytes | None:
        writes = self._writes
        if key in writes:
            return writes[key]
        value = self._read(key)
        delta = self._adds.pop(key, None)
        if delta is not None:
            value = add_int(value, delta)
            writes[key] = value
            self.tracker.wrote(key, value)
        return value

    def _get_range(
        self, begin: bytes, end: bytes, limit: int, reverse: bool
    ) -> list[tuple[bytes, bytes]]:
        self.apply()
        sql = "SELECT key, value FROM kv WHERE key >= ? AND key < ? ORDER BY key"
        if reverse:
            sql += " DESC"
        params: tuple[Any, ...] = (begin, end)
        if limit:
            sql += " LIMIT ?"
            params = (begin, end, limit)
        return self._execute(sql, params).fetchall()

    def _set(self, key: bytes, value: bytes) -> None:
        self._writes[key] = value
        self._adds.pop(key, None)
        self.tracker.wrote(key, value)

    def _clear(self, key: bytes) -> None:
        self._writes[key] = None
        self._adds.pop(key, None)
        self.tracker.wrote(key, None)

    def _clear_range(self, begin: bytes, end: bytes) -> None:
        self.apply()
        self._execute("DELETE FROM kv WHERE key >= ? AND key < ?", (begin, end))
        self.tracker.cleared_range(begin, end)

    def _add(self, key: bytes, param: bytes, delta: int) -> None:
        writes = self._writes
        if key in writes:
            value = add_int(writes[key], delta)
            writes[key] = value
            self.tracker.wrote(key, value)
        else:
            self._adds[key] = self._adds.get(key, 0) + delta

    def _watch(self, key: bytes) -> ValueWatch:
        watch = ValueWatch(key, self._get(key))
        self.watches.append(watch)
        return watch

    def apply(self) -> None:
        """Write what the transaction has kept: the adds' keys read in one statement, then
        the values in one (or a few) and the clears in one (or a few)."""
        adds = self._adds
        if adds:
            keys = list(adds)
            found: dict[bytes, bytes] = {}
            for chunk in _chunks(keys, _BATCH_ROWS):
                marks = ",".join("?" * len(chunk))
                rows = self._execute(f"SELECT key, value FROM kv WHERE key IN ({marks})", chunk)
                found.update(rows.fetchall())
            for key in keys:
                value = add_int(found.get(key), adds[key])
                self._writes[key] = value
                self.tracker.wrote(key, value)
            adds.clear()
        writes = self._writes
        if not writes:
            return
        values = [(key, value) for key, value in writes.items() if value is not None]
        cleared = [key for key, value in writes.items() if value is None]
        writes.clear()
        for rows in _chunks(values, _BATCH_ROWS):
            marks = ",".join(("(?, ?)",) * len(rows))
            params = [item for row in rows for item in row]
            self._execute(f"INSERT OR REPLACE INTO kv (key, value) VALUES {marks}", params)
        for chunk in _chunks(cleared, _BATCH_ROWS):
            marks = ",".join("?" * len(chunk))
            self._execute(f"DELETE FROM kv WHERE key IN ({marks})", chunk)


def _chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def _settle(future: Any, result: Any, exc: BaseException | None) -> None:
    if future.done():  # cancelled meanwhile
        return
    if exc is None:
        future.set_result(result)
    else:
        future.set_exception(exc)


class SqliteMetaStore(MetaStore):
    """Meta store in one SQLite file; see the module docstring for the design."""

    transacts_from_threads = True

    def __init__(
        self,
        path: str,
        *,
        url: str | None = None,
        synchronous: str = "FULL",
        begin: str = DEFAULT_BEGIN,
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT_S,
        retry_timeout: float = DEFAULT_RETRY_TIMEOUT_S,
        poll_interval: float = 0.05,
    ) -> None:
        """Open (creating if needed) the database at ``path``.  Blocks briefly: call it at
        start-up.  Raises ``MetaError`` naming the path if it cannot be opened for writing."""
        synchronous = synchronous.upper()
        if synchronous not in SYNCHRONOUS_MODES:
            raise MetaError(f"sqlite synchronous must be one of {SYNCHRONOUS_MODES}")
        if begin not in BEGIN_MODES:
            raise MetaError(f"sqlite begin mode must be one of {BEGIN_MODES}")
        self.path = os.path.abspath(path)
        self.url = url or f"sqlite:///{self.path}"
        self.synchronous = synchronous
        self.begin = begin
        self._busy_timeout = busy_timeout
        self._retry_timeout = retry_timeout
        self._poll_interval = poll_interval
        self._watches = WatchRegistry()
        self._poller: asyncio.Task[None] | None = None
        self._closed = False
        self._conn: sqlite3.Connection | None = None
        # ``read``'s connection, used on the event loop's thread only.
        self._reader: sqlite3.Connection | None = None
        self._reader_failed = False
        self._reader_thread = 0
        # Reruns of fn after a conflict, for metrics and benchmarks.
        self.conflicts = 0

        parent = os.path.dirname(self.path)
        try:
            os.makedirs(parent, exist_ok=True)
        except OSError as exc:
            raise MetaError(
                f"cannot create directory {parent!r} for SQLite meta store {self.path!r}: "
                f"{exc.strerror or exc}"
            ) from exc
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="flowmq-meta-sqlite"
        )
        try:
            self._executor.submit(self._open).result()
        except BaseException:
            self._executor.shutdown(wait=False)
            raise

    @classmethod
    def from_url(cls, url: str) -> SqliteMetaStore:
        """``sqlite:///relative.db`` or ``sqlite:////absolute.db`` (SQLAlchemy's convention),
        optionally ``?synchronous=FULL&begin=adaptive&busy_timeout=5&poll_interval=0.05``."""
        prefix = "sqlite:///"
        if not url.lower().startswith(prefix):
            raise MetaError(
                f"malformed meta store URL {url!r}: expected sqlite:///relative/path.db "
                "or sqlite:////absolute/path.db"
            )
        path, _, query = url[len(prefix) :].partition("?")
        if not path or path.endswith("/") or path == ":memory:":
            raise MetaError(f"malformed meta store URL {url!r}: it names no database file")
        options: dict[str, Any] = {}
        for name, value in parse_qsl(query, keep_blank_values=True):
            try:
                if name == "synchronous" and value.upper() in SYNCHRONOUS_MODES:
                    options[name] = value.upper()
                elif name == "begin" and value.lower() in BEGIN_MODES:
                    options[name] = value.lower()
                elif name in ("busy_timeout", "retry_timeout", "poll_interval"):
                    options[name] = float(value)
                elif name in ("synchronous", "begin"):
                    choices = SYNCHRONOUS_MODES if name == "synchronous" else BEGIN_MODES
                    raise MetaError(f"{name} must be one of {', '.join(choices)}")
                else:
                    raise MetaError(f"unknown option {name!r}")
            except (ValueError, MetaError) as exc:
                raise MetaError(f"malformed meta store URL {url!r}: {exc}") from None
        return cls(path, url=url, **options)

    # -- worker-thread side ---------------------------------------------------------------
    def _open(self) -> None:
        # Switching a new file to WAL needs an exclusive lock and SQLite reports BUSY at once,
        # without its busy handler, when another process is doing the same: retry that here.
        deadline = time.monotonic() + max(self._busy_timeout, 1.0)
        attempt = 0
        while True:
            try:
                self._conn = self._connect()
                return
            except sqlite3.OperationalError as exc:
                attempt += 1
                if not _is_busy(exc) or time.monotonic() > deadline:
                    raise MetaError(
                        f"cannot open SQLite meta store {self.path!r} for writing: {exc}"
                    ) from exc
                time.sleep(backoff_delay(attempt, cap=0.1))
            except sqlite3.Error as exc:
                raise MetaError(
                    f"cannot open SQLite meta store {self.path!r} for writing: {exc}"
                ) from exc

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, timeout=self._busy_timeout)
        try:
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise MetaError(
                    f"SQLite meta store {self.path!r}: cannot use WAL mode (got {mode!r}); "
                    "the file system must support shared memory"
                )
            conn.execute(f"PRAGMA synchronous={self.synchronous}")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS kv (key BLOB PRIMARY KEY, value BLOB NOT NULL) "
                "WITHOUT ROWID"
            )
        except BaseException:
            conn.close()
            raise
        return conn

    def _attempt(
        self,
        fn: Callable[[Transaction], T],
        immediate: bool,
        busy_s: float,
        before_commit: Callable[[], None] | None = None,
    ) -> tuple[T, Any]:
        """One run of ``fn``; ``busy_s``: how long SQLite may wait for the lock in it."""
        conn = self._conn
        assert conn is not None
        shortened = busy_s < self._busy_timeout
        if shortened:  # the last attempt before the deadline: wait only for what is left
            conn.execute(f"PRAGMA busy_timeout={int(busy_s * 1000)}")
        try:
            return self._run(conn, fn, immediate, before_commit)
        finally:
            if shortened:
                conn.execute(f"PRAGMA busy_timeout={int(self._busy_timeout * 1000)}")

    def _run(
        self,
        conn: sqlite3.Connection,
        fn: Callable[[Transaction], T],
        immediate: bool,
        before_commit: Callable[[], None] | None,
    ) -> tuple[T, Any]:
        try:
            conn.execute("BEGIN IMMEDIATE" if immediate else "BEGIN")
        except sqlite3.Error as exc:
            if isinstance(exc, sqlite3.OperationalError) and _is_busy(exc):
                raise TransactionConflict(f"{self.path}: {exc}") from exc
            raise MetaError(f"SQLite meta store {self.path}: {exc}") from exc
        tr = _SqliteTransaction(conn, self.path)
        try:
            result = fn(tr)
            reject_coroutine(result)
            if tr.conflict:
                raise TransactionConflict(f"{self.path}: conflict swallowed by fn")
            tr.apply()
            if before_commit is not None:
                before_commit()
            conn.execute("COMMIT")
        except BaseException as exc:
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            if tr.conflict:
                raise TransactionConflict(f"{self.path}: {exc}") from exc
            if isinstance(exc, sqlite3.OperationalError) and _is_busy(exc):
                raise TransactionConflict(f"{self.path}: {exc}") from exc
            if isinstance(exc, sqlite3.Error):
                raise MetaError(f"SQLite meta store {self.path}: {exc}") from exc
            raise
        finally:
            tr._finish()
        return result, tr

    def _read_keys(self, keys: list[bytes]) -> dict[bytes, bytes]:
        conn = self._conn
        assert conn is not None
        found: dict[bytes, bytes] = {}
        for chunk in _chunks(keys, _POLL_CHUNK):
            marks = ",".join("?" * len(chunk))
            rows = conn.execute(f"SELECT key, value FROM kv WHERE key IN ({marks})", chunk)
            found.update(rows.fetchall())
        return found

    def _close_conn(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _mode(self, attempt: int, deadline: float) -> tuple[bool, float]:
        """Attempt ``attempt``'s BEGIN mode (True: IMMEDIATE) and how long it may wait in
        SQLite's busy handler."""
        if self._closed:
            raise MetaError(f"meta store {self.url} is closed")
        immediate = self.begin == "immediate" or (self.begin == "adaptive" and attempt > 0)
        return immediate, max(0.0, min(self._busy_timeout, deadline - time.monotonic()))

    def _rerun_delay(self, attempt: int, deadline: float, exc: TransactionConflict) -> float:
        """After conflict number ``attempt``: the pause before the rerun, or
        ``RetryLimitExceeded`` once the deadline has passed."""
        self.conflicts += 1
        if time.monotonic() >= deadline:
            raise RetryLimitExceeded(
                f"transaction on {self.path} still conflicting after {attempt} "
                f"attempts in {self._retry_timeout:g} s: {exc}"
            ) from exc
        # After a lost race the IMMEDIATE rerun waits in SQLite's busy handler, so it needs
        # no sleep of ours; the other modes back off.
        return 0.0 if self.begin == "adaptive" and attempt == 1 else backoff_delay(attempt)

    def _transact_here(
        self, fn: Callable[[Transaction], T], before_commit: Callable[[], None] | None = None
    ) -> tuple[T, Any]:
        """``transact``'s loop run in the worker thread itself (reruns included, so nothing
        queued after it can commit first)."""
        deadline = time.monotonic() + self._retry_timeout
        attempt = 0
        while True:
            immediate, busy_s = self._mode(attempt, deadline)
            try:
                return self._attempt(fn, immediate, busy_s, before_commit)
            except TransactionConflict as exc:
                attempt += 1
                time.sleep(self._rerun_delay(attempt, deadline, exc))

    def transact_in_thread(
        self, fn: Callable[[Transaction], T], before_commit: Callable[[], None] | None = None
    ) -> concurrent.futures.Future[tuple[T, ChangeTracker]]:
        """``transact`` for a process without an event loop (the batcher's flush process):
        the future resolves to the result and what the transaction changed, which the
        process that owns the watches hands to ``committed_elsewhere``."""

        def run() -> tuple[T, ChangeTracker]:
            result, tr = self._transact_here(fn, before_commit)
            return result, tr.tracker

        return self._executor.submit(run)

    # -- event-loop side --------------------------------------------------------------------
    async def read(self, fn: Callable[[Transaction], T]) -> T:
        """On the event loop's own thread, with a connection of its own (SQLite's WAL
        readers never wait for the writer): a Fetch's few point and range reads take tens of
        microseconds there, where a hop to the store's thread and back waited for the GIL
        behind the loop (``benchmarks/README.md``, Streams).  A read SQLite cannot answer at
        once (the WAL being recovered) goes through ``transact``."""
        conn = self._loop_reader()
        if conn is None:
            return await super().read(fn)
        tr = _SqliteTransaction(conn, self.path)
        try:
            conn.execute("BEGIN")
            try:
                result = fn(ReadOnlyTransaction(tr))
            finally:
                conn.execute("ROLLBACK")
        except (TransactionConflict, sqlite3.OperationalError):
            return await super().read(fn)
        except sqlite3.Error as exc:
            raise MetaError(f"SQLite meta store {self.path}: {exc}") from exc
        finally:
            tr._finish()
        reject_coroutine(result)
        if tr.watches:
            self._committed(asyncio.get_running_loop(), tr)
        return result

    def _loop_reader(self) -> sqlite3.Connection | None:
        """The loop thread's read connection (opened on first use; None once closed or if
        it cannot be opened: reads then take the store's thread)."""
        if self._reader is None and not self._closed and not self._reader_failed:
            try:
                # Never wait in SQLite's busy handler on the loop: such a read falls back.
                conn = sqlite3.connect(self.path, isolation_level=None, timeout=0)
                conn.execute("PRAGMA query_only=1")
                self._reader = conn
                self._reader_thread = threading.get_ident()
            except sqlite3.Error:
                self._reader_failed = True
        if self._reader_thread != threading.get_ident():  # another thread's loop
            return None
        return self._reader

    def committed_elsewhere(self, changes: ChangeTracker) -> None:
        """Fire the watches a transaction committed by another process on this process's
        behalf touched (``transact_blocking``), at once rather than at the next poll."""
        self._watches.notify_commit(changes)

    async def transact(self, fn: Callable[[Transaction], T]) -> T:
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + self._retry_timeout
        attempt = 0
        while True:
            immediate, busy_s = self._mode(attempt, deadline)
            try:
                result, tr = await loop.run_in_executor(
                    self._executor, self._attempt, fn, immediate, busy_s
                )
            except TransactionConflict as exc:
                attempt += 1
                delay = self._rerun_delay(attempt, deadline, exc)
                if delay:
                    await asyncio.sleep(delay)
                continue
            self._committed(loop, tr)
            return result

    def transact_from_thread(
        self,
        fn: Callable[[Transaction], Any],
        loop: asyncio.AbstractEventLoop,
        future: Any,
        before_commit: Callable[[], None] | None = None,
    ) -> None:
        def run() -> None:
            try:
                result, tr = self._transact_here(fn, before_commit)
            except BaseException as exc:
                loop.call_soon_threadsafe(_settle, future, None, exc)
                return
            loop.call_soon_threadsafe(self._settle_committed, loop, future, result, tr)

        try:
            self._executor.submit(run)
        except RuntimeError as exc:  # shut down
            loop.call_soon_threadsafe(_settle, future, None, MetaError(f"{self.url}: {exc}"))

    def _settle_committed(
        self, loop: asyncio.AbstractEventLoop, future: Any, result: Any, tr: Any
    ) -> None:
        self._committed(loop, tr)
        _settle(future, result, None)

    def _committed(self, loop: asyncio.AbstractEventLoop, tr: _SqliteTransaction) -> None:
        """On the loop after a commit: fire and arm the watches it touched."""
        self._watches.notify_commit(tr.tracker)
        if tr.watches:
            for watch in tr.watches:
                self._watches.activate(loop, watch, tr.tracker)
            self._ensure_poller(loop)

    def _ensure_poller(self, loop: asyncio.AbstractEventLoop) -> None:
        if len(self._watches) and (self._poller is None or self._poller.done()):
            self._poller = loop.create_task(self._poll(), name=f"meta-watch-poll {self.path}")

    async def _poll(self) -> None:
        """Catch changes committed by other connections: results come back through the same
        worker thread as transactions, so they are ordered with watch activations and a poll
        can never compare a watch against data older than what its transaction saw."""
        loop = asyncio.get_running_loop()
        while len(self._watches) and not self._closed:
            await asyncio.sleep(self._poll_interval)
            keys = self._watches.keys()
            if not keys or self._closed:
                break
            try:
                found = await loop.run_in_executor(self._executor, self._read_keys, keys)
            except (sqlite3.Error, RuntimeError):
                # Busy or shutting down: the next round retries; close() ends the loop.
                continue
            for key in keys:
                self._watches.notify(key, found.get(key))

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._watches.cancel_all()
        if self._reader is not None:
            with contextlib.suppress(sqlite3.Error):  # (closed from another thread: GC's)
                self._reader.close()
            self._reader = None
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
        loop = asyncio.get_running_loop()
        # Queued behind any running transaction, so those finish first.
        await loop.run_in_executor(self._executor, self._close_conn)
        self._executor.shutdown(wait=False)

    def __repr__(self) -> str:
        return f"SqliteMetaStore({self.path!r}, begin={self.begin}, synchronous={self.synchronous})"
