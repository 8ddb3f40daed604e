"""Retention: drop a partition's oldest chunks by age and by size.

Chunks go strictly from the start of the log (the log start offset only moves forward), each
page in one transaction that clears the index entries, subtracts their bytes from the
partition total and drops their objects' references — objects left unreferenced are listed
for deletion in that same transaction (``flowmq_commit.refs.unref``), and
``flowmq_commit.gc.collect_garbage`` deletes them later.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import NamedTuple

from flowmq_commit import refs
from flowmq_commit.tasks import DEFAULT_MAINTENANCE, MaintenanceOptions, fault, running_task
from flowmq_kas3 import index
from flowmq_kas3.index import ChunkEntry, Partition
from flowmq_meta import MetaStore, Transaction, decode_int

# Entries removed per transaction: ~100 bytes of mutations each, far below 10 MB / 5 s.
DEFAULT_PAGE = 500


@dataclass(frozen=True)
class RetentionPolicy:
    """Kafka's ``retention.ms`` / ``retention.bytes`` per partition; None: unlimited."""

    retention_ms: int | None = None
    retention_bytes: int | None = None


class RetentionResult(NamedTuple):
    chunks_removed: int
    bytes_removed: int
    log_start_offset: int


def _release(
    tr: Transaction, p: Partition, entries: list[ChunkEntry], now: int, grace: int
) -> None:
    index.remove_entries(tr, p, entries)
    refs.unref(tr, collections.Counter(e.object_key for e in entries), now, grace)


async def apply_retention(
    meta: MetaStore,
    p: Partition,
    policy: RetentionPolicy,
    options: MaintenanceOptions = DEFAULT_MAINTENANCE,
    *,
    page: int = DEFAULT_PAGE,
) -> RetentionResult:
    """Remove chunks whose max timestamp is older than ``retention_ms``, then, as Kafka
    does, the oldest chunks while the partition stays at or above ``retention_bytes``
    without them."""
    removed = removed_bytes = 0

    def txn(tr: Transaction) -> tuple[int, int, bool, int]:
        now = options.clock()
        entries = index.first_entries(tr, p, page)
        total = decode_int(tr.get(index.bytes_key(p))) if policy.retention_bytes is not None else 0
        drop: list[ChunkEntry] = []
        for e in entries:
            expired = (
                policy.retention_ms is not None and e.max_timestamp < now - policy.retention_ms
            )
            oversize = (
                policy.retention_bytes is not None and total - e.size >= policy.retention_bytes
            )
            if not (expired or oversize):
                break
            drop.append(e)
            total -= e.size
        _release(tr, p, drop, now, options.grace_ms)
        hwm = index.read_hwm(tr, p)
        start = entries[len(drop)].base_offset if len(drop) < len(entries) else hwm
        more = len(drop) == len(entries) == page
        return len(drop), sum(e.size for e in drop), more, start

    with running_task():
        while True:
            n, size, more, start = await meta.transact(txn)
            fault(options.faults, "retention.after_commit")
            removed += n
            removed_bytes += size
            if not more:
                return RetentionResult(removed, removed_bytes, start)


async def delete_partition(
    meta: MetaStore,
    p: Partition,
    options: MaintenanceOptions = DEFAULT_MAINTENANCE,
    *,
    page: int = DEFAULT_PAGE,
) -> int:
    """Remove every chunk of a partition and then its HWM and byte total (a deleted
    topic); returns the chunks removed.  Stop appends to it first."""
    removed = 0

    def txn(tr: Transaction) -> int:
        entries = index.first_entries(tr, p, page)
        _release(tr, p, entries, options.clock(), options.grace_ms)
        if len(entries) < page:
            tr.clear(index.hwm_key(p))
            tr.clear(index.bytes_key(p))
        return len(entries)

    with running_task():
        while True:
            n = await meta.transact(txn)
            removed += n
            if n < page:
                return removed
