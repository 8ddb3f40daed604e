"""KaS3 append and fetch throughput: the storage half of a Kafka produce/consume benchmark.

Producers append record batches of ``--record-size``-byte records (~``--batch-bytes`` per
batch, as a client with linger would send) round-robin over ``--partitions`` partitions with
``--inflight`` appends outstanding in total; the group-commit batcher turns them into one
object PUT + one meta transaction per flush.  Reported: MB/s and batches/s acknowledged,
append latency, flushes, object PUTs and meta transactions per MB.  Then every partition is
read back from offset 0 (1 MiB fetches), once with a cold page cache (ranged GETs) and once
warm, and the records are counted.

    python benchmarks/kas3_append.py                          # file store + SQLite, ~15 s
    python benchmarks/kas3_append.py --mb 512 --inflight 1024
    python benchmarks/kas3_append.py --meta memory:// --synchronous FULL
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any, TypeVar

from flowmq_commit import GroupCommitBatcher
from flowmq_kas3 import PageCache, StreamStore, build_batch
from flowmq_kas3.records import split_batches
from flowmq_meta import MetaStore, Transaction, open_meta_store
from flowmq_objstore import ObjectStore, open_object_store

T = TypeVar("T")
NS, STREAM = "bench", "stream"


class CountingMeta(MetaStore):
    def __init__(self, inner: MetaStore) -> None:
        self.inner, self.url, self.transactions = inner, inner.url, 0

    async def transact(self, fn: Callable[[Transaction], T]) -> T:
        self.transactions += 1
        return await self.inner.transact(fn)

    async def close(self) -> None:
        await self.inner.close()


class CountingObjects(ObjectStore):
    def __init__(self, inner: ObjectStore) -> None:
        self.inner, self.url = inner, inner.url
        self.puts = self.gets = self.put_bytes = 0

    async def put(self, key: str, data: bytes) -> None:
        self.puts += 1
        self.put_bytes += len(data)
        await self.inner.put(key, data)

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        self.gets += 1
        return await self.inner.get(key, start, end)

    async def delete(self, key: str) -> None:
        await self.inner.delete(key)

    async def list(self, prefix: str = "") -> list[str]:
        return await self.inner.list(prefix)


def make_batches(record_size: int, batch_bytes: int, variants: int = 8) -> list[bytes]:
    per_batch = max(1, batch_bytes // record_size)
    out = []
    for v in range(variants):
        payload = os.urandom(record_size)
        ts = int(time.time() * 1000)
        out.append(build_batch([(None, payload, [], ts + v) for _ in range(per_batch)]))
    return out


async def produce(
    store: StreamStore, args: argparse.Namespace, batches: list[bytes]
) -> dict[str, Any]:
    target = args.mb * 1024 * 1024
    sent = 0
    latencies: list[float] = []
    next_partition = 0

    async def producer() -> None:
        nonlocal sent, next_partition
        i = 0
        while sent < target:
            batch = batches[i % len(batches)]
            i += 1
            p = next_partition
            next_partition = (next_partition + 1) % args.partitions
            sent += len(batch)
            t = time.perf_counter()
            await store.append(NS, STREAM, p, batch)
            latencies.append(time.perf_counter() - t)

    started = time.perf_counter()
    await asyncio.gather(*(producer() for _ in range(args.inflight)))
    elapsed = time.perf_counter() - started
    latencies.sort()
    return {
        "elapsed_s": elapsed,
        "bytes": sent,
        "batches": len(latencies),
        "latency_p50_ms": 1000 * latencies[len(latencies) // 2],
        "latency_p99_ms": 1000 * latencies[int(len(latencies) * 0.99)],
    }


async def consume(store: StreamStore, partitions: int, max_bytes: int) -> tuple[float, int, int]:
    total_bytes = total_records = 0

    async def one(p: int) -> None:
        nonlocal total_bytes, total_records
        offset = 0
        hwm = await store.high_watermark(NS, STREAM, p)
        while offset < hwm:
            result = await store.fetch(NS, STREAM, p, offset, max_bytes)
            total_bytes += len(result.records)
            for view in split_batches(result.records):
                # what a consumer does to find the next offset; records are not decoded
                base = int.from_bytes(view[:8], "big", signed=True)
                last_delta = int.from_bytes(view[23:27], "big", signed=True)
                total_records += last_delta + 1
                offset = base + last_delta + 1

    started = time.perf_counter()
    await asyncio.gather(*(one(p) for p in range(partitions)))
    return time.perf_counter() - started, total_bytes, total_records


async def run(args: argparse.Namespace, workdir: str) -> dict[str, Any]:
    meta_url = args.meta or f"sqlite:///{workdir}/meta.db?synchronous={args.synchronous}"
    meta = CountingMeta(open_meta_store(meta_url))
    objects = CountingObjects(open_object_store(os.path.join(workdir, "objects")))
    batcher = GroupCommitBatcher(
        meta,
        objects,
        node_id="bench",
        size_threshold=args.size_threshold,
        flush_interval=args.flush_interval,
    )
    await batcher.start()
    store = StreamStore(meta, objects, batcher, PageCache(args.cache_mb * 1024 * 1024))
    batches = make_batches(args.record_size, args.batch_bytes)
    txns0, puts0 = meta.transactions, objects.puts
    prod = await produce(store, args, batches)
    flushes = batcher.stats.flushes
    txns, puts = meta.transactions - txns0, objects.puts - puts0
    mb = prod["bytes"] / 1e6
    records_per_batch = max(1, args.batch_bytes // args.record_size)

    store.page_cache.clear()
    gets0 = objects.gets
    cold_s, cold_bytes, cold_records = await consume(store, args.partitions, 1 << 20)
    cold_gets = objects.gets - gets0
    # warm: everything the cache can hold (size the cache with --cache-mb)
    warm_s, warm_bytes, _ = await consume(store, args.partitions, 1 << 20)
    await batcher.close()
    await meta.close()
    await objects.close()
    assert cold_records == prod["batches"] * records_per_batch, "records lost"
    return {
        "config": {
            "partitions": args.partitions,
            "record_size": args.record_size,
            "batch_bytes": len(batches[0]),
            "records_per_batch": records_per_batch,
            "inflight": args.inflight,
            "flush_interval_s": batcher.flush_interval,
            "size_threshold": args.size_threshold,
            "meta": args.meta or f"sqlite synchronous={args.synchronous}",
        },
        "produce_MB_s": mb / prod["elapsed_s"],
        "produce_batches_s": prod["batches"] / prod["elapsed_s"],
        "produce_records_s": prod["batches"] * records_per_batch / prod["elapsed_s"],
        "append_latency_p50_ms": prod["latency_p50_ms"],
        "append_latency_p99_ms": prod["latency_p99_ms"],
        "MB": mb,
        "flushes": flushes,
        "avg_flush_MB": mb / max(flushes, 1),
        "object_puts_per_MB": puts / mb,
        "meta_txns_per_MB": txns / mb,
        "puts_per_flush": puts / max(flushes, 1),
        "txns_per_flush": txns / max(flushes, 1),
        "fetch_cold_MB_s": cold_bytes / 1e6 / cold_s,
        "fetch_cold_gets": cold_gets,
        "fetch_warm_MB_s": warm_bytes / 1e6 / warm_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=256, help="MB to append")
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument("--record-size", type=int, default=1024)
    parser.add_argument("--batch-bytes", type=int, default=16 * 1024)
    parser.add_argument("--inflight", type=int, default=512, help="appends outstanding in total")
    parser.add_argument("--flush-interval", type=float, default=None, help="default: by store")
    parser.add_argument("--size-threshold", type=int, default=4 * 1024 * 1024)
    parser.add_argument("--meta", default=None, help="meta store URL (default: SQLite in --dir)")
    parser.add_argument("--synchronous", default="FULL", help="SQLite synchronous setting")
    parser.add_argument("--cache-mb", type=int, default=512)
    parser.add_argument("--repeat", type=int, default=1, help="runs; the median run is shown")
    parser.add_argument("--dir", default=None, help="where to put the data (default: a temp dir)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    results = []
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory(dir=args.dir) as workdir:
            results.append(asyncio.run(run(args, workdir)))
    result = sorted(results, key=lambda r: r["produce_MB_s"])[len(results) // 2]
    if len(results) > 1:
        result["produce_MB_s_runs"] = [round(r["produce_MB_s"], 1) for r in results]
        result["produce_MB_s_stdev"] = statistics.stdev(r["produce_MB_s"] for r in results)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for key, value in result.items():
        if isinstance(value, float):
            value = f"{value:,.2f}"
        print(f"{key:24} {value}")


if __name__ == "__main__":
    main()
