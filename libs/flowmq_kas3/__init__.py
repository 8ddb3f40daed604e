"""flowmq_kas3: Stream storage on an object store + meta-store index (DESIGN.md §5).

Appends go through ``flowmq_commit.GroupCommitBatcher``, the writer shared with Queues.

- ``StreamStore`` (store.py): append / fetch / offsets / long poll of stream partitions.
- records.py: Kafka record batch v2 helpers (header summary, split, build, decode).
- retention.py, compaction.py: background maintenance (object GC is ``flowmq_commit.gc``).
"""

from __future__ import annotations

from flowmq_kas3.compaction import CompactionResult, compact_partition
from flowmq_kas3.errors import (
    CompactionConflict,
    InvalidRecordBatch,
    Kas3Error,
    OffsetOutOfRange,
)
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
    "EARLIEST_TIMESTAMP",
    "LATEST_TIMESTAMP",
    "TOPIC_HEADER",
    "ChunkEntry",
    "CompactionConflict",
    "CompactionResult",
    "FetchResult",
    "InvalidRecordBatch",
    "Kas3Error",
    "OffsetOutOfRange",
    "PageCache",
    "PartitionInfo",
    "Record",
    "RetentionPolicy",
    "RetentionResult",
    "StreamStore",
    "apply_retention",
    "build_batch",
    "compact_partition",
    "decode_batch",
    "decode_batches",
    "delete_partition",
    "encode_messages",
    "split_batches",
    "summarize",
]
