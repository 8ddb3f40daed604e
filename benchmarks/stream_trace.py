"""Where an MQTT QoS 1 → Stream message's time goes, up to the Kafka consumer: one FlowMQ broker
under ``kafka_bench``'s MQTT → Stream phase, with timestamps taken by monkeypatching the
broker process (nothing in the broker changes; experiments only).

    python benchmarks/stream_trace.py CHECKOUT [RATE] [SECONDS]
        (CHECKOUT: the source tree to run, e.g. . or another worktree; RATE msgs/s,
        default 10000; PYSPY=out.txt also records py-spy of the broker; FETCH_WAIT_MS the
        consumer's fetch.wait.max.ms, default 100)

Per message, on ``time.monotonic_ns`` (the publisher's stamp is on the same clock): send →
the broker's read of it, read → ``StreamDestinationType.accept``, accept → its flush's
start, the flush's stages (in the flush thread: hand-off to it, write + fdatasync, hand-off to
the meta thread and the transaction with its COMMIT, hand-off back to the loop; or in the
flush process: sent to it, its answers as the loop reads them), resolved on the loop (the PUBACK goes out in the next callbacks), then commit → the first Fetch answer that
carries the message, and the consumer's receive - send.  Per Fetch: how long each long poll
waited and whether a commit woke it or its ``max_wait_ms`` ran out; every Fetch's arrival →
answer and the consumer's turnaround to the next; the meta reads that took the store's
thread and the object GETs (page cache misses) on the way.
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

WT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else ".")
sys.path[:0] = [f"{WT}/benchmarks", f"{WT}/libs", f"{WT}/services"]
os.environ["PYTHONPATH"] = os.pathsep.join([f"{WT}/benchmarks", f"{WT}/libs", f"{WT}/services"])
import kafka_bench  # noqa: E402

ns = time.monotonic_ns


def patch() -> dict[str, Any]:
    """Install the probes in this (broker) process; returns the dict they fill."""
    import flowmq_broker.kafka.fetch as KF
    import flowmq_broker.mqtt.connection as MC
    import flowmq_commit.batcher as B
    import flowmq_commit.flush_thread as FT
    import flowmq_kas3.store as KS
    from flowmq_broker import streams as ST
    from flowmq_kas3.records import iter_batches

    T: dict[str, Any] = {"msgs": [], "flushes": [], "answers": [], "waits": []}
    msgs, flushes, answers, waits = (T[k] for k in ("msgs", "flushes", "answers", "waits"))
    by_future: dict[int, list[Any]] = {}
    by_key: dict[str, dict[str, Any]] = {}
    read = [0]

    cls = MC.MqttConnection
    orig_dr = cls.data_received

    def data_received(self: Any, data: bytes) -> None:
        read[0] = ns()
        orig_dr(self, data)

    cls.data_received = data_received

    orig_accept = ST.StreamDestinationType.accept

    def accept(self: Any, binding: Any, message: Any) -> Any:
        t = ns()
        future = orig_accept(self, binding, message)
        stamp = int.from_bytes(message.payload[:8], "big")
        # stamp, read, accept, flush no, resolved, partition, offset
        rec = [stamp, read[0], t, -1, 0, -1, -1]
        msgs.append(rec)
        by_future[id(future)] = rec

        def done(f: Any) -> None:
            rec[4] = ns()
            by_future.pop(id(f), None)
            if not f.cancelled() and f.exception() is None:
                rec[6] = f.result()

        future.add_done_callback(done)
        return future

    ST.StreamDestinationType.accept = accept

    orig_flush = B.GroupCommitBatcher._flush

    async def flush(self: Any, items: list[Any], *args: Any) -> None:
        f: dict[str, Any] = {"start": ns(), "n": len(items)}
        number = len(flushes)
        for item in items:
            rec = by_future.get(id(item.future))
            if rec is not None:
                rec[3] = number
                rec[5] = item.group[2] if isinstance(item.group, tuple) else -1
        flushes.append(f)
        token = CURRENT.set(f)
        try:
            await orig_flush(self, items, *args)
        finally:
            CURRENT.reset(token)
        f["resolved"] = ns()

    import contextvars

    CURRENT: contextvars.ContextVar[Any] = contextvars.ContextVar("flush", default=None)
    B.GroupCommitBatcher._flush = flush

    orig_wac = FT.FlushThread.write_and_commit
    orig_job = FT.FlushThread._write_and_commit

    def job(self: Any, loop: Any, future: Any, key: str, *rest: Any) -> None:
        f = by_key.pop(key, None)
        if f is not None:
            f["write_start"] = ns()
        orig_job(self, loop, future, key, *rest)
        if f is not None:
            f["write_end"] = ns()  # (the transaction was queued just before)

    FT.FlushThread._write_and_commit = job

    import flowmq_meta.sqlite as S

    orig_here = S.SqliteMetaStore._transact_here

    def here(self: Any, fn: Any, *rest: Any) -> Any:
        out = orig_here(self, fn, *rest)
        f = CURRENT_THREAD.pop(id(fn), None)
        if f is not None:
            f["txn_end"] = ns()
        return out

    CURRENT_THREAD: dict[int, Any] = {}
    S.SqliteMetaStore._transact_here = here

    # The transaction of a traced flush: its start marks the hand-off to the meta thread.
    def marked_txn(f: dict[str, Any], txn: Any) -> Any:
        def run(tr: Any) -> Any:
            f.setdefault("txn_start", ns())
            return txn(tr)

        CURRENT_THREAD[id(run)] = f
        return run

    def write_and_commit(self: Any, key: str, body: bytes, txn: Any, on_written: Any) -> Any:
        f = CURRENT.get()
        if f is None:
            return orig_wac(self, key, body, txn, on_written)
        by_key[key] = f
        f["submit"] = ns()

        def written(seconds: float) -> None:
            f["written_loop"] = ns()
            on_written(seconds)

        future = orig_wac(self, key, body, marked_txn(f, txn), written)
        future.add_done_callback(lambda _: f.__setitem__("txn_loop", ns()))
        return future

    FT.FlushThread.write_and_commit = write_and_commit

    import flowmq_commit.flush_process as FP

    orig_process_wac = FP.FlushProcess.write_and_commit

    def process_write_and_commit(
        self: Any, key: str, body: bytes, commit: Any, on_written: Any
    ) -> Any:
        f = CURRENT.get()
        if f is None:
            return orig_process_wac(self, key, body, commit, on_written)
        f["sent"] = ns()

        def written(seconds: float) -> None:
            f["written_loop"] = ns()
            f["write_s"] = seconds
            on_written(seconds)

        future = orig_process_wac(self, key, body, commit, written)
        future.add_done_callback(lambda _: f.__setitem__("txn_loop", ns()))
        return future

    FP.FlushProcess.write_and_commit = process_write_and_commit

    orig_response = KF._response

    def response(ctx: Any, wants: list[Any], got: list[Any], max_bytes: int) -> Any:
        t = ns()
        for w, g in zip(wants, got, strict=True):
            if g.records:
                count = sum(info.record_count for info in iter_batches(g.records))
                answers.append((t, w.topic, w.partition, w.offset, count))
        return orig_response(ctx, wants, got, max_bytes)

    KF._response = response

    orig_wait = KS.StreamStore.wait_for_any

    async def wait_for_any(self: Any, positions: Any, timeout: float) -> bool:
        t = ns()
        r = await orig_wait(self, positions, timeout)
        waits.append((t, ns(), r, timeout))
        return r

    KS.StreamStore.wait_for_any = wait_for_any

    # Every Fetch (its arrival and its answer): the consumer's cadence, and how long the
    # broker takes over one that is answered at once.
    import flowmq_broker.kafka.server as KSV

    fetches = T["fetches"] = []
    for i, (key, low, high, handler) in enumerate(KSV.API_TABLE):
        if key == 1:

            async def traced_fetch(ctx: Any, req: Any, _handler: Any = handler) -> Any:
                t = ns()
                answer = await _handler(ctx, req)
                fetches.append((t, ns()))
                return answer

            KSV.API_TABLE[i] = (key, low, high, traced_fetch)

    # What a Fetch's reads cost beyond the loop: a meta read the loop's own connection could
    # not answer (it takes the store's thread), an object GET (a page cache miss).
    import flowmq_meta.api as MA
    import flowmq_objstore.file as OF

    slow_reads = T["meta reads on the store's thread"] = []
    orig_read = MA.MetaStore.read

    async def base_read(self: Any, fn: Any) -> Any:
        t = ns()
        out = await orig_read(self, fn)
        slow_reads.append((t, ns()))
        return out

    MA.MetaStore.read = base_read
    gets = T["object GETs"] = []
    orig_get = OF.FileObjectStore.get

    async def get(self: Any, key: str, start: int = 0, end: Any = None) -> bytes:
        t = ns()
        out = await orig_get(self, key, start, end)
        gets.append((t, ns()))
        return out

    OF.FileObjectStore.get = get
    return T


def traced_broker_main(data_dir: str, objects: str, meta: str, conn: Any) -> None:
    trace = patch()
    try:
        kafka_bench.broker_main(data_dir, objects, meta, conn)
    finally:
        Path(os.environ["STREAM_TRACE_OUT"]).write_text(json.dumps(trace))


def pct(values: list[float], q: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))] if v else float("nan")


def analyse(trace: dict[str, Any], latencies: list[float], stream: str) -> dict[str, Any]:
    msgs = trace["msgs"]
    flushes = trace["flushes"]
    # Skip the first second (connections, metadata, warm-up), as kafka_bench does.
    t0 = msgs[0][2] + 1_000_000_000 if msgs else 0
    msgs = [m for m in msgs if m[2] >= t0 and m[4] and m[3] >= 0]
    answers: dict[int, list[tuple[int, int, int]]] = {}
    for t, topic, p, offset, count in trace["answers"]:
        if topic == stream:
            answers.setdefault(p, []).append((offset, offset + count, t))
    rows: dict[str, list[float]] = {}

    def add(name: str, ns_value: float) -> None:
        rows.setdefault(name, []).append(ns_value / 1e6)

    for stamp, rd, acc, fno, resolved, p, offset in msgs:
        f = flushes[fno]
        add("send -> read", rd - stamp)
        add("read -> accept", acc - rd)
        add("accept -> flush start", f["start"] - acc)
        if "write_start" in f and "txn_loop" in f:
            add("flush start -> write start (thread)", f["write_start"] - f["start"])
            add("write + fdatasync", f["write_end"] - f["write_start"])
            if "txn_start" in f:
                # Negative where the statements start beside the write (the write gate).
                add("write end -> txn start (meta thread)", f["txn_start"] - f["write_end"])
                add("txn + COMMIT", f["txn_end"] - f["txn_start"])
                add("write end -> committed", f["txn_end"] - f["write_end"])
                add("txn end -> loop", f["txn_loop"] - f["txn_end"])
            add("txn on loop -> resolved", resolved - f["txn_loop"])
        if "sent" in f and "txn_loop" in f and "written_loop" in f:
            add("flush start -> sent to the flush process", f["sent"] - f["start"])
            add("its write + fdatasync (in the child)", f["write_s"] * 1e9)
            add("sent -> written (on the loop)", f["written_loop"] - f["sent"])
            add("written -> committed (on the loop)", f["txn_loop"] - f["written_loop"])
            add("committed -> resolved", resolved - f["txn_loop"])
        add("accept -> resolved (PUBACK)", resolved - acc)
        add("send -> resolved", resolved - stamp)
        for lo, hi, t in answers.get(p, ()):
            if lo <= offset < hi:
                add("resolved -> fetch answered", t - resolved)
                add("send -> fetch answered", t - stamp)
                break
    out: dict[str, Any] = {}
    for k, v in rows.items():
        out[k] = (statistics.mean(v), pct(v, 0.5), pct(v, 0.99), len(v))
    skip = min(len(latencies) // 10, 10_000)
    body = latencies[skip:]
    if body:
        out["consumer: send -> received"] = (
            statistics.mean(body),
            pct(body, 0.5),
            pct(body, 0.99),
            len(body),
        )
    # Long polls of the publishing (not the consumer's idle time before and after it).
    first, last = (msgs[0][2], max(m[4] for m in msgs)) if msgs else (0, 0)
    waits = [w for w in trace["waits"] if first <= w[0] <= last]
    woken = [(b - a) / 1e6 for a, b, r, _ in waits if r]
    timed = [(b - a) / 1e6 for a, b, r, _ in waits if not r]
    out["long polls woken"] = (
        statistics.mean(woken) if woken else 0,
        pct(woken, 0.5),
        pct(woken, 0.99),
        len(woken),
    )
    out["long polls timed out"] = (
        statistics.mean(timed) if timed else 0,
        pct(timed, 0.5),
        pct(timed, 0.99),
        len(timed),
    )
    fetches = [f for f in trace.get("fetches", []) if first <= f[0] <= last]
    if fetches:
        spans = [(b - a) / 1e6 for a, b in fetches]
        quick = [d for d in spans if d < 1.0]  # answered without a long poll, mostly
        out["fetches: arrival -> answer"] = (
            statistics.mean(spans),
            pct(spans, 0.5),
            pct(spans, 0.99),
            len(spans),
        )
        out["fetches under 1 ms: arrival -> answer"] = (
            statistics.mean(quick),
            pct(quick, 0.5),
            pct(quick, 0.99),
            len(quick),
        )
        gaps = [(c - b) / 1e6 for (_, b), (c, _) in itertools.pairwise(fetches)]
        out["fetch answer -> next fetch arrives"] = (
            statistics.mean(gaps),
            pct(gaps, 0.5),
            pct(gaps, 0.99),
            len(gaps),
        )
    for name in ("meta reads on the store's thread", "object GETs"):
        spans = [(b - a) / 1e6 for a, b in trace.get(name, []) if first <= a <= last]
        if spans:
            out[name] = (statistics.mean(spans), pct(spans, 0.5), pct(spans, 0.99), len(spans))
    sizes = [f["n"] for f in flushes if "resolved" in f]
    out["msgs per flush"] = (statistics.mean(sizes), pct(sizes, 0.5), pct(sizes, 0.99), len(sizes))
    return out


def main() -> None:
    import argparse
    import multiprocessing as mp
    import subprocess
    import threading

    rate = int(sys.argv[2]) if len(sys.argv) > 2 else 10_000
    seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 6.0
    work = Path(tempfile.mkdtemp(prefix="streamtrace-"))
    os.environ["STREAM_TRACE_OUT"] = str(work / "trace.json")
    kafka_bench.broker_main = traced_broker_main  # what BrokerHandle starts
    broker = kafka_bench.BrokerHandle(str(work / "data"), "", "")
    spy = None
    captured: list[Any] = []
    orig_summary = kafka_bench._latency_summary

    def summary(latencies: list[float], r: int) -> dict[str, Any]:
        captured.append(list(latencies))
        return orig_summary(latencies, r)

    kafka_bench._latency_summary = summary
    if os.environ.get("PYSPY"):

        def record() -> None:
            time.sleep(3.0)  # past the consumer's start-up
            subprocess.run(
                [
                    "/work/main/.venv/bin/py-spy", "record", "-p", str(broker.proc.pid),
                    "-d", str(int(seconds)), "-r", "200", "-f", "raw",
                    "-o", os.environ["PYSPY"], "--nonblocking",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                check=False,
            )  # fmt: skip

        spy = threading.Thread(target=record)
        spy.start()
    fetch_wait = int(os.environ.get("FETCH_WAIT_MS", "100"))  # the consumer's fetch.wait.max.ms
    args = argparse.Namespace(latency_seconds=seconds, mqtt_rate=rate, fetch_wait=fetch_wait)
    try:
        row = kafka_bench.mqtt_stream_latency_phase(broker, args)
    finally:
        broker.stop()
    if spy is not None:
        spy.join()
    del mp
    print(json.dumps(row))
    trace = json.loads(Path(os.environ["STREAM_TRACE_OUT"]).read_text())
    for k, v in analyse(trace, captured[0] if captured else [], "mqtt-latency").items():
        print(f"  {k:<40} mean {v[0]:8.3f}  p50 {v[1]:8.3f}  p99 {v[2]:8.3f}  n {v[3]}")


if __name__ == "__main__":
    main()
