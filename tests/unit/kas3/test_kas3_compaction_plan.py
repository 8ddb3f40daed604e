"""Which chunks compaction merges."""

from __future__ import annotations

from flowmq_kas3 import ChunkEntry
from flowmq_kas3.compaction import plan_runs


def entries(sizes: list[int]) -> list[ChunkEntry]:
    out, pos = [], 0
    for offset, size in enumerate(sizes):
        out.append(ChunkEntry(offset, "o", pos, pos + size, 1, 0))
        pos += size
    return out


def test_runs_are_small_adjacent_chunks_up_to_the_target() -> None:
    runs = plan_runs(
        entries([10, 10, 100, 10, 10, 10, 10, 5]), small_chunk_bytes=50, target_bytes=30
    )
    assert [[e.base_offset for e in run] for run in runs] == [[0, 1], [3, 4, 5], [6, 7]]


def test_a_lone_small_chunk_is_left_alone() -> None:
    assert plan_runs(entries([10, 100, 10]), small_chunk_bytes=50, target_bytes=1000) == []
