"""The stream index in the meta store: one entry per chunk, keyed by its base offset.

``STREAM_INDEX(ns, stream, partition, base_offset)`` -> tuple-packed
``(object key, byte start, byte end, offset count, max timestamp)``.  Offsets of a partition
are dense: each entry's base offset is the previous entry's base + offset count, the first
entry's base is the log start offset and the last entry ends at the high watermark
``STREAM_HWM(ns, stream, partition)``.  ``offset count`` is the number of offsets the chunk
occupies (sum of lastOffsetDelta + 1 over its batches), which is the record count for every
batch a producer sends.

All functions here run inside a meta transaction (synchronous, no I/O of their own).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import fdb.tuple as fdbtuple

from flowmq_meta import Transaction, decode_int, encode_int
from flowmq_meta.keys import STREAM_BYTES, STREAM_HWM, STREAM_INDEX

Partition = tuple[str, str, int]
"""(namespace, stream, partition)."""


class ChunkEntry(NamedTuple):
    base_offset: int
    object_key: str
    start: int
    end: int
    offset_count: int
    max_timestamp: int

    @property
    def size(self) -> int:
        return self.end - self.start

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.offset_count

    def encode_value(self) -> bytes:
        return fdbtuple.pack(
            (self.object_key, self.start, self.end, self.offset_count, self.max_timestamp)
        )


def entry_key(p: Partition, base_offset: int) -> bytes:
    return STREAM_INDEX.pack(p[0], p[1], p[2], base_offset)


def hwm_key(p: Partition) -> bytes:
    return STREAM_HWM.pack(*p)


def bytes_key(p: Partition) -> bytes:
    return STREAM_BYTES.pack(*p)


def decode_entry(key: bytes, value: bytes) -> ChunkEntry:
    base = STREAM_INDEX.unpack(key)[3]
    object_key, start, end, count, max_ts = fdbtuple.unpack(value)
    return ChunkEntry(base, object_key, start, end, count, max_ts)


def partition_range(p: Partition) -> tuple[bytes, bytes]:
    return STREAM_INDEX.range(*p)


def read_hwm(tr: Transaction, p: Partition) -> int:
    return decode_int(tr.get(hwm_key(p)))


def write_entry(tr: Transaction, p: Partition, entry: ChunkEntry) -> None:
    tr.set(entry_key(p, entry.base_offset), entry.encode_value())


def append_entry(
    tr: Transaction, p: Partition, object_key: str, start: int, end: int, count: int, max_ts: int
) -> int:
    """Assign the partition's next offsets to a chunk: index entry, high watermark, byte
    total.  Returns the chunk's base offset.  Reading the HWM makes concurrent appends to the
    same partition (from other brokers) conflict and retry, which keeps offsets dense."""
    key = hwm_key(p)
    base = decode_int(tr.get(key))
    tr.set(key, encode_int(base + count))
    write_entry(tr, p, ChunkEntry(base, object_key, start, end, count, max_ts))
    tr.add(bytes_key(p), end - start)
    return base


def append_run(
    p: Partition, chunks: Sequence[tuple[int, int, Any]], tr: Transaction, object_key: str
) -> tuple[list[int], int]:
    """Chunks adjacent in ``object_key`` (``(start, end, (offset count, max timestamp, _))``
    each) as ONE entry; returns each chunk's base offset and the one entry.  Module-level so
    that the flush process can run it (``GroupCommit.portable``)."""
    total = 0
    max_ts = -1
    for _, _, (count, ts, _) in chunks:
        total += count
        max_ts = max(max_ts, ts)
    offset = append_entry(tr, p, object_key, chunks[0][0], chunks[-1][1], total, max_ts)
    results = []
    for _, _, (count, _, _) in chunks:
        results.append(offset)
        offset += count
    return results, 1


def first_entries(
    tr: Transaction, p: Partition, limit: int, from_offset: int | None = None
) -> list[ChunkEntry]:
    """Up to ``limit`` entries in offset order, from the start or from ``from_offset``
    (inclusive, by base offset)."""
    begin, end = partition_range(p)
    if from_offset is not None:
        begin = entry_key(p, from_offset)
    return [decode_entry(k, v) for k, v in tr.get_range(begin, end, limit=limit)]


def entry_containing(tr: Transaction, p: Partition, offset: int) -> ChunkEntry | None:
    """The last entry whose base offset is <= ``offset`` (one reverse range read)."""
    begin, _ = partition_range(p)
    rows = tr.get_range(begin, entry_key(p, offset + 1), limit=1, reverse=True)
    return decode_entry(*rows[0]) if rows else None


def log_start(tr: Transaction, p: Partition, hwm: int) -> int:
    """Base offset of the first entry, or the HWM when retention removed everything."""
    first = first_entries(tr, p, 1)
    return first[0].base_offset if first else hwm


def remove_entries(tr: Transaction, p: Partition, entries: list[ChunkEntry]) -> None:
    """Clear ``entries`` (contiguous, in order) and subtract their bytes from the total."""
    if not entries:
        return
    tr.clear_range(entry_key(p, entries[0].base_offset), entry_key(p, entries[-1].base_offset + 1))
    tr.add(bytes_key(p), -sum(e.size for e in entries))
