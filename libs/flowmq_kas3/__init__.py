"""flowmq_kas3: Stream storage on an object store + meta-store index (DESIGN.md §5).

Appends go through ``flowmq_commit.GroupCommitBatcher``, the writer shared with Queues.

- ``StreamStore`` (store.py): append / fetch / offsets / long poll of stream partitions.
- records.py: Kafka record batch v2 helpers (header summary, split, build, decode).
- retention.py, compaction.py: background maintenance (object GC is ``flowmq_commit.gc``).

The names below are imported on first use (PEP 562; import them from their modules where the
types matter): a process that needs only the index (the batcher's flush process, which runs
``index.append_run``) then loads neither the record codecs nor kafka-python with it (10 of
its 40 MB).
"""

from __future__ import annotations

import importlib
from typing import Any

# Each exported name and the module that defines it.
_EXPORTS = {
    "CompactionResult": "compaction",
    "compact_partition": "compaction",
    "CompactionConflict": "errors",
    "InvalidRecordBatch": "errors",
    "Kas3Error": "errors",
    "OffsetOutOfRange": "errors",
    "ChunkEntry": "index",
    "PageCache": "page_cache",
    "TOPIC_HEADER": "records",
    "Record": "records",
    "build_batch": "records",
    "decode_batch": "records",
    "decode_batches": "records",
    "encode_messages": "records",
    "split_batches": "records",
    "summarize": "records",
    "RetentionPolicy": "retention",
    "RetentionResult": "retention",
    "apply_retention": "retention",
    "delete_partition": "retention",
    "EARLIEST_TIMESTAMP": "store",
    "LATEST_TIMESTAMP": "store",
    "FetchResult": "store",
    "PartitionInfo": "store",
    "StreamStore": "store",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
