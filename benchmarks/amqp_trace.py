"""Where a durable AMQP publish's time goes: one FlowMQ broker under an amqp_bench load, with
timestamps taken by monkeypatching (nothing in the broker changes; experiments only).

    python benchmarks/amqp_trace.py CHECKOUT RATE [DURATION]
        (CHECKOUT: the source tree to run, e.g. . or another worktree; RATE msgs/s of the
        ``lat`` load, 0 for the unlimited 1x1 load; PYSPY=out.txt also records py-spy)

Per flush: the wait from submission to the flush's start, the hand-off to the object store's
(or flush) thread, write + fsync of the object, rename + directory fsync, the hand-off back,
the wait for the previous flush (pipelining), the hand-off to the meta store's thread (from
the loop, or from the flush thread on a tree that has one: then there is no hand-off back
in between), the transaction's Python, its COMMIT (the WAL fsync), the hand-off back and the
after-commit work; mean, p50, p99 and the mean weighted by messages per flush.  Per message (wall clock
against the send time in the body): read, confirm written, delivered.  Per claim round: how
it ran (riding a flush, an urgent transaction of its own after a commit, or its own) and
whether it claimed anything.
"""

import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

WT = sys.argv[1]
sys.path[:0] = [f"{WT}/benchmarks", f"{WT}/libs", f"{WT}/services"]
import amqp_bench  # noqa: E402

now = time.perf_counter
TRACE = []  # per flush dicts
CONF = []  # (t, n_confirms)
DELIV = []  # (t, n)
READS = []
MSG = {"pub": [], "conf": [], "deliv": []}  # (wall ns now - send ns) samples, with now


class Marked:
    def __init__(self, fn, rec):
        self.fn, self.rec = fn, rec

    def __call__(self, tr):
        return self.fn(tr)


class TMeta:
    def __init__(self, meta, transact):
        self._meta, self.transact = meta, transact

    def __getattr__(self, name):
        return getattr(self._meta, name)


