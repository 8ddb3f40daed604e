"""The flush thread: a flush's object write and its meta transaction back to back, off the
event loop, with one hand-off back to it (DESIGN.md §5).

On a store pair that allows it (an object store with blocking writes, ``thread_writer()``, and
a meta store that takes transactions from threads, ``transacts_from_threads``: the file
store and SQLite), a flush is one job of this thread: queue the transaction on the meta
store's thread, write the object, and take the next job.  The transaction's statements run
while the object is written and its COMMIT waits for the write's fdatasync (the write gate),
so one flush's write overlaps its own statements and the commit of the flush before (the
two-deep pipeline of the batcher), while the loop waits for one result instead of relaying
the transaction.  Jobs run one at a time in submission order and each hands its transaction
over before the next job starts, so flushes commit in the order they started without the
loop ordering them.  Measured as four thread
hand-offs per flush before (loop → object-store thread → loop → meta-store thread → loop),
each waiting for the GIL behind a busy loop: ``benchmarks/README.md``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from flowmq_commit.tasks import FaultHook, fault
from flowmq_meta import MetaStore, Transaction
from flowmq_objstore import ObjectStore, ObjectStoreError
from flowmq_objstore.api import ThreadWriter

log = logging.getLogger(__name__)

Txn = Callable[[Transaction], Any]
# How long a flush's transaction, its statements run, waits for the object write before it
# rolls back (holding SQLite's write lock meanwhile): the meta store's own retry bound.
WRITE_GATE_TIMEOUT_S = 5.0


class FlushThread:
    """One worker thread writing the batcher's objects and queueing its transactions."""

    def __init__(
        self, objects: ObjectStore, writer: ThreadWriter, meta: MetaStore, faults: FaultHook | None
    ) -> None:
        self._objects = objects
        self._writer = writer
        self._meta = meta
        self._faults = faults
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="flowmq-flush"
        )

    @classmethod
    def for_stores(
        cls, objects: ObjectStore, meta: MetaStore, faults: FaultHook | None
    ) -> FlushThread | None:
        """A flush thread for these stores, or None if either has only async calls (S3,
        FoundationDB, the test wrappers): the batcher then awaits each step on the loop."""
        writer = objects.thread_writer()
        if writer is None or not meta.transacts_from_threads:
            return None
        return cls(objects, writer, meta, faults)

    def writes_to(self, objects: ObjectStore) -> bool:
        return objects is self._objects

    def write_and_commit(
        self, key: str, body: bytes, txn: Txn, on_written: Callable[[float], None]
    ) -> asyncio.Future[Any]:
        """Write ``body`` under ``key`` and commit ``txn`` once the write is durable (its
        statements run beside the write); the future resolves to the transaction's result.
        ``on_written(seconds)`` is called on the loop once the write is done (the batcher may
        start the next flush then); if the write fails, the transaction rolls back and the
        future fails."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._submit(loop, future, self._write_and_commit, loop, future, key, body, txn, on_written)
        return future

    def commit(self, txn: Txn) -> asyncio.Future[Any]:
        """Commit ``txn`` (a flush without bytes) in order with the flushes around it."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._submit(loop, future, self._meta.transact_from_thread, txn, loop, future)
        return future

    def create_ahead(self, keys: list[str]) -> None:
        """Create the objects of ``keys`` (their intents committed) after the jobs submitted
        before, so the flushes that take these keys later only write and fdatasync."""
        with contextlib.suppress(RuntimeError):  # shut down
            self._executor.submit(self._create_ahead, keys)

    def _create_ahead(self, keys: list[str]) -> None:
        try:
            self._writer.reserve_blocking(keys)
        except Exception:
            log.warning(
                "could not create objects ahead; their flushes write them whole", exc_info=True
            )

    async def idle(self) -> None:
        """Wait until the jobs submitted so far (objects being created ahead) are done."""
        with contextlib.suppress(RuntimeError):  # shut down
            await asyncio.get_running_loop().run_in_executor(self._executor, lambda: None)

    def close(self) -> None:
        """Stop after the jobs already submitted (the batcher has awaited them)."""
        self._executor.shutdown(wait=False)

    def _submit(
        self, loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any], *job: Any
    ) -> None:
        try:
            self._executor.submit(*job)
        except RuntimeError as exc:  # shut down
            future.set_exception(exc)

    def _write_and_commit(
        self,
        loop: asyncio.AbstractEventLoop,
        future: asyncio.Future[Any],
        key: str,
        body: bytes,
        txn: Txn,
        on_written: Callable[[float], None],
    ) -> None:
        """In the flush thread: the transaction is queued first and commits only once the
        write is durable, so its statements (and the meta thread's wake-up) overlap the
        write and its fdatasync instead of following them."""
        gate = WriteGate()
        try:
            self._meta.transact_from_thread(txn, loop, future, gate.wait)
        except BaseException as exc:  # never leave the flush's waiters hanging
            loop.call_soon_threadsafe(_fail, future, exc)
            return
        try:
            started = time.perf_counter()
            self._writer.write_blocking(key, body)
            fault(self._faults, "flush.after_put")
        except BaseException as exc:
            gate.open(exc)
            loop.call_soon_threadsafe(_fail, future, exc)
            return
        gate.open(None)
        loop.call_soon_threadsafe(on_written, time.perf_counter() - started)


class WriteGate:
    """A flush's object write as its transaction waits for it before COMMIT (in the meta
    thread): done, or failed with the write's error, which rolls the transaction back."""

    __slots__ = ("_done", "_error")

    def __init__(self) -> None:
        self._done = threading.Event()
        self._error: BaseException | None = None

    def open(self, error: BaseException | None) -> None:
        self._error = error
        self._done.set()

    def wait(self) -> None:
        if not self._done.wait(WRITE_GATE_TIMEOUT_S):
            raise ObjectStoreError(
                f"a flush's object write took over {WRITE_GATE_TIMEOUT_S:g} s; its "
                "transaction is rolled back"
            )
        if self._error is not None:
            raise self._error


def _fail(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
