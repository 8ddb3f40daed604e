"""flowmq_meta: the meta store — transactions over ordered keys (DESIGN.md §7).

``open_meta_store(url)`` picks the backend by URL scheme: ``sqlite:///path`` (embedded
default), ``fdb://[cluster file]`` (production), ``memory://`` (unit tests).
"""

from __future__ import annotations

from flowmq_meta._base import check_key
from flowmq_meta.api import (
    MAX_KEY_BYTES,
    MAX_TRANSACTION_BYTES,
    MAX_VALUE_BYTES,
    KeyTooLarge,
    MetaError,
    MetaStore,
    RetryLimitExceeded,
    Transaction,
    TransactionConflict,
    TransactionTooLarge,
    ValueTooLarge,
    Watch,
    decode_int,
    encode_int,
)

__all__ = [
    "MAX_KEY_BYTES",
    "MAX_TRANSACTION_BYTES",
    "MAX_VALUE_BYTES",
    "KeyTooLarge",
    "MetaError",
    "MetaStore",
    "RetryLimitExceeded",
    "Transaction",
    "TransactionConflict",
    "TransactionTooLarge",
    "ValueTooLarge",
    "Watch",
    "check_key",
    "decode_int",
    "encode_int",
    "open_meta_store",
]

_EXPECTED = "expected sqlite:///path.db, sqlite:////abs/path.db, fdb://[cluster file] or memory://"


def open_meta_store(url: str) -> MetaStore:
    """Open the meta store ``url`` names.  Opening SQLite creates the file and blocks briefly,
    so call this at start-up.  Raises ``MetaError`` with a one-line reason on a bad URL or an
    unusable location."""
    if not isinstance(url, str) or "://" not in url:
        raise MetaError(f"malformed meta store URL {url!r}: {_EXPECTED}")
    scheme = url.split("://", 1)[0].lower()
    if scheme == "memory":
        from flowmq_meta.memory import MemoryMetaStore

        if url.lower().rstrip("/") != "memory:":
            raise MetaError(f"malformed meta store URL {url!r}: memory:// takes no path")
        return MemoryMetaStore(url)
    if scheme == "sqlite":
        from flowmq_meta.sqlite import SqliteMetaStore

        return SqliteMetaStore.from_url(url)
    if scheme == "fdb":
        from flowmq_meta.fdb_backend import FdbMetaStore

        return FdbMetaStore.from_url(url)
    raise MetaError(f"unsupported meta store URL scheme {scheme!r} in {url!r}: {_EXPECTED}")