def patch(out_path):
    import contextvars

    import flowmq_commit.batcher as B
    import flowmq_meta.sqlite as S
    import flowmq_objstore.file as F
    from flowmq_broker.amqp import channel as CH
    from flowmq_broker.amqp import connection as CO

    REC = contextvars.ContextVar("rec", default=None)
    # The flush thread (one job per flush, where the tree has one) runs without the flush
    # task's context: its records are found by object key.
    BY_KEY = {}
    CURRENT = threading.local()

    class OsProxy:
        """``os`` for flowmq_objstore.file, marking each fsync / fdatasync of a traced write."""

        def __getattr__(self, name):
            return getattr(os, name)

        def _mark(self):
            marks = getattr(CURRENT, "marks", None)
            if marks is not None:
                marks.append(now())

        def fsync(self, fd):
            os.fsync(fd)
            self._mark()

        def fdatasync(self, fd):
            os.fdatasync(fd)
            self._mark()

    F.os = OsProxy()

    def traced_write(orig, rec_of):
        def write(self, key, *args):
            rec = rec_of(key)
            if rec is None or getattr(CURRENT, "marks", None) is not None:
                return orig(self, key, *args)
            rec["put_thread_start"] = now()
            CURRENT.marks = rec["put_fsyncs"] = []
            try:
                return orig(self, key, *args)
            finally:
                CURRENT.marks = None
                rec["put_thread_end"] = now()

        return write

    # Before the flush thread: put → _put_sync in asyncio.to_thread (the context follows).
    F.FileObjectStore._put_sync = traced_write(F.FileObjectStore._put_sync, lambda k: REC.get())
    if hasattr(F.FileObjectStore, "write_blocking"):
        F.FileObjectStore.write_blocking = traced_write(
            F.FileObjectStore.write_blocking, lambda k: BY_KEY.pop(k, None)
        )
    orig_put = F.FileObjectStore.put

    async def put(self, key, data):
        await orig_put(self, key, data)
        rec = REC.get()
        if rec is not None:
            rec["put_loop"] = now()

    F.FileObjectStore.put = put

    try:
        from flowmq_commit import flush_thread as FT
    except ImportError:
        FT = None
    if FT is not None:
        orig_wac = FT.FlushThread.write_and_commit

        def write_and_commit(self, key, body, txn, on_written):
            rec = REC.get()
            if rec is None:
                return orig_wac(self, key, body, txn, on_written)
            BY_KEY[key] = rec
            rec["txn_submit"] = now()

            def written(seconds):
                rec["put_loop"] = now()
                on_written(seconds)

            future = orig_wac(self, key, body, Marked(txn, rec), written)
            future.add_done_callback(lambda f: rec.__setitem__("txn_loop", now()))
            return future

        FT.FlushThread.write_and_commit = write_and_commit

    orig_attempt = S.SqliteMetaStore._attempt

    def attempt(self, fn, *args):
        rec = fn.rec if isinstance(fn, Marked) else None
        t0 = now()

        def wrapped(tr):
            r = fn(tr)
            if rec is not None:
                rec["txn_fn_end"] = now()
            return r

        r = orig_attempt(self, wrapped, *args)
        if rec is not None:
            rec["txn_thread_start"] = t0
            rec["txn_commit_end"] = now()
        return r

    S.SqliteMetaStore._attempt = attempt
    orig_transact = S.SqliteMetaStore.transact

    async def transact(self, fn):
        rec = REC.get()
        if rec is not None and "put_loop" in rec and "txn_submit" not in rec:
            rec["txn_submit"] = now()
            r = await orig_transact(self, Marked(fn, rec))
            rec["txn_loop"] = now()
            return r
        return await orig_transact(self, fn)

    S.SqliteMetaStore.transact = transact

    orig_flush = B.GroupCommitBatcher._flush

    async def flush(self, items, *args):
        import asyncio

        rec = {
            "start": now(),
            "n": len(items),
            "bytes": sum(len(i.data) for i in items),
            "born_min": min(i.born for i in items),
            "born_mean": sum(i.born for i in items) / len(items),
            "loop_offset": now() - asyncio.get_running_loop().time(),
        }
        token = REC.set(rec)
        try:
            await orig_flush(self, items, *args)
        finally:
            REC.reset(token)
        rec["resolved"] = now()
        if "txn_loop" in rec:
            TRACE.append(rec)

    B.GroupCommitBatcher._flush = flush

    orig_send = CH.Channel._send_confirms
    cls = next(v for v in vars(CO).values() if isinstance(v, type) and "data_received" in vars(v))
    orig_dr = cls.data_received

    def data_received(self, data):
        t = now()
        orig_dr(self, data)
        READS.append((t, now() - t, len(data)))

    cls.data_received = data_received

    import struct

    from flowmq_broker.amqp import consumers as CS

    unpack = struct.Struct(">q").unpack_from
    orig_publish = CH.Channel._publish

    def _publish(self, *args):
        # (content, body) before the publish runs, (exchange, key, mandatory, props, body,
        # topic) since
        body = args[1] if len(args) == 2 else args[4]
        t = time.time_ns()
        MSG["pub"].append((now(), t - unpack(body)[0]))
        self.__dict__.setdefault("_sent_ts", {})[self.publish_seq + 1] = unpack(body)[0]
        orig_publish(self, *args)

    CH.Channel._publish = _publish

    def send_confirms2(self):
        seqs = [e[0] for e in self._confirms]
        n = len(self._confirms)
        orig_send(self)
        done = n - len(self._confirms)
        t = time.time_ns()
        ts = self.__dict__.get("_sent_ts", {})
        for seq in seqs[:done]:
            sent = ts.pop(seq, None)
            if sent is not None:
                MSG["conf"].append((now(), t - sent))
        CONF.append((now(), done))

    CH.Channel._send_confirms = send_confirms2
    orig_dd = CS.Consumers.deliver_durable

    def deliver_durable(self, ctag, deliveries):
        t = time.time_ns()
        p = now()
        for d in deliveries:
            MSG["deliv"].append((p, t - unpack(d.message.payload)[0]))
        orig_dd(self, ctag, deliveries)

    CS.Consumers.deliver_durable = deliver_durable

    from flowmq_queue import claims as CL

    ROUNDS = MSG.setdefault("rounds", [])
    orig_commit = CL.ClaimRounds._commit

    async def rcommit(self, round_):
        batcher = self.parts.batcher
        urgent = any(lq.fresh for lq, _, _, _ in round_.claims)
        rides = batcher.pending_bytes > 0 and not urgent
        t = now()
        r = await orig_commit(self, round_)
        ROUNDS.append(
            (
                t,
                now() - t,
                int(urgent),
                int(rides),
                len(round_.claims),
                len(round_.settles),
                sum(len(c[2]) for c in r.claims),
            )
        )
        return r

    CL.ClaimRounds._commit = rcommit

    if hasattr(CL.ClaimRounds, "claim_ahead"):  # trees that claim ahead of the commit
        AHEAD = MSG.setdefault("ahead", [])
        orig_ahead = CL.ClaimRounds.claim_ahead

        def claim_ahead(self, *args):
            d = orig_ahead(self, *args)
            AHEAD.append((now(), int(d is not None)))
            return d

        CL.ClaimRounds.claim_ahead = claim_ahead

    import atexit

    def dump():
        Path(out_path).write_text(
            json.dumps({"flushes": TRACE, "confirms": CONF, "reads": READS, "msg": MSG})
        )

    atexit.register(dump)

    return dump


