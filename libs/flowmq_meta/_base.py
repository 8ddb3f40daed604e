"""Pieces shared by the backends: the size guard, FoundationDB's ADD arithmetic, watch plumbing.

The size guard lives in ``GuardedTransaction`` so that no backend can forget it: every
backend's transaction subclasses it and implements only the ``_``-prefixed primitives.  Code
that fits the limits on the embedded backends then also fits FoundationDB's.
"""

from __future__ import annotations

import asyncio
import inspect
import random
from collections.abc import Iterator
from typing import Any

from flowmq_meta.api import (
    MAX_KEY_BYTES,
    MAX_TRANSACTION_BYTES,
    MAX_VALUE_BYTES,
    KeyTooLarge,
    MetaError,
    Transaction,
    TransactionTooLarge,
    ValueTooLarge,
    Watch,
)

_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
_MASK64 = (1 << 64) - 1


def as_bytes(data: Any, what: str) -> bytes:
    """Accept any bytes-like object; reject ``str`` loudly since a str key is always a bug
    (keys come from ``keys.py`` and are already packed)."""
    if isinstance(data, bytes):
        return data
    if isinstance(data, bytearray | memoryview):
        return bytes(data)
    raise TypeError(f"{what} must be bytes, not {type(data).__name__}")


def check_key(key: Any) -> bytes:
    key = as_bytes(key, "key")
    if len(key) > MAX_KEY_BYTES:
        raise KeyTooLarge(
            f"key of {len(key)} bytes exceeds the {MAX_KEY_BYTES}-byte limit (starts {key[:32]!r})"
        )
    return key


def check_value(key: bytes, value: Any) -> bytes:
    value = as_bytes(value, "value")
    if len(value) > MAX_VALUE_BYTES:
        raise ValueTooLarge(
            f"value of {len(value)} bytes exceeds the {MAX_VALUE_BYTES}-byte limit "
            f"(key {key[:32]!r})"
        )
    return value


def add_int(existing: bytes | None, delta: int) -> bytes:
    """FoundationDB's ADD mutation: little-endian, wrapping at 64 bits; a missing value counts
    as zero and a value of another length is zero-extended or truncated to 8 bytes."""
    if existing is None:
        return encode_delta(delta)
    current = int.from_bytes(existing[:8].ljust(8, b"\x00"), "little")
    return ((current + delta) & _MASK64).to_bytes(8, "little")


def encode_delta(delta: int) -> bytes:
    if not isinstance(delta, int) or isinstance(delta, bool):
        raise TypeError(f"add delta must be int, not {type(delta).__name__}")
    if not _INT64_MIN <= delta <= _INT64_MAX:
        raise ValueError(f"add delta {delta} does not fit in a signed 64-bit integer")
    return delta.to_bytes(8, "little", signed=True)


class GuardedTransaction(Transaction):
    """Validates arguments and enforces the size limits, then calls the backend primitives.

    Written bytes are counted like FoundationDB counts mutations (key + value for a set, the
    key for a clear, both ends for a range clear), and the limit is checked before the write
    is applied, so a caller that catches the error still has a consistent transaction.
    """

    def __init__(self) -> None:
        self._written_bytes = 0
        self._finished = False

    def _finish(self) -> None:
        self._finished = True

    def _live(self) -> None:
        # A transaction object that escaped its ``fn`` must not touch the store later, from
        # another thread or outside any transaction.
        if self._finished:
            raise MetaError("transaction already finished: use it only inside its fn")

    # -- backend primitives; arguments are already validated bytes -------------------------
    def _get(self, key: bytes) -> bytes | None:  # pragma: no cover - interface
        raise NotImplementedError

    def _get_range(
        self, begin: bytes, end: bytes, limit: int, reverse: bool
    ) -> list[tuple[bytes, bytes]]:  # pragma: no cover - interface
        raise NotImplementedError

    def _set(self, key: bytes, value: bytes) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def _clear(self, key: bytes) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def _clear_range(self, begin: bytes, end: bytes) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def _add(self, key: bytes, param: bytes, delta: int) -> None:  # pragma: no cover
        raise NotImplementedError

    def _watch(self, key: bytes) -> Watch:  # pragma: no cover - interface
        raise NotImplementedError

    # -- public API --------------------------------------------------------------------------
    def _account(self, nbytes: int) -> None:
        total = self._written_bytes + nbytes
        if total > MAX_TRANSACTION_BYTES:
            raise TransactionTooLarge(
                f"transaction would write {total} bytes, over the "
                f"{MAX_TRANSACTION_BYTES}-byte limit"
            )
        self._written_bytes = total

    def get(self, key: bytes) -> bytes | None:
        self._live()
        return self._get(as_bytes(key, "key"))

    def get_range(
        self, begin: bytes, end: bytes, limit: int = 0, reverse: bool = False
    ) -> list[tuple[bytes, bytes]]:
        self._live()
        begin = as_bytes(begin, "begin key")
        end = as_bytes(end, "end key")
        if limit < 0:
            raise ValueError(f"limit must be >= 0, not {limit}")
        if begin >= end:
            return []
        return self._get_range(begin, end, limit, bool(reverse))

    def set(self, key: bytes, value: bytes) -> None:
        self._live()
        key = check_key(key)
        value = check_value(key, value)
        self._account(len(key) + len(value))
        self._set(key, value)

    def clear(self, key: bytes) -> None:
        self._live()
        key = check_key(key)
        self._account(len(key))
        self._clear(key)

    def clear_range(self, begin: bytes, end: bytes) -> None:
        self._live()
        begin = as_bytes(begin, "begin key")
        end = as_bytes(end, "end key")
        self._account(len(begin) + len(end))
        if begin < end:
            self._clear_range(begin, end)

    def add(self, key: bytes, delta: int) -> None:
        self._live()
        key = check_key(key)
        param = encode_delta(delta)
        self._account(len(key) + len(param))
        self._add(key, param, delta)

    def watch(self, key: bytes) -> Watch:
        self._live()
        return self._watch(check_key(key))


