"""``memory://`` — an in-process meta store for unit tests.

``fn`` runs synchronously on the event loop, so no other task can interleave with it: every
transaction is trivially serializable and never conflicts.  Writes go straight into the
store (so reads see them) and an undo log puts things back if ``fn`` raises.
"""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import Callable
from typing import TypeVar

from flowmq_meta._base import (
    ChangeTracker,
    GuardedTransaction,
    ValueWatch,
    WatchRegistry,
    add_int,
    reject_coroutine,
)
from flowmq_meta.api import MetaError, MetaStore, Transaction

T = TypeVar("T")

_MISSING = object()


class _MemoryTransaction(GuardedTransaction):
    def __init__(self, store: MemoryMetaStore) -> None:
        super().__init__()
        self._store = store
        self._undo: dict[bytes, object] = {}  # key -> value before the transaction
        self.tracker = ChangeTracker()
        self.watches: list[ValueWatch] = []

    def _remember(self, key: bytes) -> None:
        if key not in self._undo:
            self._undo[key] = self._store._data.get(key, _MISSING)

    def rollback(self) -> None:
        for key, old in self._undo.items():
            if old is _MISSING:
                self._store._delete(key)
            else:
                self._store._put(key, old)  # type: ignore[arg-type]

    def _get(self, key: bytes) -> bytes | None:
        return self._store._data.get(key)

    def _get_range(
        self, begin: bytes, end: bytes, limit: int, reverse: bool
    ) -> list[tuple[bytes, bytes]]:
        keys = self._store._keys
        lo = bisect.bisect_left(keys, begin)
        hi = bisect.bisect_left(keys, end)
        if reverse:
            lo = max(lo, hi - limit) if limit else lo
            selected = keys[lo:hi][::-1]
        else:
            hi = min(hi, lo + limit) if limit else hi
            selected = keys[lo:hi]
        data = self._store._data
        return [(k, data[k]) for k in selected]

    def _set(self, key: bytes, value: bytes) -> None:
        self._remember(key)
        self._store._put(key, value)
        self.tracker.wrote(key, value)

    def _clear(self, key: bytes) -> None:
        self._remember(key)
        self._store._delete(key)
        self.tracker.wrote(key, None)

    def _clear_range(self, begin: bytes, end: bytes) -> None:
        keys = self._store._keys
        lo = bisect.bisect_left(keys, begin)
        hi = bisect.bisect_left(keys, end)
        for key in keys[lo:hi]:
            self._remember(key)
            del self._store._data[key]
        del keys[lo:hi]
        self.tracker.cleared_range(begin, end)

    def _add(self, key: bytes, param: bytes, delta: int) -> None:
        self._set(key, add_int(self._store._data.get(key), delta))

    def _watch(self, key: bytes) -> ValueWatch:
        watch = ValueWatch(key, self._store._data.get(key))
        self.watches.append(watch)
        return watch


class MemoryMetaStore(MetaStore):
    """Sorted keys in a list (bisect) beside a dict; nothing persists."""

    def __init__(self, url: str = "memory://") -> None:
        self.url = url
        self._data: dict[bytes, bytes] = {}
        self._keys: list[bytes] = []
        self._watches = WatchRegistry()
        self._closed = False

    def _put(self, key: bytes, value: bytes) -> None:
        if key not in self._data:
            bisect.insort(self._keys, key)
        self._data[key] = value

    def _delete(self, key: bytes) -> None:
        if self._data.pop(key, _MISSING) is not _MISSING:
            del self._keys[bisect.bisect_left(self._keys, key)]

    async def transact(self, fn: Callable[[Transaction], T]) -> T:
        if self._closed:
            raise MetaError(f"meta store {self.url} is closed")
        loop = asyncio.get_running_loop()
        tr = _MemoryTransaction(self)
        try:
            result = fn(tr)
            reject_coroutine(result)
        except BaseException:
            tr.rollback()
            raise
        finally:
            tr._finish()
        self._watches.notify_commit(tr.tracker)
        for watch in tr.watches:
            self._watches.activate(loop, watch, tr.tracker)
        return result

    async def close(self) -> None:
        self._closed = True
        self._watches.cancel_all()

    def __repr__(self) -> str:
        return f"MemoryMetaStore({len(self._data)} keys)"