def child(data_dir, port, stats, out_path):
    dump = patch(out_path)
    try:
        amqp_bench.serve_flowmq(data_dir, port, stats)
    finally:
        dump()


class Broker:
    name = "flowmq"

    def __init__(self, port, stats_file):
        self.port = port
        self.stats_file = stats_file

    def stats(self):
        for _ in range(20):
            try:
                return json.loads(Path(self.stats_file).read_text())
            except (OSError, ValueError):
                time.sleep(0.1)
        return {}


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))] if v else float("nan")


def analyse(path, t_from):
    d = json.loads(Path(path).read_text())
    fl = [
        f
        for f in d["flushes"]
        if f["start"] > t_from and "txn_loop" in f and "txn_commit_end" in f and f.get("put_fsyncs")
    ]
    rows = {}

    weights = {}

    def add(name, *keys, value=None):
        if value is None:
            if not all(k in f for k in keys):
                return
            value = f[keys[1]] - f[keys[0]]
        rows.setdefault(name, []).append(value * 1e3)
        weights.setdefault(name, []).append(f["n"])

    for f in fl:
        off = f["loop_offset"]
        one_job = f["txn_submit"] < f["put_thread_start"]  # the flush thread's job
        add("wait: oldest submit -> flush start", value=f["start"] - (f["born_min"] + off))
        add("wait: mean submit -> flush start", value=f["start"] - (f["born_mean"] + off))
        add("hop: flush start -> write thread", "start", "put_thread_start")
        fs = f["put_fsyncs"]
        add("write: data + (fdata)sync", value=fs[0] - f["put_thread_start"])
        add("write: rename + fsync dir", value=fs[-1] - fs[0])
        if one_job:
            add("hop: write thread -> txn thread", "put_thread_end", "txn_thread_start")
        else:
            add("hop: put thread end -> loop", "put_thread_end", "put_loop")
            add("wait: put done -> txn submit (in order)", "put_loop", "txn_submit")
            add("hop: loop -> txn thread", "txn_submit", "txn_thread_start")
        add("txn: fn (python)", "txn_thread_start", "txn_fn_end")
        add("txn: COMMIT (WAL fsync)", "txn_fn_end", "txn_commit_end")
        add("hop: txn thread end -> loop", "txn_commit_end", "txn_loop")
        add("after-commit on loop", "txn_loop", "resolved")
        add("flush total (start -> resolved)", "start", "resolved")
        add("items per flush", value=f["n"] / 1e3)
    out = {}
    for k, v in rows.items():
        w = weights[k]
        out[k] = (
            statistics.mean(v),
            pct(v, 0.5),
            pct(v, 0.99),
            sum(a * b for a, b in zip(v, w, strict=False)) / sum(w),
        )
    # confirm-send delay after resolution: map each flush to next confirm
    conf = [c for c in d["confirms"] if c[0] > t_from]
    delays = []
    j = 0
    for f in fl:
        while j < len(conf) and conf[j][0] < f["resolved"]:
            j += 1
        if j < len(conf):
            delays.append((conf[j][0] - f["resolved"]) * 1e3)
    out["resolved -> next confirm sent"] = (
        statistics.mean(delays),
        pct(delays, 0.5),
        pct(delays, 0.99),
    )
    reads = [r for r in d["reads"] if r[0] > t_from]
    busy = sum(r[1] for r in reads)
    span = (fl[-1]["resolved"] - fl[0]["start"]) if fl else 1
    rounds = [r for r in d["msg"].pop("rounds", []) if r[0] > t_from]
    kinds = {}
    for r in rounds:
        kind = (
            ("urgent" if r[2] else "rides" if r[3] else "own")
            + ("+claim" if r[4] else "")
            + ("+claimed" if r[6] else "")
        )
        kinds.setdefault(kind, []).append(r[1] * 1e3)
    for k, v in sorted(kinds.items()):
        out[f"round {k}"] = f"n={len(v)} mean {statistics.mean(v):.3f} ms p50 {pct(v, 0.5):.3f}"
    ahead = [x[1] for x in d["msg"].pop("ahead", []) if x[0] > t_from]
    if ahead:
        out["claimed ahead of the commit"] = f"{sum(ahead)} of {len(ahead)} publishes"
    for k, v in d["msg"].items():
        v = [x[1] / 1e6 for x in v if x[0] > t_from]
        if v:
            out[f"msg: send -> {k} (wall)"] = (statistics.mean(v), pct(v, 0.5), pct(v, 0.99))
    out["_flushes"] = len(fl)
    out["_flushes_per_s"] = len(fl) / span
    out["_reads"] = len(reads)
    out["_loop_share_in_data_received"] = busy / span
    return out


