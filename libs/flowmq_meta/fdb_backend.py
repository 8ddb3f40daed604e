"""``fdb://<cluster file>`` — the production meta store on FoundationDB (``fdb://`` alone uses
the default cluster file).

The official bindings block, so transactions run in a thread pool with the same retry loop
as ``@fdb.transactional`` (``tr.on_error`` decides what is retryable and backs off).  The
bindings need the native client (libfdb_c); it is loaded lazily so this module, and the
pure-Python ``fdb.tuple`` used for keys, import without it.

Note: the ``foundationdb`` wheel's header API version must be supported by the installed
libfdb_c (bindings 8.0 need a client that speaks API 800); we select API 710 at run time so the
same code runs against 7.1+ clusters.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import time
from collections.abc import Callable
from typing import Any, TypeVar

from flowmq_meta._base import FutureWatch, GuardedTransaction, reject_coroutine
from flowmq_meta.api import (
    KeyTooLarge,
    MetaError,
    MetaStore,
    RetryLimitExceeded,
    Transaction,
    TransactionTooLarge,
    ValueTooLarge,
)

T = TypeVar("T")

API_VERSION = 710

# FoundationDB error codes we translate into our own exceptions.
_TRANSACTION_TIMED_OUT = 1031
_OPERATION_CANCELLED = 1101
_TRANSACTION_TOO_LARGE = 2101
_KEY_TOO_LARGE = 2102
_VALUE_TOO_LARGE = 2103


def load_fdb() -> Any:
    """Import the bindings and select the API version, or explain what is missing."""
    try:
        import fdb
    except ImportError as exc:  # pragma: no cover - it is a project dependency
        raise MetaError("the 'foundationdb' Python package is not installed") from exc
    try:
        if not fdb.is_api_version_selected():
            fdb.api_version(API_VERSION)
        elif fdb.get_api_version() < 630:
            raise MetaError(
                f"FoundationDB API version {fdb.get_api_version()} already selected in this "
                f"process; need >= 630"
            )
    except MetaError:
        raise
    except Exception as exc:
        raise MetaError(
            "FoundationDB native client (libfdb_c) is not usable: "
            f"{exc} — install the foundationdb-clients package matching the bindings"
        ) from exc
    return fdb


def _translate(fdb: Any, exc: Exception) -> MetaError:
    code = getattr(exc, "code", None)
    desc = f"FoundationDB error {code}: {exc}"
    if code == _TRANSACTION_TOO_LARGE:
        return TransactionTooLarge(desc)
    if code == _KEY_TOO_LARGE:
        return KeyTooLarge(desc)
    if code == _VALUE_TOO_LARGE:
        return ValueTooLarge(desc)
    if code == _TRANSACTION_TIMED_OUT:
        return RetryLimitExceeded(
            f"{desc} (transaction did not commit in time: cluster unreachable or contention)"
        )
    return MetaError(desc)


class FdbWatch(FutureWatch):
    """Wraps the bindings' watch future; FoundationDB itself tracks the value."""

    def __init__(self, key: bytes, fdb_future: Any) -> None:
        super().__init__(key)
        self._fdb_future = fdb_future

    def _activate(self, loop: asyncio.AbstractEventLoop, fdb: Any) -> None:
        self._attach(loop.create_future())

        def resolve(_: Any) -> None:
            # Runs on the event loop (scheduled from the network thread below).
            if self.done():
                return
            try:
                self._fdb_future.wait()
            except fdb.FDBError as exc:
                if exc.code == _OPERATION_CANCELLED:
                    self.cancel()
                else:
                    self._fail(_translate(fdb, exc))
                return
            self._fire()

        def on_ready(fut: Any) -> None:
            # FoundationDB's network thread: hand over to the loop, never touch it here.
            try:
                loop.call_soon_threadsafe(resolve, fut)
            except RuntimeError:
                pass  # loop closed: nobody is waiting any more

        self._fdb_future.on_ready(on_ready)

    def _on_done(self, future: asyncio.Future[None]) -> None:
        # Cancelled (or timed out by wait_for): release the server-side watch.
        if future.cancelled():
            self._fdb_future.cancel()


