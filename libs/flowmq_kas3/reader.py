"""Reading chunk bytes: page cache first, then one ranged GET per run of adjacent misses."""

from __future__ import annotations

import asyncio

from flowmq_kas3.index import ChunkEntry
from flowmq_kas3.page_cache import PageCache
from flowmq_kas3.segment import Chunk
from flowmq_objstore import ObjectNotFound, ObjectStore


async def read_chunks(
    objects: ObjectStore, cache: PageCache | None, entries: list[ChunkEntry]
) -> list[Chunk]:
    """``(base offset, bytes)`` of each entry, in order.  A flush writes each partition's
    chunks next to each other, so consecutive index entries usually form one byte run of one
    object and cost a single GET.  Raises ``ObjectNotFound`` if an object is gone (or
    shorter than indexed, which only a deleted-and-reused key could cause)."""
    data: list[bytes | memoryview | None] = []
    runs: list[list[int]] = []
    for i, e in enumerate(entries):
        hit = cache.get((e.object_key, e.start, e.end)) if cache is not None else None
        data.append(hit)
        if hit is not None:
            continue
        if runs and runs[-1][-1] == i - 1:
            prev = entries[i - 1]
            if prev.object_key == e.object_key and prev.end == e.start:
                runs[-1].append(i)
                continue
        runs.append([i])
    if runs:
        blobs = await asyncio.gather(
            *(
                objects.get(entries[run[0]].object_key, entries[run[0]].start, entries[run[-1]].end)
                for run in runs
            )
        )
        for run, blob in zip(runs, blobs, strict=True):
            view = memoryview(blob)
            origin = entries[run[0]].start
            for i in run:
                e = entries[i]
                piece = view[e.start - origin : e.end - origin]
                if len(piece) != e.size:
                    raise ObjectNotFound(f"object {e.object_key!r} is shorter than indexed")
                if cache is not None:
                    cache.put((e.object_key, e.start, e.end), piece, len(piece))
                data[i] = piece
    return [(e.base_offset, d) for e, d in zip(entries, data, strict=True)]  # type: ignore[misc]
