"""A small stand-in for the ``fdb`` bindings, so the FdbMetaStore adapter (retry loop, watch
futures resolved from another thread, range reads, error translation) runs in every test
session even where libfdb_c and a cluster are absent.  It mimics only what the adapter uses.

Every transaction's first commit fails with ``not_committed`` (1020), so each conformance test
also exercises the retry path: ``fn`` runs twice and the first attempt's watches are dropped.
"""

from __future__ import annotations

import threading
from typing import Any

NOT_COMMITTED = 1020
TRANSACTION_TOO_OLD = 1007
OPERATION_CANCELLED = 1101
RETRYABLE = {NOT_COMMITTED, TRANSACTION_TOO_OLD}

_api_version: int | None = None


class FDBError(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code

    def __str__(self) -> str:
        return f"fake FoundationDB error ({self.code})"


def is_api_version_selected() -> bool:
    return _api_version is not None


def get_api_version() -> int:
    assert _api_version is not None
    return _api_version


def api_version(version: int) -> None:
    global _api_version
    _api_version = version


class Future:
    def __init__(self, error: int | None = None, ready: bool = False) -> None:
        self._lock = threading.Lock()
        self._callbacks: list[Any] = []
        self._ready = ready
        self._error = error

    def _set(self, error: int | None = None) -> None:
        with self._lock:
            if self._ready:
                return
            self._ready, self._error = True, error
            callbacks, self._callbacks = self._callbacks, []
        for cb in callbacks:
            cb(self)

    def wait(self) -> None:
        if not self._ready:
            raise AssertionError("the adapter must not block on an unfinished fake future")
        if self._error is not None:
            raise FDBError(self._error)

    def on_ready(self, callback: Any) -> None:
        with self._lock:
            if not self._ready:
                self._callbacks.append(callback)
                return
        callback(self)

    def cancel(self) -> None:
        self._set(OPERATION_CANCELLED)


class _Value:
    def __init__(self, value: bytes | None) -> None:
        self.value = value


class KeyValue:
    def __init__(self, key: bytes, value: bytes) -> None:
        self.key, self.value = key, value


class _Range:
    def __init__(self, items: list[KeyValue]) -> None:
        self._items = items

    def to_list(self) -> list[KeyValue]:
        return list(self._items)


def _add(existing: bytes | None, param: bytes) -> bytes:
    if existing is None:
        return param
    current = int.from_bytes(existing[: len(param)].ljust(len(param), b"\x00"), "little")
    total = (current + int.from_bytes(param, "little")) % (1 << (8 * len(param)))
    return total.to_bytes(len(param), "little")


class _Options:
    def __init__(self) -> None:
        self.timeout_ms: int | None = None

    def set_transaction_timeout(self, ms: int) -> None:
        self.timeout_ms = ms


class Database:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.data: dict[bytes, bytes] = {}
        self.watches: dict[bytes, list[tuple[Future, bytes | None]]] = {}
        self.options = _Options()
        self.commits = 0

    def create_transaction(self) -> Transaction:
        return Transaction(self)

    def _apply(self, mutations: list[tuple[Any, ...]]) -> None:
        data = self.data
        for op, *args in mutations:
            if op == "set":
                data[args[0]] = args[1]
            elif op == "clear":
                data.pop(args[0], None)
            elif op == "clear_range":
                for k in [k for k in data if args[0] <= k < args[1]]:
                    del data[k]
            elif op == "add":
                data[args[0]] = _add(data.get(args[0]), args[1])
        fire = []
        for key, watches in list(self.watches.items()):
            keep = []
            for fut, seen in watches:
                if fut._ready:
                    continue  # cancelled
                if data.get(key) != seen:
                    fire.append(fut)
                else:
                    keep.append((fut, seen))
            self.watches[key] = keep
        # Like the real network thread: callbacks arrive on a thread of their own.
        for fut in fire:
            threading.Thread(target=fut._set).start()


class Transaction:
    def __init__(self, db: Database) -> None:
        self._db = db
        self._first_commit = True
        self.reset()

    def reset(self) -> None:
        with self._db.lock:
            self._view = dict(self._db.data)
        self._mutations: list[tuple[Any, ...]] = []
        self._watches: list[tuple[bytes, Future, bytes | None]] = []

    def get(self, key: bytes) -> _Value:
        return _Value(self._view.get(key))

    def get_range(self, begin: bytes, end: bytes, limit: int = 0, reverse: bool = False) -> _Range:
        keys = sorted((k for k in self._view if begin <= k < end), reverse=reverse)
        if limit:
            keys = keys[:limit]
        return _Range([KeyValue(k, self._view[k]) for k in keys])

    def set(self, key: bytes, value: bytes) -> None:
        self._view[key] = value
        self._mutations.append(("set", key, value))

    def clear(self, key: bytes) -> None:
        self._view.pop(key, None)
        self._mutations.append(("clear", key))

    def clear_range(self, begin: bytes, end: bytes) -> None:
        for k in [k for k in self._view if begin <= k < end]:
            del self._view[k]
        self._mutations.append(("clear_range", begin, end))

    def add(self, key: bytes, param: bytes) -> None:
        self._view[key] = _add(self._view.get(key), param)
        self._mutations.append(("add", key, param))

    def watch(self, key: bytes) -> Future:
        fut = Future()
        self._watches.append((key, fut, self._view.get(key)))
        return fut

    def commit(self) -> Future:
        if self._first_commit:
            self._first_commit = False
            return Future(NOT_COMMITTED, ready=True)
        with self._db.lock:
            for key, fut, seen in self._watches:
                if not fut._ready:
                    self._db.watches.setdefault(key, []).append((fut, seen))
            self._db._apply(self._mutations)
            self._db.commits += 1
        return Future(ready=True)

    def on_error(self, code: int) -> Future:
        if code in RETRYABLE:
            self.reset()
            return Future(ready=True)
        return Future(code, ready=True)


def open(cluster_file: str | None = None) -> Database:  # noqa: A001 - mirrors fdb.open
    return Database()
