"""Compaction: merge runs of a partition's small adjacent chunks into one object each.

Small chunks come from flushes that carried little data for the partition; left alone they
mean one index entry and (after the other partitions' data expires) one object per flush.
A run of them is read, written as one new object, and swapped in one transaction for a
single index entry at the run's first base offset with the summed offset count: offsets do
not change, and every batch stays readable at the same offset.

Crash safety (see ``flowmq_commit/refs.py``): the new object's key is listed as an intent before the PUT,
and the swap checks that intent and that the run's index entries are still exactly what was
read (retention or another compactor may have changed them); it drops the old objects'
references in the same transaction.
"""

from __future__ import annotations

import collections
import secrets
from typing import NamedTuple

from flowmq_commit import refs
from flowmq_commit.batcher import DEFAULT_INTENT_LEASE_MS, key_component
from flowmq_commit.tasks import DEFAULT_MAINTENANCE, MaintenanceOptions, fault, running_task
from flowmq_kas3 import index
from flowmq_kas3.errors import CompactionConflict
from flowmq_kas3.index import ChunkEntry, Partition
from flowmq_kas3.reader import read_chunks
from flowmq_meta import MetaStore, Transaction
from flowmq_metrics import kas3_segment_size
from flowmq_objstore import ObjectStore

DEFAULT_SMALL_CHUNK_BYTES = 256 * 1024
DEFAULT_TARGET_BYTES = 4 * 1024 * 1024
# Entries per planning read and upper bound on a run's length (one swap transaction).
_SCAN_PAGE = 1000


class CompactionResult(NamedTuple):
    runs: int
    chunks_merged: int
    bytes_written: int
    conflicts: int


def plan_runs(
    entries: list[ChunkEntry], small_chunk_bytes: int, target_bytes: int, min_chunks: int = 2
) -> list[list[ChunkEntry]]:
    """Maximal runs of consecutive small chunks, each at most ``target_bytes``."""
    runs: list[list[ChunkEntry]] = []
    run: list[ChunkEntry] = []
    size = 0
    for e in entries:
        small = e.size < small_chunk_bytes
        if run and (not small or size + e.size > target_bytes):
            if len(run) >= min_chunks:
                runs.append(run)
            run, size = [], 0
        if small:
            run.append(e)
            size += e.size
    if len(run) >= min_chunks:
        runs.append(run)
    return runs


async def compact_partition(
    meta: MetaStore,
    objects: ObjectStore,
    p: Partition,
    options: MaintenanceOptions = DEFAULT_MAINTENANCE,
    *,
    node_id: str = "node",
    small_chunk_bytes: int = DEFAULT_SMALL_CHUNK_BYTES,
    target_bytes: int = DEFAULT_TARGET_BYTES,
    min_chunks: int = 2,
    key_prefix: str = "compacted",
    intent_lease_ms: int = DEFAULT_INTENT_LEASE_MS,
) -> CompactionResult:
    """One compaction pass over the partition, oldest chunks first."""
    key_base = f"{key_prefix}/{key_component(node_id)}"
    runs = merged = written = conflicts = 0
    cursor: int | None = None
    with running_task():
        while True:
            page = await meta.transact(
                lambda tr, c=cursor: index.first_entries(tr, p, _SCAN_PAGE, c)
            )
            for run in plan_runs(page, small_chunk_bytes, target_bytes, min_chunks):
                key = f"{key_base}/{options.clock():013d}-{secrets.token_hex(6)}"
                try:
                    size = await _compact_run(
                        meta, objects, p, run, key, node_id, intent_lease_ms, options
                    )
                except CompactionConflict:
                    conflicts += 1
                    continue
                runs += 1
                merged += len(run)
                written += size
            if len(page) < _SCAN_PAGE:
                return CompactionResult(runs, merged, written, conflicts)
            cursor = page[-1].next_offset


async def _compact_run(
    meta: MetaStore,
    objects: ObjectStore,
    p: Partition,
    run: list[ChunkEntry],
    key: str,
    node_id: str,
    intent_lease_ms: int,
    options: MaintenanceOptions,
) -> int:
    chunks = await read_chunks(objects, None, run)
    body = b"".join(data for _, data in chunks)
    merged = ChunkEntry(
        run[0].base_offset,
        key,
        0,
        len(body),
        sum(e.offset_count for e in run),
        max(e.max_timestamp for e in run),
    )
    deadline = options.clock() + intent_lease_ms
    await meta.transact(lambda tr: refs.register_intent(tr, key, deadline, node_id))
    fault(options.faults, "compaction.after_intent")

    def swap(tr: Transaction) -> None:
        now = options.clock()
        refs.check_intent(tr, key, now)
        current = index.first_entries(tr, p, len(run), run[0].base_offset)
        if current != run:
            raise CompactionConflict(f"index of {p} changed under compaction")
        # Same bytes, same offsets: only the locations change, so the byte total stays.
        begin = index.entry_key(p, run[0].base_offset)
        tr.clear_range(begin, index.entry_key(p, run[-1].base_offset + 1))
        index.write_entry(tr, p, merged)
        refs.resolve_intent(tr, key, 1, now)
        refs.unref(tr, collections.Counter(e.object_key for e in run), now, options.grace_ms)

    try:
        await objects.put(key, body)
        fault(options.faults, "compaction.after_put")
        await meta.transact(swap)
    except Exception:
        # Let GC delete the unused object now rather than when the lease ends; if even this
        # fails, the lease expiry does it.
        try:
            await meta.transact(lambda tr: refs.abandon_intent(tr, key, options.clock()))
        except Exception:
            pass
        raise
    fault(options.faults, "compaction.after_swap")
    kas3_segment_size.observe(len(body))
    return len(body)
