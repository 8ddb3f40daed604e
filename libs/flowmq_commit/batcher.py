"""The per-broker group-commit writer shared by Streams and Queues (DESIGN.md §5).

Callers submit ``(group, data, commit, ctx)``: ``data`` is one chunk (a produced record
set, a queue message body), ``group`` says which chunks belong together in the object (e.g.
``(ns, stream, partition)``), ``commit`` is a ``GroupCommit`` and ``ctx`` whatever it needs to
know about the chunk.  Consecutive chunks of a group submitted with the same ``commit`` form
a *run*, adjacent in the object; ``commit.commit(tr, group, object_key, chunks)`` is called
once per run inside the flush's meta transaction, writes the index entries pointing into the
run's bytes (a stream: one entry per partition per flush, however many produce requests it
merged; a queue: one ready entry) and returns each chunk's result and the number of entries
it wrote.  A result that is an exception fails that chunk alone (a chunk the commit left out).

One flush = one object PUT holding every pending chunk (each group's chunks contiguous, in
submission order) + one meta transaction calling every commit, registering the object's
reference count, and registering the write intent of the next flush's object (see
``refs.py``: that is what keeps a crash between PUT and commit from leaving an orphan without
costing a second transaction per flush).  Only after that transaction commits are the
submitters' futures resolved; if the PUT or the transaction fails, every submitter of that
flush gets the exception and nothing of it is acknowledged.  A zero-byte chunk rides the
next flush's transaction without adding to the object (a queue's claim round does that),
committed after every chunk with bytes (so a claim sees everything its flush enqueued).

Flush policy (adaptive group commit): flushes are pipelined two deep and commit in order.
While a flush writes its object new chunks wait for the next; once the PUT is done and the
flush waits for (or runs) its meta transaction, the next flush may start writing its own
object, and commits after it (so the object write of one flush overlaps the transaction of
the one before; DESIGN.md §13: several flushes may be in flight).  When no PUT is in flight,
a chunk starts a flush at once: after one loop iteration, so that the rest of the read that
submitted it (and a claim round it wakes) joins, and no sooner than ``min_flush_gap`` after
the previous flush started (S3: every PUT is billed).  Latency at low load is then one PUT +
one meta transaction; at high load each flush carries whatever arrived during the previous
one's PUT.  Every flush's object key has a write intent registered before its PUT: the
transaction of each flush registers the intents of the next ones (``PIPELINE_DEPTH`` keys
kept ready), so pipelining costs no extra transaction.

On the file store + SQLite a flush is one job of a ``FlushThread``: the write, then the
transaction queued on the meta store's thread from there, one result back to the loop; its
objects are files created a few flushes ahead (``CREATED_AHEAD`` intents kept ready), so the
write is one write + fdatasync of an already durable name (``README.md``).
``size_threshold`` and ``flush_interval`` (the oldest pending chunk's age) stay as upper
bounds; with ``min_flush_gap=None`` they are the only triggers (a fixed-interval batcher).
A flush of zero-byte chunks only is one meta transaction, with no PUT.  Cost per chunk: one
future, no task.

Storage outages: a flush that the object or meta store fails, fails its chunks with
``StoreUnavailable``; for ``outage_retry_s`` after it (doubling per consecutive failure, up
to ``outage_retry_max_s``) new chunks are failed at once rather than queued behind the
store's timeouts, so every protocol refuses durable writes fast (MQTT 0x80, Kafka
``KAFKA_STORAGE_ERROR``, AMQP nack, HTTP 503); after the window the next flush probes the
store, and the first one that commits ends the outage.

Backpressure (DESIGN.md §13): when the bytes waiting for a flush pass ``high_water``, or
the chunks not yet committed (waiting or in a flush) pass ``high_water_chunks``, the batcher
is *under pressure* and tells its ``pressure_listeners`` (``listener(True)``); once the bytes
are below ``low_water`` and the chunks below half their mark it tells them
``listener(False)``.  The listeners pause and resume the publishers; the batcher itself never
refuses a chunk for it.  The chunk count is there for small chunks: each costs its submitter
about a kilobyte while it waits (its future, the callbacks on it, the body, the chunk's
record: an MQTT message fanned out to offline sessions is one chunk per session), which the
bytes do not show.  Cost: two comparisons per submit.
"""

from __future__ import annotations

import abc
import asyncio
import collections
import contextlib
import dataclasses
import functools
import logging
import re
import secrets
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, NamedTuple

from flowmq_commit import refs
from flowmq_commit.clock import Clock
from flowmq_commit.errors import BatcherClosed, StoreUnavailable
from flowmq_commit.flush_process import FlushProcess
from flowmq_commit.flush_thread import FlushThread
from flowmq_commit.flush_txn import RunCommit, commit_flush
from flowmq_commit.tasks import FaultHook, fault, running_task
from flowmq_core.message import now_ms
from flowmq_meta import MetaError, MetaStore, Transaction
from flowmq_metrics import kas3_flush_latency, kas3_segment_size
from flowmq_objstore import ObjectStore, ObjectStoreError

