"""Meta-store transaction rate: a small read-modify-write (get a counter, set it + 1, plus one
small set) — the shape of a stream flush or an offset commit.

Table 1: the SQLite backend in one process and in two processes on the same file (total
rate), for each BEGIN mode and synchronous setting, plus the memory backend for reference.
The multi-process runs check afterwards that no increment was lost.
Table 2: one process doing those writes while another runs read-only transactions (two
gets) on the same file — what BEGIN IMMEDIATE costs readers.

    python benchmarks/meta_txn.py                    # everything, ~90 s
    python benchmarks/meta_txn.py --duration 1 --begin adaptive --synchronous FULL
    python benchmarks/meta_txn.py --repeat 5         # median of 5 interleaved runs per row
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

from flowmq_meta import MetaStore, Transaction, decode_int, encode_int, open_meta_store
from flowmq_meta.keys import SETTINGS, STREAM_HWM

COUNTER = STREAM_HWM.pack("bench", "stream", 0)


def _txn(role: str, tag: str) -> Callable[[Transaction], object]:
    other = SETTINGS.pack(f"bench-{tag}")

    def rmw(tr: Transaction) -> int:
        value = decode_int(tr.get(COUNTER)) + 1
        tr.set(COUNTER, encode_int(value))
        tr.set(other, b"x" * 32)
        return value

    def read(tr: Transaction) -> tuple[bytes | None, bytes | None]:
        return tr.get(COUNTER), tr.get(other)

    return rmw if role == "rmw" else read


async def _run(
    store: MetaStore, role: str, tag: str, start_at: float, duration: float, tasks: int
) -> int:
    fn = _txn(role, tag)
    await asyncio.sleep(max(0.0, start_at - time.time()))
    stop = time.time() + duration
    count = 0

    async def worker() -> None:
        nonlocal count
        while time.time() < stop:
            await store.transact(fn)
            count += 1

    await asyncio.gather(*(worker() for _ in range(tasks)))
    return count


async def _one(
    url: str, role: str, tag: str, start_at: float, duration: float, tasks: int
) -> dict[str, int]:
    store = open_meta_store(url)
    try:
        count = await _run(store, role, tag, start_at, duration, tasks)
        return {"count": count, "conflicts": getattr(store, "conflicts", 0)}
    finally:
        await store.close()


def _counter(url: str) -> int:
    async def read() -> int:
        store = open_meta_store(url)
        try:
            return decode_int(await store.get(COUNTER))
        finally:
            await store.close()

    return asyncio.run(read())


def run_processes(url: str, roles: list[str], duration: float, tasks: int) -> list[dict]:
    """One process per role, all starting at the same moment; their counts, plus whether the
    counter equals the number of committed increments."""
    start_at = time.time() + 1.5  # let every process import and open first
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--worker", url, role, f"p{i}", str(start_at),
             str(duration), str(tasks)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for i, role in enumerate(roles)
    ]  # fmt: skip
    results = []
    for proc in procs:
        out, _ = proc.communicate(timeout=duration + 60)
        if proc.returncode != 0:
            raise SystemExit(f"worker failed with exit code {proc.returncode}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    increments = sum(r["count"] for r, role in zip(results, roles, strict=True) if role == "rmw")
    lost = increments - _counter(url)
    for r in results:
        r["lost"] = lost
    return results


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        url, role, tag, start_at, duration, tasks = sys.argv[2:]
        result = asyncio.run(_one(url, role, tag, float(start_at), float(duration), int(tasks)))
        print(json.dumps(result))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--tasks", type=int, default=1, help="concurrent transactions per process")
    parser.add_argument("--begin", nargs="*", default=["deferred", "immediate", "adaptive"])
    parser.add_argument("--synchronous", nargs="*", default=["FULL", "NORMAL"])
    parser.add_argument("--processes", nargs="*", type=int, default=[1, 2])
    parser.add_argument("--no-mix", action="store_true", help="skip the writer + reader table")
    parser.add_argument("--dir", default=None, help="where to put the database files")
    parser.add_argument(
        "--repeat", type=int, default=1, help="runs per row, interleaved; the median is shown"
    )
    args = parser.parse_args()
    d = args.duration

    memory = asyncio.run(_one("memory://", "rmw", "m", time.time(), d, args.tasks))
    rmw_rows = [(sync, begin, n) for sync in args.synchronous for begin in args.begin
                for n in args.processes]  # fmt: skip
    mix_rows = [] if args.no_mix else [(s, b) for s in args.synchronous for b in args.begin]
    rmw: dict[tuple, list[tuple[float, float]]] = {row: [] for row in rmw_rows}
    mix: dict[tuple, list[tuple[float, float]]] = {row: [] for row in mix_rows}
    lost = 0
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        # Interleave repetitions so a burst of disk load from elsewhere hits every row alike.
        for rep in range(args.repeat):
            for sync, begin, n in rmw_rows:
                url = (
                    f"sqlite:///{tmp}/{sync}-{begin}-{n}-{rep}.db?begin={begin}&synchronous={sync}"
                )
                res = run_processes(url, ["rmw"] * n, d, args.tasks)
                total = sum(r["count"] for r in res)
                reruns = sum(r["conflicts"] for r in res) / max(total, 1)
                rmw[(sync, begin, n)].append((total / d, reruns))
                lost += res[0]["lost"]
                print(f"rmw {sync} {begin} x{n}: {total / d:,.0f}/s", file=sys.stderr)
            for sync, begin in mix_rows:
                url = (
                    f"sqlite:///{tmp}/mix-{sync}-{begin}-{rep}.db?begin={begin}&synchronous={sync}"
                )
                writer, reader = run_processes(url, ["rmw", "read"], d, args.tasks)
                mix[(sync, begin)].append((writer["count"] / d, reader["count"] / d))
                lost += writer["lost"]
                print(f"mix {sync} {begin}: {writer['count'] / d:,.0f}/s", file=sys.stderr)

    def median(values: list[float]) -> float:
        return statistics.median(values)

    print(
        f"\nsmall read-modify-write transactions, {d:g} s per run, median of {args.repeat}, "
        f"{args.tasks} in flight per process, {os.cpu_count()} CPUs"
    )
    print(
        f"{'backend':8} {'sync':7} {'begin':10} {'procs':>5} {'txn/s total':>12} {'reruns/txn':>11}"
    )
    print(f"{'memory':8} {'-':7} {'-':10} {1:>5} {memory['count'] / d:>12,.0f} {0:>11.2f}")
    for (sync, begin, n), runs in rmw.items():
        rate, reruns = median([r[0] for r in runs]), median([r[1] for r in runs])
        print(f"{'sqlite':8} {sync:7} {begin:10} {n:>5} {rate:>12,.0f} {reruns:>11.2f}")
    if mix:
        print("\none writer process (read-modify-write) + one reader process (two gets)")
        print(f"{'sync':7} {'begin':10} {'writes/s':>10} {'reads/s':>10}")
        for (sync, begin), runs in mix.items():
            w, r = median([x[0] for x in runs]), median([x[1] for x in runs])
            print(f"{sync:7} {begin:10} {w:>10,.0f} {r:>10,.0f}")
    print(f"\nlost increments across all multi-process runs: {lost}")
    if lost:
        raise SystemExit("LOST UPDATES: the store is not serializable")


if __name__ == "__main__":
    main()