def main():
    rate = float(sys.argv[2])
    duration = float(sys.argv[3]) if len(sys.argv) > 3 else 6
    work = Path(tempfile.mkdtemp(prefix="amqptrace-"))
    port = amqp_bench._free_port()
    stats = str(work / "stats.json")
    out = str(work / "trace.json")
    ctx = mp.get_context("fork")
    p = ctx.Process(target=child, args=(str(work / "flowmq"), port, stats, out))
    p.start()
    amqp_bench._wait_ready(
        port, 30, type("P", (), {"poll": lambda self: p.exitcode, "returncode": None})()
    )
    import argparse

    args = argparse.Namespace(
        warmup=1.0, duration=duration, window=256, prefetch=256, size=100, rate=rate
    )
    load = "lat" if rate else "1x1"
    t_from = now() + 2.0
    spy = None
    if os.environ.get("PYSPY"):
        import subprocess

        spy = subprocess.Popen(
            [
                "/work/main/.venv/bin/py-spy",
                "record",
                "-p",
                str(p.pid),
                "-d",
                str(int(duration)),
                "-r",
                "200",
                "-f",
                "raw",
                "-o",
                os.environ["PYSPY"],
                "--nonblocking",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    row = amqp_bench.run_load(Broker(port, stats), load, args)
    if spy:
        spy.wait()
    os.kill(p.pid, 15)
    p.join(20)
    print(json.dumps(row))
    res = analyse(out, t_from)
    for k, v in res.items():
        if isinstance(v, tuple):
            extra = f"  msg-weighted mean {v[3]:8.3f}" if len(v) > 3 else ""
            print(f"  {k:<40} mean {v[0]:8.3f}  p50 {v[1]:8.3f}  p99 {v[2]:8.3f}{extra}")
        else:
            print(f"  {k:<40} {v}")


if __name__ == "__main__":
    main()