log = logging.getLogger(__name__)

# Bound once: a labelled child costs a dict lookup per call otherwise.
FLUSH_PUT = kas3_flush_latency.labels("put")
FLUSH_COMMIT = kas3_flush_latency.labels("commit")
FLUSH_TOTAL = kas3_flush_latency.labels("total")


class GroupCommit(abc.ABC):
    """What a flush does for a run of chunks of one group (see the module docstring)."""

    @abc.abstractmethod
    def commit(
        self, tr: Transaction, group: Any, object_key: str, chunks: list[tuple[int, int, Any]]
    ) -> tuple[list[Any], int]:
        """``chunks``: ``(start, end, ctx)`` per chunk, adjacent and in submission order.
        Returns each chunk's result and the number of index entries written pointing into
        the object.  Runs inside the flush transaction, maybe more than once (a retried
        transaction), so it acts only through ``tr``."""

    def portable(self, group: Any, chunks: list[tuple[int, int, Any]]) -> RunCommit | None:
        """``commit`` of this run as a picklable callable ``(tr, object_key)``, which the
        flush process can run (``flush_process``), or None if it cannot leave this process
        (it calls back into it).  The default: None."""
        return None

    def check(self, group: Any) -> None:  # noqa: B027 - optional hook
        """Raise if no chunk of ``group`` could be committed (a key past the meta store's
        budget).  Called when a group is first submitted, so a bad entry fails only its own
        submitter, never the flush it would have shared with others."""

    def before_commit(  # noqa: B027 - optional hook
        self, group: Any, object_key: str, start: int, end: int, data: bytes
    ) -> None:
        """On the event loop before the flush's object is written and its transaction can
        commit: what a reader needs that sees the commit before ``after_commit`` runs (the
        commit is made in another thread or process, and readers on the loop see it as soon
        as it is made).  The flush may still fail: nothing then points at the object."""

    def after_commit(  # noqa: B027 - optional hook
        self, group: Any, results: list[Any], object_key: str, start: int, end: int, data: bytes
    ) -> None:
        """On the event loop once committed, before the futures resolve (fills caches,
        wakes long polls); ``data`` is the run's bytes ``[start, end)`` of the object."""


DEFAULT_SIZE_THRESHOLD = 4 * 1024 * 1024
# Local disk: latency first (DESIGN.md §5); S3: every PUT is billed.
DEFAULT_FLUSH_INTERVAL = {"file": 0.003, "s3": 0.1}
# The least time between the starts of two flushes: none on local disk, the interval on S3.
DEFAULT_MIN_FLUSH_GAP = {"file": 0.0, "s3": DEFAULT_FLUSH_INTERVAL["s3"]}
DEFAULT_INTENT_LEASE_MS = 10 * 60 * 1000
DEFAULT_MAX_FLUSH_ITEMS = 10_000
# Flushes in flight at once: one writing its object while the one before commits.
PIPELINE_DEPTH = 2
# With a flush thread, the objects of this many flushes ahead are registered (their intents)
# and created (``ThreadWriter.reserve_blocking``) in advance, half of them at a time, so a
# flush's write makes no new name durable and one directory fsync serves four flushes.
CREATED_AHEAD = 8
_RENEW_RETRY_S = 1.0
DEFAULT_OUTAGE_RETRY_S = 0.5
DEFAULT_OUTAGE_RETRY_MAX_S = 5.0
# What a failing object or meta store raises (timeouts included).
STORE_FAILURES = (ObjectStoreError, MetaError, OSError, TimeoutError)
MAX_CHECKED_GROUPS = 100_000
# Pending bytes past which publishers are paused (config ``pending_writes_high_water``);
# they resume below half of it.
DEFAULT_HIGH_WATER = 64 * 1024 * 1024
# Chunks not yet committed past which publishers are paused too (config
# ``pending_writes_high_water_chunks``); they resume below half of it.
DEFAULT_HIGH_WATER_CHUNKS = 1024
# Pauses less than this many seconds apart are logged as one (one line when the first
# starts, one when the last has been over this long), so a flapping backlog cannot flood
# the log.
PRESSURE_LOG_QUIET_S = 5.0


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def key_component(name: str) -> str:
    """``name`` made safe as one object-key path component on every backend."""
    cleaned = _UNSAFE.sub("_", name).strip(".") or "node"
    return cleaned[:100]


def _scheme(objects: ObjectStore) -> str:
    return "s3" if str(getattr(objects, "url", "")).startswith("s3:") else "file"


def default_flush_interval(objects: ObjectStore) -> float:
    return DEFAULT_FLUSH_INTERVAL[_scheme(objects)]


_DEFAULT = object()


@dataclass
class BatcherStats:
    flushes: int = 0
    failed_flushes: int = 0
    bytes: int = 0
    chunks: int = 0
    # Transactions outside flushes: registering a fresh intent at start, after a failure or
    # after a long idle period.
    intent_transactions: int = 0
    # Flushes of zero-byte chunks only (queue claim rounds): one transaction, no PUT.
    meta_only_flushes: int = 0