def reject_coroutine(result: object) -> None:
    """``fn`` must be synchronous: an ``async def`` fn would run nothing inside the
    transaction and commit an empty one, silently."""
    if inspect.iscoroutine(result):
        result.close()
        raise TypeError("transaction functions must be synchronous, not async")


def backoff_delay(attempt: int, base: float = 0.001, cap: float = 0.05) -> float:
    """Full-jitter exponential backoff, so competing processes de-synchronise."""
    return random.uniform(0, min(cap, base * (2 ** min(attempt, 16))))


class FutureWatch(Watch):
    """A watch whose firing is an asyncio future, attached on the event loop after commit.

    The watch object is created inside ``fn`` (possibly on a worker thread), but the future
    belongs to the loop, so it is only created by ``_attach`` once ``transact`` is back on the
    loop.  Awaiting a watch whose transaction never committed is an error.
    """

    def __init__(self, key: bytes) -> None:
        self.key = key
        self._future: asyncio.Future[None] | None = None
        self._cancel_requested = False

    def _attach(self, future: asyncio.Future[None]) -> None:
        self._future = future
        future.add_done_callback(self._on_done)
        if self._cancel_requested:
            future.cancel()

    def _on_done(self, future: asyncio.Future[None]) -> None:
        """Hook for subclasses to release resources when the watch ends in any way."""

    def _fire(self) -> None:
        if self._future is not None and not self._future.done():
            self._future.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        if self._future is not None and not self._future.done():
            self._future.set_exception(exc)

    def done(self) -> bool:
        return self._future is not None and self._future.done()

    def cancel(self) -> None:
        self._cancel_requested = True
        if self._future is not None and not self._future.done():
            self._future.cancel()

    def __await__(self) -> Iterator[Any]:
        if self._future is None:
            raise MetaError("watch is not active: the transaction that created it did not commit")
        return self._future.__await__()

    def __repr__(self) -> str:
        state = "pending" if self._future is None else ("done" if self.done() else "active")
        return f"<{type(self).__name__} {self.key!r} {state}>"


class ValueWatch(FutureWatch):
    """Watch for backends without native watches: remembers the value its transaction saw and
    fires when a later committed value differs."""

    def __init__(self, key: bytes, seen: bytes | None) -> None:
        super().__init__(key)
        self.seen = seen
        self._registry: WatchRegistry | None = None

    def _on_done(self, future: asyncio.Future[None]) -> None:
        if self._registry is not None:
            self._registry.discard(self)


_UNCHANGED = object()


class ChangeTracker:
    """The committed value of every key a transaction touched, so watches can be notified
    without re-reading the store: point writes remember their final value, range clears
    overwrite any remembered key in range and are kept for watched keys never point-written."""

    def __init__(self) -> None:
        self.final: dict[bytes, bytes | None] = {}
        self.cleared: list[tuple[bytes, bytes]] = []

    def wrote(self, key: bytes, value: bytes | None) -> None:
        self.final[key] = value

    def cleared_range(self, begin: bytes, end: bytes) -> None:
        for key in self.final:
            if begin <= key < end:
                self.final[key] = None
        self.cleared.append((begin, end))

    def value_after(self, key: bytes) -> object:
        """The key's value at commit, or ``_UNCHANGED`` if the transaction did not touch it."""
        if key in self.final:
            return self.final[key]
        for begin, end in self.cleared:
            if begin <= key < end:
                return None
        return _UNCHANGED

    @property
    def empty(self) -> bool:
        return not self.final and not self.cleared


class WatchRegistry:
    """Active ``ValueWatch``es of one store, by key.  Used only on the event loop."""

    def __init__(self) -> None:
        self._by_key: dict[bytes, set[ValueWatch]] = {}

    def __len__(self) -> int:
        return len(self._by_key)

    def keys(self) -> list[bytes]:
        return list(self._by_key)

    def activate(
        self, loop: asyncio.AbstractEventLoop, watch: ValueWatch, tracker: ChangeTracker
    ) -> None:
        """Attach a watch created by a committed transaction.  If that same transaction
        changed the key after creating the watch, it fires at once, as on FoundationDB."""
        watch._attach(loop.create_future())
        if watch.done():
            return
        after = tracker.value_after(watch.key)
        if after is not _UNCHANGED and after != watch.seen:
            watch._fire()
            return
        watch._registry = self
        self._by_key.setdefault(watch.key, set()).add(watch)

    def discard(self, watch: ValueWatch) -> None:
        watches = self._by_key.get(watch.key)
        if watches is not None:
            watches.discard(watch)
            if not watches:
                del self._by_key[watch.key]

    def notify(self, key: bytes, value: bytes | None) -> None:
        for watch in list(self._by_key.get(key, ())):
            if watch.seen != value:
                watch._fire()

    def notify_commit(self, tracker: ChangeTracker) -> None:
        if tracker.empty or not self._by_key:
            return
        for key, value in tracker.final.items():
            if key in self._by_key:
                self.notify(key, value)
        if tracker.cleared:
            for key in self.keys():
                if key not in tracker.final and tracker.value_after(key) is None:
                    self.notify(key, None)

    def cancel_all(self) -> None:
        """On close: awaiting a watch of a closed store raises ``CancelledError`` (an
        exception set on futures nobody awaits would only be logged as never retrieved)."""
        for watches in list(self._by_key.values()):
            for watch in list(watches):
                watch.cancel()
        self._by_key.clear()
