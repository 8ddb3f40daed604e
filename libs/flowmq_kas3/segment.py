"""Turning stored chunks into a fetch response: whole batches, base offsets patched.

A chunk is a run of batches exactly as produced (base offsets as the producer wrote them,
usually 0).  Its index entry gives the offset of its first batch; each following batch starts
lastOffsetDelta + 1 further.  Kafka consumers drop records below their fetch offset
themselves, so a fetch starts at the batch containing the offset, never inside a batch.
"""

from __future__ import annotations

from collections.abc import Iterable

from flowmq_kas3.records import BASE_OFFSET, iter_batches

Chunk = tuple[int, bytes | memoryview]
"""(base offset of the chunk's first batch, the chunk's bytes)."""


def assemble_fetch(chunks: Iterable[Chunk], offset: int, max_bytes: int) -> bytearray:
    """Whole batches from the one containing ``offset``, in order, until adding the next
    would pass ``max_bytes`` (the first batch is always included, as Kafka requires so that
    a batch larger than the limit still makes progress)."""
    out = bytearray()
    for base, data in chunks:
        next_offset = base
        for info in iter_batches(data):
            batch_offset, next_offset = next_offset, next_offset + info.offset_count
            if next_offset <= offset:
                continue
            if out and len(out) + info.size > max_bytes:
                return out
            at = len(out)
            out += memoryview(data)[info.position : info.position + info.size]
            BASE_OFFSET.pack_into(out, at, batch_offset)
    return out


def batch_offsets(base: int, data: bytes | memoryview) -> list[tuple[int, int, int]]:
    """``(offset, position, size)`` of each batch of a chunk starting at ``base``."""
    result = []
    offset = base
    for info in iter_batches(data):
        result.append((offset, info.position, info.size))
        offset += info.offset_count
    return result
