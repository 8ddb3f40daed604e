"""flowmq_commit: the object-store write path shared by Stream and Queue storage
(DESIGN.md §5).

- ``GroupCommitBatcher`` (batcher.py): the per-broker group-commit writer — one object PUT
  and one meta transaction per flush, for every stream partition and queue at once.
- refs.py: the object life cycle (write intents, reference counts, the to-delete list) and
  the invariants it keeps; gc.py: ``collect_garbage`` deletes the objects it lists.
- cache.py: ``ByteLRU``, under the stream page cache and the queue body cache.
- clock.py: the injectable wall clock; tasks.py: fault points, the running-tasks gauge and
  ``MaintenanceOptions`` (clock, delete grace, fault hook) of retention, compaction and GC.

Depends on ``flowmq_core``, ``flowmq_meta``, ``flowmq_objstore`` and ``flowmq_metrics``
only; ``flowmq_kas3`` and ``flowmq_queue`` build on it and not on each other.
"""

from __future__ import annotations

from flowmq_commit.batcher import (
    DEFAULT_FLUSH_INTERVAL,
    DEFAULT_SIZE_THRESHOLD,
    BatcherStats,
    GroupCommit,
    GroupCommitBatcher,
    default_flush_interval,
)
from flowmq_commit.clock import Clock
from flowmq_commit.errors import BatcherClosed, CommitError, IntentLost, StoreUnavailable
from flowmq_commit.gc import GcResult, collect_garbage
from flowmq_commit.tasks import MaintenanceOptions

__all__ = [
    "DEFAULT_FLUSH_INTERVAL",
    "DEFAULT_SIZE_THRESHOLD",
    "BatcherClosed",
    "BatcherStats",
    "Clock",
    "CommitError",
    "GcResult",
    "GroupCommit",
    "GroupCommitBatcher",
    "IntentLost",
    "MaintenanceOptions",
    "StoreUnavailable",
    "collect_garbage",
    "default_flush_interval",
]