@dataclasses.dataclass(slots=True, eq=False)
class _Item:
    group: Hashable
    data: bytes
    commit: GroupCommit
    ctx: Any
    future: asyncio.Future[Any]
    born: float


class _Plan(NamedTuple):
    """A flush's transaction and the intents it changes (see ``GroupCommitBatcher._plan``)."""

    txn: Callable[[Transaction], list[list[Any]]]
    next_keys: list[str]
    next_deadline: int
    abandoned: list[str]


class _Run:
    """Consecutive chunks of one group sharing one ``GroupCommit``: one ``commit`` call."""

    __slots__ = ("chunks", "commit", "end", "group", "items", "start")

    def __init__(self, item: _Item, start: int, end: int) -> None:
        self.group = item.group
        self.commit = item.commit
        self.items = [item]
        self.chunks: list[tuple[int, int, Any]] = [(start, end, item.ctx)]
        self.start = start
        self.end = end

    def bound_commit(self, tr: Transaction, object_key: str) -> tuple[list[Any], int]:
        return self.commit.commit(tr, self.group, object_key, self.chunks)


class GroupCommitBatcher:
    def __init__(
        self,
        meta: MetaStore,
        objects: ObjectStore,
        *,
        node_id: str = "node",
        size_threshold: int = DEFAULT_SIZE_THRESHOLD,
        flush_interval: float | None = None,
        min_flush_gap: Any = _DEFAULT,
        max_flush_bytes: int | None = None,
        max_flush_items: int = DEFAULT_MAX_FLUSH_ITEMS,
        intent_lease_ms: int = DEFAULT_INTENT_LEASE_MS,
        key_prefix: str = "segments",
        clock: Clock = now_ms,
        faults: FaultHook | None = None,
        outage_retry_s: float = DEFAULT_OUTAGE_RETRY_S,
        outage_retry_max_s: float = DEFAULT_OUTAGE_RETRY_MAX_S,
        high_water: int = DEFAULT_HIGH_WATER,
        low_water: int | None = None,
        high_water_chunks: int = DEFAULT_HIGH_WATER_CHUNKS,
    ) -> None:
        if size_threshold <= 0:
            raise ValueError("size_threshold must be positive")
        if intent_lease_ms <= 2 * refs.COMMIT_MARGIN_MS:
            raise ValueError(f"intent_lease_ms must exceed {2 * refs.COMMIT_MARGIN_MS}")
        self.meta = meta
        self.objects = objects
        self.node_id = node_id
        self.size_threshold = size_threshold
        self.flush_interval = (
            default_flush_interval(objects) if flush_interval is None else flush_interval
        )
        # None: no eager flushes, only the size and interval triggers (tests that flush
        # by hand pass that with a long interval).
        self.min_flush_gap: float | None = (
            DEFAULT_MIN_FLUSH_GAP[_scheme(objects)] if min_flush_gap is _DEFAULT else min_flush_gap
        )
        self.max_flush_bytes = max_flush_bytes or 2 * size_threshold
        self.max_flush_items = max_flush_items
        self.intent_lease_ms = intent_lease_ms
        self.stats = BatcherStats()
        self._clock = clock
        self._faults = faults
        self._key_base = f"{key_prefix}/{key_component(node_id)}"
        # Distinguishes restarts of the same node within one millisecond.
        self._incarnation = secrets.token_hex(4)
        self._seq = 0
        self._pending: collections.deque[_Item] = collections.deque()
        self._pending_bytes = 0
        self._wakeup: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._force = False
        self._last_flush_start = float("-inf")
        # Registered write intents for the next flushes' objects, oldest first: (key, deadline),
        # and how many more the transactions in flight register.
        self._keys: collections.deque[tuple[str, int]] = collections.deque()
        self._keys_coming = 0
        # Write and commit in one worker thread when both stores allow it (file + SQLite).
        self._flush_thread = FlushThread.for_stores(objects, meta, faults)
        # ... or in a child process, for the flushes that can leave this one; never with
        # fault hooks or a clock of a test's, which only this process runs.
        self._flush_process = (
            FlushProcess.for_stores(objects, meta)
            if self._flush_thread is not None and faults is None and clock is now_ms
            else None
        )
        # The way the latest flush took (a process, the thread, or None: the loop); a flush
        # taking another waits for the one before it, so that flushes commit in order.
        self._last_route: FlushProcess | FlushThread | None = None
        # How many keys to keep ready, and how many to register at a time once below.
        self._keys_ahead = PIPELINE_DEPTH if self._flush_thread is None else CREATED_AHEAD
        self._keys_batch = 1 if self._flush_thread is None else CREATED_AHEAD // 2
        # Pipelining: whether a flush is writing its object (the next may not start yet), the
        # flushes in flight, and what resolves once the latest started flush has finished
        # (the next one's transaction waits for it, so flushes commit in order).
        self._putting = False
        self._flights: set[asyncio.Task[None]] = set()
        self._last_done: asyncio.Future[None] | None = None
        # Intents of keys whose write failed: listed for deletion by the next intent txn.
        self._abandoned: list[str] = []
        # Groups whose keys ``GroupCommit.check`` accepted (bounded; re-checked once cleared).
        self._checked: set[Hashable] = set()
        # The current storage outage (None: none) and until when new chunks are refused.
        self.outage_retry_s = outage_retry_s
        self.outage_retry_max_s = outage_retry_max_s
        self._outage: StoreUnavailable | None = None
        self._outage_since = 0.0
        self._refuse_until = 0.0
        self._retry_s = outage_retry_s
        # Backpressure: ``high_water`` 0 turns it off, ``high_water_chunks`` 0 its chunk
        # count.  ``_pressure_mark`` and ``_chunks_mark`` are what submit compares against:
        # the high-water marks, or infinity while under pressure.  ``_unsettled``: chunks
        # submitted and not yet committed or failed (waiting, or in a flush in flight).
        # Called on the loop once the futures of a flush with bytes have been resolved,
        # after the callbacks those scheduled have run (one call per flush): a protocol
        # answers everything the flush stored at once, not a loop iteration later.
        self.resolved_listeners: list[Callable[[], None]] = []
        self.high_water = high_water
        self.low_water = high_water // 2 if low_water is None else low_water
        self.high_water_chunks = high_water_chunks
        self.low_water_chunks = high_water_chunks // 2
        self.under_pressure = False
        self.pressure_listeners: list[Callable[[bool], None]] = []
        self._pressure_mark: float = high_water or float("inf")
        self._chunks_mark: float = high_water_chunks or float("inf")
        self._unsettled = 0
        self.pressure_log_quiet_s = PRESSURE_LOG_QUIET_S
        # The pauses logged as one: when the first started, when the last ended, how many,
        # for how long in all; ``_pressure_timer`` logs their end once quiet.
        self._pressure_log_open = False
        self._pressure_first = self._pressure_since = self._pressure_ended = 0.0
        self._pressure_count = 0
        self._pressure_total = 0.0
        self._pressure_timer: asyncio.TimerHandle | None = None

    # -- submitting --------------------------------------------------------------------------

    def submit(
        self, group: Hashable, data: bytes, commit: GroupCommit, ctx: Any = None
    ) -> asyncio.Future[Any]:
        """Queue one chunk, committed together with the group's other chunks by ``commit``
        (``ctx`` is handed to it); the future resolves to this chunk's result once durable."""
        if self._closing:
            raise BatcherClosed("batcher is closed")
        if group not in self._checked:
            commit.check(group)
            if len(self._checked) >= MAX_CHECKED_GROUPS:
                self._checked.clear()
            self._checked.add(group)
        task = self._task
        if task is None:
            loop = asyncio.get_running_loop()
            self._task = loop.create_task(self._run(), name=f"kas3-batcher {self.node_id}")
        else:
            # Not ``asyncio.get_running_loop()``: on CPython 3.11 it makes a getpid()
            # system call, which was 14 % of the event loop at one call per message.
            loop = task.get_loop()
        future: asyncio.Future[Any] = loop.create_future()
        if self._outage is not None and loop.time() < self._refuse_until:
            future.set_exception(self._outage)
            return future
        self._pending.append(_Item(group, data, commit, ctx, future, loop.time()))
        self._pending_bytes += len(data)
        self._unsettled += 1
        if self._pending_bytes > self._pressure_mark or self._unsettled > self._chunks_mark:
            self._set_pressure(True)
        wakeup = self._wakeup
        if (
            wakeup is not None
            and not wakeup.done()
            and (len(self._pending) == 1 or self._pending_bytes >= self.size_threshold)
        ):
            wakeup.set_result(None)
        return future

    def warm_up(self) -> None:
        """Start the flush process now, if this batcher has one (a broker with Streams calls
        it, so that their first appends need not take the flush thread while it starts)."""
        if self._flush_process is not None and not self._closing:
            self._flush_process.start_soon()

    @property
    def pending_bytes(self) -> int:
        return self._pending_bytes

    @property
    def unsettled_chunks(self) -> int:
        """Chunks submitted and not yet committed or failed."""
        return self._unsettled

    @property
    def prompt(self) -> bool:
        """A chunk submitted now is flushed without waiting for an interval: at once, or
        right after the flush in flight (so a zero-byte rider is as quick as a transaction
        of its own, and is ordered with the flushes)."""
        return self.min_flush_gap == 0

    @property
    def outage(self) -> StoreUnavailable | None:
        """Why durable writes are failing now (None: the last flush committed)."""
        return self._outage

    def _flush_failed(self, exc: BaseException) -> BaseException:
        """Start or extend the outage window; what the flush's waiters get."""
        if not isinstance(exc, STORE_FAILURES):
            return exc  # a commit's own refusal, a lost intent: not the store
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self._outage is None:
            self._outage_since = now
            self._retry_s = self.outage_retry_s
            log.warning(
                "durable writes failing (%s); refusing new ones for %.1f s at a time "
                "until a flush commits",
                exc,
                self._retry_s,
            )
        else:
            self._retry_s = min(self._retry_s * 2, self.outage_retry_max_s)
        outage = StoreUnavailable(f"durable storage unavailable: {exc}")
        outage.__cause__ = exc
        self._outage = outage
        self._refuse_until = now + self._retry_s
        return outage

    def _ease_pressure(self) -> None:
        """Leave pressure if both the bytes waiting and the chunks unsettled are low."""
        if (
            self.under_pressure
            and self._pending_bytes <= self.low_water
            and self._unsettled <= self.low_water_chunks
        ):
            self._set_pressure(False)

    def _set_pressure(self, on: bool) -> None:
        """Enter or leave pressure, tell the listeners, log it (see ``_log_pressure_end``)."""
        self.under_pressure = on
        self._pressure_mark = float("inf") if on else self.high_water or float("inf")
        self._chunks_mark = float("inf") if on else self.high_water_chunks or float("inf")
        loop = asyncio.get_running_loop()
        now = loop.time()
        if on:
            self._pressure_since = now
            self._pressure_count += 1
            if not self._pressure_log_open:
                self._pressure_log_open = True
                self._pressure_first = now
                log.info(
                    "durable writes waiting passed %d bytes (pending_writes_high_water) or "
                    "%d chunks (pending_writes_high_water_chunks): %d bytes, %d chunks; "
                    "publishers paused until below %d and %d",
                    self.high_water,
                    self.high_water_chunks,
                    self._pending_bytes,
                    self._unsettled,
                    self.low_water,
                    self.low_water_chunks,
                )
        else:
            self._pressure_ended = now
            self._pressure_total += now - self._pressure_since
            if self._pressure_timer is None:
                self._pressure_timer = loop.call_later(
                    self.pressure_log_quiet_s, self._log_pressure_end
                )
        for listener in self.pressure_listeners:
            try:
                listener(on)
            except Exception:
                log.exception("a backpressure listener failed")

    def _log_pressure_end(self) -> None:
        """The end line of the pauses logged as one, once none followed for a while."""
        self._pressure_timer = None
        if self.under_pressure:
            return  # its end schedules the next check
        loop = asyncio.get_running_loop()
        quiet_for = loop.time() - self._pressure_ended
        if quiet_for < self.pressure_log_quiet_s:
            self._pressure_timer = loop.call_later(
                self.pressure_log_quiet_s - quiet_for, self._log_pressure_end
            )
            return
        log.info(
            "durable writes waiting below %d bytes and %d chunks: publishers resumed "
            "(pauses: %d, %.1f s in all, over %.1f s)",
            self.low_water,
            self.low_water_chunks,
            self._pressure_count,
            self._pressure_total,
            self._pressure_ended - self._pressure_first,
        )
        self._pressure_log_open = False
        self._pressure_count = 0
        self._pressure_total = 0.0

    def _flush_committed(self) -> None:
        if self._outage is not None:
            down = asyncio.get_running_loop().time() - self._outage_since
            log.warning("durable writes recovered after %.1f s", down)
            self._outage = None

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Register the first write intent now, so the first flush costs one transaction."""
        await self._ensure_intent()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"kas3-batcher {self.node_id}"
            )

    async def flush(self) -> None:
        """Flush everything pending now, regardless of size and age, and wait for it."""
        futures = [item.future for item in self._pending]
        if not futures:
            return
        self._force = True
        self._wake()
        await asyncio.gather(*futures, return_exceptions=True)

    async def close(self) -> None:
        """Flush what is pending, stop, and release the unused intent."""
        if self._closing:
            return
        self._closing = True
        self._force = True
        self._wake()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._pressure_timer is not None:
            self._pressure_timer.cancel()
        if self._flush_thread is not None:
            # Every object created ahead exists before its intent is abandoned, so GC's
            # deletion cannot come first and leave it behind.
            await self._flush_thread.idle()
        if self._flush_process is not None:
            await self._flush_process.close()
        abandoned = [*self._abandoned, *(key for key, _ in self._keys)]
        self._keys.clear()
        if abandoned:
            now = self._clock()
            with contextlib.suppress(Exception):
                await self.meta.transact(
                    lambda tr: [refs.abandon_intent(tr, k, now) for k in abandoned]
                )
        if self._flush_thread is not None:
            self._flush_thread.close()

    # -- the flush loop ----------------------------------------------------------------------

    def _wake(self) -> None:
        if self._wakeup is not None and not self._wakeup.done():
            self._wakeup.set_result(None)

    async def _sleep(self, timeout: float | None) -> None:
        self._wakeup = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(timeout):
                await self._wakeup
        except TimeoutError:
            pass
        finally:
            self._wakeup = None

    def _due_in(self) -> float:
        """Seconds until the pending chunks must be flushed (<= 0: now)."""
        if self._force or self._pending_bytes >= self.size_threshold:
            return 0.0
        now = asyncio.get_running_loop().time()
        due = self._pending[0].born + self.flush_interval
        if self.min_flush_gap is not None:
            due = min(due, self._last_flush_start + self.min_flush_gap)
        return due - now

    async def _run(self) -> None:
        while True:
            if not self._pending:
                self._force = False
                if self._closing:
                    while self._flights:
                        await asyncio.wait(list(self._flights))
                    return
                await self._sleep(self._idle_timeout())
                if (
                    not self._pending
                    and not self._closing
                    and not self._flights
                    and self._intent_needs_renewal()
                ):
                    try:
                        await self._ensure_intent()
                    except Exception:
                        log.warning("kas3 could not renew its write intent", exc_info=True)
                        await self._sleep(_RENEW_RETRY_S)  # a new chunk cuts this short
                continue
            if self._putting or len(self._flights) >= PIPELINE_DEPTH:
                await self._sleep(None)  # a flush finishing a stage wakes this
                continue
            wait = self._due_in()
            if wait > 0:
                await self._sleep(wait)
                continue
            if self.min_flush_gap is not None:
                # One loop iteration: the rest of this read, and a claim round it woke, join.
                await asyncio.sleep(0)
            self._begin_flush()

    def _begin_flush(self) -> None:
        self._last_flush_start = asyncio.get_running_loop().time()
        self._start_flush(self._take())

    def _start_flush(self, items: list[_Item]) -> None:
        """Run the flush of ``items`` as a task of its own, committing after the previous."""
        loop = asyncio.get_running_loop()
        previous, done = self._last_done, loop.create_future()
        self._last_done = done
        self._putting = True
        task = loop.create_task(self._flush_in_order(items, previous, done))
        self._flights.add(task)
        task.add_done_callback(self._flights.discard)

    async def _flush_in_order(
        self, items: list[_Item], previous: asyncio.Future[None] | None, done: asyncio.Future[None]
    ) -> None:
        try:
            await self._flush(items, previous)
        except Exception as exc:  # a bug, not a storage failure: never strand producers
            log.exception("kas3 flush failed unexpectedly")
            _fail(items, exc)
        finally:
            self._unsettled -= len(items)  # committed or failed, every one
            self._ease_pressure()
            self._put_done()
            done.set_result(None)
            # Out of the flights before waking the loop, which counts them (the task's own
            # done callback would only run an iteration later, and the wake-up be lost).
            self._flights.discard(asyncio.current_task())  # type: ignore[arg-type]
            self._wake()

    def _put_done(self) -> None:
        """The flush's object is written (or will not be): the next flush may start.  If
        chunks are waiting for it and due, it starts here: they waited for this write, and
        starting them from the flush loop would cost two more loop iterations (its wake-up
        and the one it leaves for a read to join), a millisecond or more on a busy loop."""
        if self._putting:
            self._putting = False
            if (
                self._pending
                and not self._closing
                and len(self._flights) < PIPELINE_DEPTH
                and self._due_in() <= 0
            ):
                self._begin_flush()
            else:
                self._wake()

    def _idle_timeout(self) -> float | None:
        if not self._keys:
            return None
        left_ms = self._keys[0][1] - self.intent_lease_ms // 2 - self._clock()
        return max(left_ms / 1000, 0.001)

    def _intent_needs_renewal(self) -> bool:
        return not self._keys or self._keys[0][1] - self._clock() <= self.intent_lease_ms // 2

    def _take(self) -> list[_Item]:
        items: list[_Item] = []
        size = 0
        pending = self._pending
        while pending and (
            not items
            or (
                size + len(pending[0].data) <= self.max_flush_bytes
                and len(items) < self.max_flush_items
            )
        ):
            item = pending.popleft()
            items.append(item)
            size += len(item.data)
        self._pending_bytes -= size
        self._ease_pressure()
        return items

    def _new_key(self) -> str:
        self._seq += 1
        return f"{self._key_base}/{self._clock():013d}-{self._incarnation}-{self._seq:08d}"

    async def _ensure_intent(self) -> None:
        """Make sure the next flushes have keys with live intents, registering fresh ones if
        there are none or the oldest lease is half gone (normally the previous flushes'
        transactions registered them)."""
        if not self._intent_needs_renewal():
            return
        stale = [*self._abandoned, *(key for key, _ in self._keys)]
        self._keys.clear()
        keys = [self._new_key() for _ in range(self._keys_ahead)]
        now = self._clock()
        deadline = now + self.intent_lease_ms

        def txn(tr: Transaction) -> None:
            for old in stale:
                refs.abandon_intent(tr, old, now)
            for key in keys:
                refs.register_intent(tr, key, deadline, self.node_id)

        self._abandoned = []
        try:
            await self.meta.transact(txn)
        except BaseException:
            self._abandoned.extend(stale)
            raise
        self.stats.intent_transactions += 1
        self._keys.extend((key, deadline) for key in keys)
        self._create_ahead(keys)

    def _create_ahead(self, keys: list[str]) -> None:
        """Have the flush thread or process (whichever will write them) create ``keys``."""
        if self._flush_process is not None and self._flush_process.ready:
            self._flush_process.create_ahead(keys)
        elif self._flush_thread is not None:
            self._flush_thread.create_ahead(keys)

    async def _take_key(self) -> str:
        """The key of a flush's object: a registered intent, taken out of the ready ones."""
        while True:
            await self._ensure_intent()
            if self._keys:  # (another flush may have taken it while this one waited)
                return self._keys.popleft()[0]

    async def _flush(self, items: list[_Item], previous: asyncio.Future[None] | None) -> None:
        """Write the object of ``items``, then, once the flush started before this one has
        finished (``previous``), commit them in one transaction.  With a flush thread, both
        steps are one job of it, whose order keeps the commits in order."""
        with running_task():
            started = time.perf_counter()
            runs, body = _layout(items)
            thread = self._thread()
            portable = self._portable(runs) if body and thread is not None else None
            route: FlushProcess | FlushThread | None = thread
            if portable is not None:
                route = self._flush_process
            # Only the thread and the process keep their jobs in order; across them, or on
            # the loop, a flush waits for the one before it.
            wait_previous = previous is not None and (
                route is None or route is not self._last_route
            )
            self._last_route = route
            if not body:
                self._put_done()
                if wait_previous:
                    await previous
                await self._commit_only(items, runs, thread)
                return
            try:
                key = await self._take_key()
            except Exception as exc:
                self.stats.failed_flushes += 1
                _fail(items, self._flush_failed(exc))
                return
            plan: _Plan | None = None
            stages = [started, started]  # when the write started, when it ended
            datas = [_run_data(run, body) for run in runs]
            for run, data in zip(runs, datas, strict=True):
                _before_commit(run, key, data)
            try:
                fault(self._faults, "flush.before_put")
                if thread is not None:
                    plan = self._plan(key, runs)

                    def written(seconds: float) -> None:
                        stages[1] = time.perf_counter()
                        stages[0] = stages[1] - seconds
                        self._put_done()

                    if wait_previous:
                        await previous
                    if portable is not None and self._flush_process is not None:
                        commit = functools.partial(
                            commit_flush,
                            key=key,
                            now=self._clock(),
                            commits=portable,
                            next_keys=plan.next_keys,
                            next_deadline=plan.next_deadline,
                            node_id=self.node_id,
                            abandoned=plan.abandoned,
                        )
                        results = await self._flush_process.write_and_commit(
                            key, body, commit, written
                        )
                    else:
                        results = await thread.write_and_commit(key, body, plan.txn, written)
                else:
                    stages[0] = time.perf_counter()
                    try:
                        await self.objects.put(key, body)
                    finally:
                        self._put_done()
                    stages[1] = time.perf_counter()
                    fault(self._faults, "flush.after_put")
                    if previous is not None:
                        await previous
                    plan = self._plan(key, runs)
                    results = await self.meta.transact(plan.txn)
                fault(self._faults, "flush.after_commit")
                committed = time.perf_counter()
            except Exception as exc:
                # The outcome of the commit may be unknown (FoundationDB's
                # commit_unknown_result), so never reuse this key (nor the ones it registers).
                if plan is not None:
                    self._keys_coming -= len(plan.next_keys)
                    self._abandoned.extend(plan.abandoned + plan.next_keys)
                self._abandoned.append(key)
                self.stats.failed_flushes += 1
                _fail(items, self._flush_failed(exc))
                return
            self._keys_coming -= len(plan.next_keys)
            self._keys.extend((k, plan.next_deadline) for k in plan.next_keys)
            if plan.next_keys:
                self._create_ahead(plan.next_keys)
            self._flush_committed()
            self.stats.flushes += 1
            self.stats.bytes += len(body)
            self.stats.chunks += len(items)
            kas3_segment_size.observe(len(body))
            FLUSH_PUT.observe(stages[1] - stages[0])
            FLUSH_COMMIT.observe(committed - stages[1])
            FLUSH_TOTAL.observe(committed - started)
            for run, run_results, data in zip(runs, results, datas, strict=True):
                _after_commit(run, run_results, key, data)
                _resolve(run, run_results)
            if self.resolved_listeners:
                # Queued after the futures' callbacks, so it runs right after them.
                asyncio.get_running_loop().call_soon(self._tell_resolved)

    def _tell_resolved(self) -> None:
        for listener in self.resolved_listeners:
            try:
                listener()
            except Exception:
                log.exception("kas3 resolved listener failed")

    def _plan(self, key: str, runs: list[_Run]) -> _Plan:
        """The transaction of a flush into ``key``: its commits, the intents it registers
        for the flushes after it (refilling the ready keys, counting those the flush before
        registers, once ``_keys_batch`` are missing) and the keys of failed writes it hands
        to GC."""
        now = self._clock()
        missing = self._keys_ahead - len(self._keys) - self._keys_coming
        next_keys = [self._new_key() for _ in range(missing if missing >= self._keys_batch else 0)]
        self._keys_coming += len(next_keys)
        next_deadline = now + self.intent_lease_ms
        abandoned = self._abandoned
        self._abandoned = []
        return _Plan(
            lambda tr: self._commit(tr, key, runs, next_keys, next_deadline, abandoned),
            next_keys,
            next_deadline,
            abandoned,
        )

    def _thread(self) -> FlushThread | None:
        """The flush thread, unless ``objects`` was replaced since (tests hold PUTs that way:
        the flushes then await each step on the loop, in order)."""
        thread = self._flush_thread
        return thread if thread is not None and thread.writes_to(self.objects) else None

    async def _commit_only(
        self, items: list[_Item], runs: list[_Run], thread: FlushThread | None
    ) -> None:
        """A flush of zero-byte chunks: their commits in one transaction, no object, the
        write intents kept for the next flushes that have bytes."""

        def txn(tr: Transaction) -> list[list[Any]]:
            return [run.commit.commit(tr, run.group, "", run.chunks)[0] for run in runs]

        try:
            if thread is not None:
                results = await thread.commit(txn)
            else:
                results = await self.meta.transact(txn)
        except Exception as exc:
            self.stats.failed_flushes += 1
            _fail(items, self._flush_failed(exc))
            return
        self._flush_committed()
        self.stats.meta_only_flushes += 1
        for run, run_results in zip(runs, results, strict=True):
            _after_commit(run, run_results, "", b"")
            _resolve(run, run_results)

    def _commit(
        self,
        tr: Transaction,
        key: str,
        runs: list[_Run],
        next_keys: list[str],
        next_deadline: int,
        abandoned: list[str],
    ) -> list[list[Any]]:
        commits = [(run.bound_commit, len(run.chunks)) for run in runs]
        return commit_flush(
            tr, key, self._clock(), commits, next_keys, next_deadline, self.node_id, abandoned
        )

    def _portable(self, runs: list[_Run]) -> list[tuple[RunCommit, int]] | None:
        """Every run's commit in a form the flush process runs, if it can take this flush
        (up and running; it starts here the first time a flush could use it)."""
        if self._flush_process is None:
            return None
        commits = []
        for run in runs:
            commit = run.commit.portable(run.group, run.chunks)
            if commit is None:
                return None
            commits.append((commit, len(run.chunks)))
        self._flush_process.start_soon()
        return commits if self._flush_process.ready else None


