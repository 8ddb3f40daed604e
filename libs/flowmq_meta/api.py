"""The meta-store contract every backend implements (DESIGN.md §7).

Transactions are plain synchronous functions over one ``Transaction`` object, run by
``await store.transact(fn)``; the store retries ``fn`` on conflict, FoundationDB style, so
``fn`` must have no side effects other than through the transaction.  Keys and values are
``bytes``; keys are packed with ``fdb.tuple`` (see ``keys.py``) so ordering is identical on
every backend.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")

# FoundationDB's limits, enforced on every backend so code that works embedded also works on
# FoundationDB (https://apple.github.io/foundationdb/known-limitations.html).
MAX_KEY_BYTES = 10_000
MAX_VALUE_BYTES = 100_000
MAX_TRANSACTION_BYTES = 10_000_000


class MetaError(Exception):
    """Base class of meta-store errors."""


class KeyTooLarge(MetaError):
    pass


class ValueTooLarge(MetaError):
    pass


class TransactionTooLarge(MetaError):
    pass


class TransactionConflict(MetaError):
    """Raised inside a backend when a commit conflicts; ``transact`` retries on it."""


class RetryLimitExceeded(MetaError):
    pass


class Watch(abc.ABC):
    """Fires once, after the watched key's value changes from what the transaction saw."""

    @abc.abstractmethod
    def __await__(self):  # pragma: no cover - interface
        ...

    @abc.abstractmethod
    def cancel(self) -> None: ...


class Transaction(abc.ABC):
    """One serializable transaction. Reads see the transaction's own writes."""

    @abc.abstractmethod
    def get(self, key: bytes) -> bytes | None: ...

    @abc.abstractmethod
    def get_range(
        self, begin: bytes, end: bytes, limit: int = 0, reverse: bool = False
    ) -> list[tuple[bytes, bytes]]:
        """Key-value pairs with ``begin <= key < end`` in key order (descending if
        ``reverse``); ``limit`` 0 means no limit."""

    @abc.abstractmethod
    def set(self, key: bytes, value: bytes) -> None: ...

    @abc.abstractmethod
    def clear(self, key: bytes) -> None: ...

    @abc.abstractmethod
    def clear_range(self, begin: bytes, end: bytes) -> None: ...

    @abc.abstractmethod
    def add(self, key: bytes, delta: int) -> None:
        """Atomic add of a signed 64-bit little-endian integer (FoundationDB's ADD)."""

    @abc.abstractmethod
    def watch(self, key: bytes) -> Watch:
        """A watch that becomes active when the transaction commits."""


class ReadOnlyTransaction(Transaction):
    """A transaction's reads and watches; its writes raise ``MetaError`` (``MetaStore.read``)."""

    __slots__ = ("_tr",)

    def __init__(self, tr: Transaction) -> None:
        self._tr = tr

    def get(self, key: bytes) -> bytes | None:
        return self._tr.get(key)

    def get_range(
        self, begin: bytes, end: bytes, limit: int = 0, reverse: bool = False
    ) -> list[tuple[bytes, bytes]]:
        return self._tr.get_range(begin, end, limit, reverse)

    def watch(self, key: bytes) -> Watch:
        return self._tr.watch(key)

    def _refuse(self, *_: Any) -> None:
        raise MetaError("a read transaction of the meta store may not write")

    set = clear = clear_range = add = _refuse  # type: ignore[assignment]


class MetaStore(abc.ABC):
    url: str
    #: Whether ``transact_from_thread`` is available (a store whose transactions run one at
    #: a time in a thread of its own).
    transacts_from_threads = False

    @abc.abstractmethod
    async def transact(self, fn: Callable[[Transaction], T]) -> T:
        """Run ``fn`` in a transaction, retrying on conflict; return its result."""

    async def read(self, fn: Callable[[Transaction], T]) -> T:
        """Run ``fn``, which only reads (and may set watches), in a transaction that sees
        a consistent, committed snapshot, wherever the backend answers it soonest; a write
        in it raises ``MetaError``.  The default: ``transact``."""
        return await self.transact(lambda tr: fn(ReadOnlyTransaction(tr)))

    def transact_from_thread(
        self,
        fn: Callable[[Transaction], Any],
        loop: asyncio.AbstractEventLoop,
        future: Any,
        before_commit: Callable[[], None] | None = None,
    ) -> None:
        """Like ``transact``, callable from any thread: queue ``fn`` now, to run after every
        transaction queued before it (reruns on conflict included) and before every one
        queued after it; ``future`` (an ``asyncio.Future`` of ``loop``) is settled on the
        loop.  A worker thread hands its transaction straight to the store's thread this way,
        without a hop through the event loop (the group-commit batcher's flush).
        ``before_commit``, if given, is called in the store's thread after ``fn`` and before
        the commit, in every attempt; it may block, and what it raises rolls the transaction
        back and fails ``future`` with it (the batcher waits there for the flush's object
        write, so the transaction's statements overlap the write's fdatasync)."""
        raise NotImplementedError(f"{type(self).__name__} cannot transact from threads")

    @abc.abstractmethod
    async def close(self) -> None: ...

    async def get(self, key: bytes) -> bytes | None:
        return await self.transact(lambda tr: tr.get(key))

    async def watch(self, key: bytes) -> Awaitable[None]:
        """Convenience: a watch on ``key`` as it is now."""
        return await self.transact(lambda tr: tr.watch(key))


def encode_int(value: int) -> bytes:
    return value.to_bytes(8, "little", signed=True)


def decode_int(raw: bytes | None) -> int:
    return 0 if raw is None else int.from_bytes(raw, "little", signed=True)
