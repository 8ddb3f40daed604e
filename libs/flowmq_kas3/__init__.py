"""flowmq_kas3: Stream storage on an object store + meta-store index (DESIGN.md §5).

- ``GroupCommitBatcher`` (batcher.py): the per-broker group-commit writer, shared with Queues.
- ``StreamStore`` (store.py): append / fetch / offsets / long poll of stream partitions.
- records.py: Kafka record batch v2 helpers (header summary, split, build, decode).
- retention.py, compaction.py, gc.py: background maintenance; refs.py: object life cycle.
"""

from __future__ import annotations

from flowmq_kas3.batcher import (
    DEFAULT_FLUSH_INTERVAL,
    DEFAULT_SIZE_THRESHOLD,
    AfterCommit,
    BatcherStats,
    CommitFn,
    GroupCommit,
    GroupCommitBatcher,
    WithRefs,
    default_flush_interval,
)
from flowmq_kas3.compaction import CompactionResult, compact_partition
from flowmq_kas3.errors import (
    BatcherClosed,
    CompactionConflict,
    IntentLost,
    InvalidRecordBatch,
    Kas3Error,
    OffsetOutOfRange,
)
from flowmq_kas3.gc import GcResult, collect_garbage
from flowmq_kas3.index import ChunkEntry
from flowmq_kas3.page_cache import PageCache
from flowmq_kas3.records import (
    TOPIC_HEADER,
    Record,
    build_batch,
    decode_batch,
    decode_batches,
    encode_messages,
    split_batches,
    summarize,
)
from flowmq_kas3.refs import unref
from flowmq_kas3.retention import (
    RetentionPolicy,
    RetentionResult,
    apply_retention,
    delete_partition,
)
from flowmq_kas3.store import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    FetchResult,
    PartitionInfo,
    StreamStore,
)

__all__ = [
    "DEFAULT_FLUSH_INTERVAL",
    "DEFAULT_SIZE_THRESHOLD",
    "EARLIEST_TIMESTAMP",
    "LATEST_TIMESTAMP",
    "TOPIC_HEADER",
    "AfterCommit",
    "BatcherClosed",
    "BatcherStats",
    "ChunkEntry",
    "CommitFn",
    "CompactionConflict",
    "CompactionResult",
    "FetchResult",
    "GcResult",
    "GroupCommit",
    "GroupCommitBatcher",
    "IntentLost",
    "InvalidRecordBatch",
    "Kas3Error",
    "OffsetOutOfRange",
    "PageCache",
    "PartitionInfo",
    "Record",
    "RetentionPolicy",
    "RetentionResult",
    "StreamStore",
    "WithRefs",
    "apply_retention",
    "build_batch",
    "collect_garbage",
    "compact_partition",
    "decode_batch",
    "decode_batches",
    "default_flush_interval",
    "delete_partition",
    "encode_messages",
    "split_batches",
    "summarize",
    "unref",
]
