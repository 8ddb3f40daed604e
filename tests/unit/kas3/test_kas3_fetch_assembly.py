"""Page cache bounds and the assembly of fetch responses from chunks."""

from __future__ import annotations

from flowmq_kas3 import PageCache, build_batch, decode_batches
from flowmq_kas3.records import split_batches
from flowmq_kas3.segment import assemble_fetch
from flowmq_metrics import kas3_page_cache_hit_count, kas3_page_cache_miss_count


def batch(n: int, tag: str) -> bytes:
    return build_batch([(None, f"{tag}-{i}".encode(), [], 1) for i in range(n)])


def test_page_cache_is_a_byte_bounded_lru() -> None:
    cache = PageCache(max_bytes=100)
    cache.put(("a", 0, 40), b"a" * 40, 40)
    cache.put(("b", 0, 40), b"b" * 40, 40)
    assert cache.get(("a", 0, 40)) is not None  # a is now the most recent
    cache.put(("c", 0, 40), b"c" * 40, 40)  # evicts b
    assert cache.get(("b", 0, 40)) is None
    assert cache.size == 80 and len(cache) == 2
    cache.put(("huge", 0, 101), b"x" * 101, 101)  # larger than the cache: not kept
    assert cache.get(("huge", 0, 101)) is None and cache.size == 80


def test_page_cache_counts_hits_and_misses_in_metrics() -> None:
    cache = PageCache(1000)
    hits, misses = kas3_page_cache_hit_count.value(), kas3_page_cache_miss_count.value()
    cache.get(("x", 0, 1))
    cache.put(("x", 0, 1), b"x", 1)
    cache.get(("x", 0, 1))
    assert (cache.hits, cache.misses) == (1, 1)
    assert kas3_page_cache_hit_count.value() - hits == 1
    assert kas3_page_cache_miss_count.value() - misses == 1


def test_assemble_starts_at_the_batch_holding_the_offset_and_patches_offsets() -> None:
    chunk1 = batch(3, "a") + batch(2, "b")  # offsets 10-12, 13-14
    chunk2 = batch(4, "c")  # offsets 15-18
    out = assemble_fetch([(10, chunk1), (15, chunk2)], offset=14, max_bytes=1 << 20)
    assert [r.offset for r in decode_batches(out)] == [13, 14, 15, 16, 17, 18]
    assert [r.value for r in decode_batches(out)][0] == b"b-0"


def test_assemble_respects_max_bytes_but_returns_at_least_one_batch() -> None:
    chunk = batch(2, "a") + batch(2, "b") + batch(2, "c")
    sizes = [len(v) for v in split_batches(chunk)]
    assert len(assemble_fetch([(0, chunk)], 0, 1)) == sizes[0]
    assert len(assemble_fetch([(0, chunk)], 0, sizes[0] + sizes[1])) == sizes[0] + sizes[1]
    assert len(assemble_fetch([(0, chunk)], 0, sizes[0] + sizes[1] - 1)) == sizes[0]
    assert assemble_fetch([(0, chunk)], 6, 1000) == b""