def _layout(items: list[_Item]) -> tuple[list[_Run], bytes]:
    """Order chunks by group (first-seen order, submission order within a group; groups of
    zero-byte chunks only last) and cut them into commit runs; returns the runs and the
    object body."""
    by_group: dict[Hashable, list[_Item]] = {}
    for item in items:
        by_group.setdefault(item.group, []).append(item)
    groups = list(by_group.values())
    groups.sort(key=lambda group_items: not any(item.data for item in group_items))
    runs: list[_Run] = []
    parts: list[bytes] = []
    pos = 0
    for group_items in groups:
        previous: _Run | None = None
        for item in group_items:
            end = pos + len(item.data)
            if previous is not None and item.commit is previous.commit:
                previous.items.append(item)
                previous.chunks.append((pos, end, item.ctx))
                previous.end = end
            else:
                previous = _Run(item, pos, end)
                runs.append(previous)
            parts.append(item.data)
            pos = end
    return runs, b"".join(parts)


def _run_data(run: _Run, body: bytes) -> bytes:
    """The run's bytes of the object: a copy, not a view of the body (a cached view would
    pin the whole object)."""
    return run.items[0].data if len(run.items) == 1 else body[run.start : run.end]


def _before_commit(run: _Run, key: str, data: bytes) -> None:
    try:
        run.commit.before_commit(run.group, key, run.start, run.end, data)
    except Exception:
        log.exception("kas3 before-commit callback failed")


def _after_commit(run: _Run, results: list[Any], key: str, data: bytes) -> None:
    try:
        run.commit.after_commit(run.group, results, key, run.start, run.end, data)
    except Exception:
        log.exception("kas3 after-commit callback failed")


def _resolve(run: _Run, results: list[Any]) -> None:
    """Hand each chunk its result; an exception is a chunk its commit left out (e.g. a
    retried batch already stored), failed alone while the rest of the flush stands."""
    for item, result in zip(run.items, results, strict=True):
        if item.future.done():
            continue
        if isinstance(result, BaseException):
            item.future.set_exception(result)
        else:
            item.future.set_result(result)


def _fail(items: list[_Item], exc: BaseException) -> None:
    for item in items:
        if not item.future.done():
            item.future.set_exception(exc)
