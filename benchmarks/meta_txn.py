"""Meta-store transaction rate: a small read-modify-write (get a counter, set it + 1, plus one
small set) — the shape of a stream flush or an offset commit.

Runs the SQLite backend in one process and in two processes on the same file (total rate),
for each BEGIN mode and synchronous setting, plus the memory backend for reference, and prints
a table.  The two-process runs also check that no increment was lost.

    python benchmarks/meta_txn.py                    # everything, ~3 s per row
    python benchmarks/meta_txn.py --duration 1 --begin adaptive --synchronous FULL
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time

from flowmq_meta import MetaStore, decode_int, encode_int, open_meta_store
from flowmq_meta.keys import SETTINGS, STREAM_HWM

COUNTER = STREAM_HWM.pack("bench", "stream", 0)


def _txn(tag: str):  # noqa: ANN202 - returns a transaction function
    other = SETTINGS.pack(f"bench-{tag}")

    def fn(tr) -> int:  # noqa: ANN001
        value = decode_int(tr.get(COUNTER)) + 1
        tr.set(COUNTER, encode_int(value))
        tr.set(other, b"x" * 32)
        return value

    return fn


async def _run(store: MetaStore, tag: str, start_at: float, duration: float, tasks: int) -> int:
    fn = _txn(tag)
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


async def _one(url: str, tag: str, start_at: float, duration: float, tasks: int) -> tuple[int, int]:
    store = open_meta_store(url)
    try:
        return await _run(store, tag, start_at, duration, tasks), getattr(store, "conflicts", 0)
    finally:
        await store.close()


def _worker_main(argv: list[str]) -> None:
    url, tag, start_at, duration, tasks = argv
    count, conflicts = asyncio.run(_one(url, tag, float(start_at), float(duration), int(tasks)))
    print(json.dumps({"count": count, "conflicts": conflicts}))


def _counter(url: str) -> int:
    async def read() -> int:
        store = open_meta_store(url)
        try:
            return decode_int(await store.get(COUNTER))
        finally:
            await store.close()

    return asyncio.run(read())


def bench_processes(
    url: str, processes: int, duration: float, tasks: int
) -> tuple[float, float, str]:
    start_at = time.time() + 1.5  # let every process import and open first
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--worker",
                url,
                f"p{i}",
                str(start_at),
                str(duration),
                str(tasks),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(processes)
    ]
    total = conflicts = 0
    for proc in procs:
        out, _ = proc.communicate(timeout=duration + 60)
        if proc.returncode != 0:
            raise SystemExit(f"worker failed with exit code {proc.returncode}")
        result = json.loads(out.strip().splitlines()[-1])
        total += result["count"]
        conflicts += result["conflicts"]
    counter = _counter(url)
    check = "ok" if counter == total else f"LOST {total - counter}"
    return total / duration, conflicts / max(total, 1), check


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        _worker_main(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--tasks", type=int, default=1, help="concurrent transactions per process")
    parser.add_argument("--begin", nargs="*", default=["deferred", "immediate", "adaptive"])
    parser.add_argument("--synchronous", nargs="*", default=["FULL", "NORMAL"])
    parser.add_argument("--processes", nargs="*", type=int, default=[1, 2])
    parser.add_argument("--dir", default=None, help="where to put the database files")
    parser.add_argument(
        "--repeat", type=int, default=1, help="runs per row, interleaved; the median is shown"
    )
    args = parser.parse_args()

    rows: list[tuple[str, str, str, int, float, float, str]] = []
    count, _ = asyncio.run(_one("memory://", "m", time.time(), args.duration, args.tasks))
    rate = count / args.duration
    rows.append(("memory", "-", "-", 1, rate, 0.0, "-"))
    print(f"memory: {rate:,.0f} txn/s", file=sys.stderr)
    configs = [(s, b, n) for s in args.synchronous for b in args.begin for n in args.processes]
    results: dict[tuple[str, str, int], list[tuple[float, float, str]]] = {c: [] for c in configs}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        # Interleave the repetitions so a burst of disk load from elsewhere hits every row.
        for rep in range(args.repeat):
            for sync, begin, n in configs:
                path = os.path.join(tmp, f"{sync}-{begin}-{n}-{rep}.db")
                url = f"sqlite:///{path}?begin={begin}&synchronous={sync}"
                rate, reruns, check = bench_processes(url, n, args.duration, args.tasks)
                results[(sync, begin, n)].append((rate, reruns, check))
                print(f"sqlite {begin} {sync} x{n}: {rate:,.0f} txn/s {check}", file=sys.stderr)
    for (sync, begin, n), runs in results.items():
        runs.sort()
        rate, reruns, _ = runs[len(runs) // 2]
        check = "ok" if all(r[2] == "ok" for r in runs) else "LOST"
        rows.append(("sqlite", begin, sync, n, rate, reruns, check))

    print(
        f"\nsmall read-modify-write transaction, {args.duration:g} s per run, median of "
        f"{args.repeat}, {args.tasks} concurrent per process, {os.cpu_count()} CPUs"
    )
    print(
        f"{'backend':8} {'begin':10} {'sync':7} {'procs':>5} {'txn/s (total)':>14} "
        f"{'reruns/txn':>10}  lost?"
    )
    for backend, begin, sync, n, rate, reruns, check in rows:
        print(f"{backend:8} {begin:10} {sync:7} {n:>5} {rate:>14,.0f} {reruns:>10.2f}  {check}")


if __name__ == "__main__":
    main()