class _FdbTransaction(GuardedTransaction):
    def __init__(self, tr: Any, fdb: Any) -> None:
        super().__init__()
        self._tr = tr
        self._fdb = fdb
        self.watches: list[FdbWatch] = []

    def _get(self, key: bytes) -> bytes | None:
        return self._tr.get(key).value

    def _get_range(
        self, begin: bytes, end: bytes, limit: int, reverse: bool
    ) -> list[tuple[bytes, bytes]]:
        kvs = self._tr.get_range(begin, end, limit=limit, reverse=reverse).to_list()
        return [(kv.key, kv.value) for kv in kvs]

    def _set(self, key: bytes, value: bytes) -> None:
        self._tr.set(key, value)

    def _clear(self, key: bytes) -> None:
        self._tr.clear(key)

    def _clear_range(self, begin: bytes, end: bytes) -> None:
        self._tr.clear_range(begin, end)

    def _add(self, key: bytes, param: bytes, delta: int) -> None:
        self._tr.add(key, param)

    def _watch(self, key: bytes) -> FdbWatch:
        watch = FdbWatch(key, self._tr.watch(key))
        self.watches.append(watch)
        return watch

    def discard_watches(self) -> None:
        for watch in self.watches:
            watch._fdb_future.cancel()


class FdbMetaStore(MetaStore):
    def __init__(
        self,
        cluster_file: str | None = None,
        *,
        url: str | None = None,
        threads: int = 16,
        timeout: float = 30.0,
    ) -> None:
        """``timeout`` bounds one ``transact`` including retries (FoundationDB's transaction
        timeout option), so an unreachable cluster fails instead of hanging forever."""
        self.url = url or f"fdb://{cluster_file or ''}"
        if cluster_file is not None and not os.path.isfile(cluster_file):
            raise MetaError(f"FoundationDB cluster file {cluster_file!r} does not exist")
        self._fdb = load_fdb()
        try:
            self._db = self._fdb.open(cluster_file)
            self._db.options.set_transaction_timeout(int(timeout * 1000))
        except self._fdb.FDBError as exc:
            raise MetaError(
                f"cannot open FoundationDB cluster {cluster_file or '(default cluster file)'}: "
                f"{exc}"
            ) from exc
        self._timeout = timeout
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=threads, thread_name_prefix="flowmq-meta-fdb"
        )
        self._closed = False

    @classmethod
    def from_url(cls, url: str) -> FdbMetaStore:
        prefix = "fdb://"
        if not url.lower().startswith(prefix):
            raise MetaError(f"malformed meta store URL {url!r}: expected fdb://[cluster file]")
        return cls(url[len(prefix) :] or None, url=url)

    def _run(self, fn: Callable[[Transaction], T]) -> tuple[T, list[FdbWatch]]:
        fdb = self._fdb
        tr = self._db.create_transaction()
        started = time.monotonic()
        while True:
            adapter = _FdbTransaction(tr, fdb)
            try:
                result = fn(adapter)
                reject_coroutine(result)
                tr.commit().wait()
                return result, adapter.watches
            except fdb.FDBError as exc:
                adapter.discard_watches()
                try:
                    tr.on_error(exc.code).wait()
                except fdb.FDBError as final:
                    raise _translate(fdb, final) from final
                if time.monotonic() - started > self._timeout:
                    raise RetryLimitExceeded(
                        f"FoundationDB transaction kept conflicting for {self._timeout:g} s"
                    ) from exc
            except BaseException:
                adapter.discard_watches()
                raise
            finally:
                adapter._finish()

    async def transact(self, fn: Callable[[Transaction], T]) -> T:
        if self._closed:
            raise MetaError(f"meta store {self.url} is closed")
        loop = asyncio.get_running_loop()
        result, watches = await loop.run_in_executor(self._executor, self._run, fn)
        for watch in watches:
            watch._activate(loop, self._fdb)
        return result

    async def close(self) -> None:
        # The bindings' network thread is process-wide and stops at exit; only our pool ends.
        self._closed = True
        self._executor.shutdown(wait=False)

    def __repr__(self) -> str:
        return f"FdbMetaStore({self.url!r})"
