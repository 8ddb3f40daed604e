"""Durable-queue AMQP loads against FlowMQ-py and RabbitMQ, in one run, side by side.

    python benchmarks/amqp_bench.py [--duration 8] [--warmup 1] [--only flowmq|rabbitmq]
        [--loads 1x1,4x4,lat] [--window 256] [--prefetch 256] [--size 100] [--rate 10000]
        [--json out.json]

Starts ``flowmq`` (a Broker in a child process of this script, fresh data dir, embedded
SQLite meta store and file object store, roles amqp+admin) and RabbitMQ (Debian's
``rabbitmq-server``, with its own epmd, both on free loopback ports) and runs every load
against each in turn.  One durable queue per run; persistent ``--size``-byte messages.

Loads:
    PxC   P publishers with confirms (at most ``--window`` unconfirmed each, as fast as
          confirms come back) and C consumers (prefetch ``--prefetch``, one manual ack per
          message), all on one queue: consumed msgs/s and end-to-end p50/p99.
    lat   1 publisher at a fixed ``--rate`` msgs/s, 1 consumer: p50/p99 at that rate.

Throughput counts messages sent after the warm-up mark and consumed before the end, divided
by the measured duration.  For FlowMQ the run also reports meta-store transactions per
consumed message (the broker counts its own ``transact`` calls) and the broker's CPU time per
consumed message (less sensitive to a busy machine than the rates).  Clients: amqp_loadgen.py.
``BENCH_FLUSH_INTERVAL=<seconds>`` overrides the batcher's file-store flush interval in the
FlowMQ child, ``BENCH_PIPELINE_DEPTH=<n>`` the number of flushes in flight (1: one at a
time, as before pipelining) — experiments only; the defaults are the broker's own.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "libs"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "services"))

import amqp_loadgen as lg  # noqa: E402

RABBIT_BIN = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
EPMD = shutil.which("epmd") or "/usr/bin/epmd"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_ready(port: int, timeout: float, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"broker exited with {proc.returncode}")
        try:
            lg.declare(port, "bench-ready")
            return
        except Exception:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no AMQP broker on port {port}") from None
            time.sleep(0.5)


class FlowMQ:
    name = "flowmq"

    def __init__(self, workdir: Path) -> None:
        self.port = _free_port()
        self.stats_file = workdir / "flowmq-stats.json"
        self.proc = subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--serve-flowmq",
                str(workdir / "flowmq"),
                str(self.port),
                str(self.stats_file),
            ],
            stdin=subprocess.DEVNULL,
            stdout=open(workdir / "flowmq.log", "wb"),  # noqa: SIM115 - the child keeps it
            stderr=subprocess.STDOUT,
        )
        _wait_ready(self.port, 30, self.proc)

    def stats(self) -> dict[str, Any]:
        for _ in range(20):
            try:
                return json.loads(self.stats_file.read_text())
            except (OSError, ValueError):
                time.sleep(0.1)
        return {}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class RabbitMQ:
    name = "rabbitmq"

    def __init__(self, workdir: Path) -> None:
        self.port = _free_port()
        wd = workdir / "rabbitmq"
        wd.mkdir()
        (wd / "enabled_plugins").write_text("[].\n")
        (wd / "rabbitmq.conf").write_text("log.console = false\n")
        epmd_port = _free_port()
        self.epmd = subprocess.Popen(
            [EPMD, "-port", str(epmd_port), "-address", "127.0.0.1"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        env = {
            **os.environ,
            "HOME": str(wd),
            "ERL_EPMD_PORT": str(epmd_port),
            "RABBITMQ_NODENAME": f"bench{os.getpid()}@localhost",
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(_free_port()),
            "RABBITMQ_MNESIA_BASE": str(wd / "mnesia"),
            "RABBITMQ_LOG_BASE": str(wd / "log"),
            "RABBITMQ_PID_FILE": str(wd / "pid"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(wd / "enabled_plugins"),
            "RABBITMQ_CONFIG_FILE": str(wd / "rabbitmq"),
        }
        self.proc = subprocess.Popen(
            [str(RABBIT_BIN)],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=open(wd / "stdout.log", "wb"),  # noqa: SIM115 - the child keeps it
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            _wait_ready(self.port, 90, self.proc)
        except Exception:
            self.stop()
            raise
        self.version = _rabbit_version()

    def stats(self) -> dict[str, Any]:
        return {}

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if self.epmd.poll() is None:
            self.epmd.kill()
            self.epmd.wait()


def _start_rabbitmq(workdir: Path, tries: int = 3) -> RabbitMQ:
    """RabbitMQ on fresh ports, tried again if it exits at start (on a busy machine another
    process may take a port between ``_free_port`` and RabbitMQ's bind)."""
    for attempt in range(1, tries + 1):
        shutil.rmtree(workdir / "rabbitmq", ignore_errors=True)
        try:
            return RabbitMQ(workdir)
        except RuntimeError as exc:
            if attempt == tries:
                raise
            print(f"rabbitmq did not start ({exc}); again", file=sys.stderr)
    raise AssertionError("unreachable")


def _rabbit_version() -> str:
    try:
        out = subprocess.run(
            ["dpkg-query", "-W", "-f=${Version}", "rabbitmq-server"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
        return out.strip()
    except Exception:
        return "?"


def _percentile(values: list[int], q: float) -> float:
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(q * len(values)))] / 1e6


def run_load(broker: Any, load: str, args: argparse.Namespace) -> dict[str, Any]:
    if load == "lat":
        pubs, cons, rate = 1, 1, float(args.rate)
    else:
        pubs, cons = (int(x) for x in load.split("x"))
        rate = None
    queue = f"bench-{load}-{uuid.uuid4().hex[:8]}"
    lg.declare(broker.port, queue)
    ctx = mp.get_context("fork")
    results = ctx.Queue()
    start = time.time() + 1.0
    warmup_until = start + args.warmup
    stop = warmup_until + args.duration
    procs = [
        ctx.Process(
            target=lg.consumer_proc,
            args=(broker.port, queue, args.prefetch, warmup_until, stop + 0.5, results),
        )
        for _ in range(cons)
    ]
    procs += [
        ctx.Process(
            target=lg.publisher_proc,
            args=(broker.port, queue, args.size, args.window, rate, start, stop, results),
        )
        for _ in range(pubs)
    ]
    before = broker.stats()
    for p in procs:
        p.start()
    got = [results.get(timeout=stop - time.time() + 60) for _ in procs]
    for p in procs:
        p.join(30)
    after = broker.stats()
    latencies = sorted(v for kind, r in got if kind == "con" for v in r["latencies"])
    counted = sum(r["counted"] for kind, r in got if kind == "con")
    sent = sum(r["sent"] for kind, r in got if kind == "pub")
    nacked = sum(r["nacked"] for kind, r in got if kind == "pub")
    out = {
        "broker": broker.name,
        "load": load,
        "msgs_per_s": counted / args.duration,
        "published": sent,
        "nacked": nacked,
        "p50_ms": _percentile(latencies, 0.50),
        "p99_ms": _percentile(latencies, 0.99),
    }
    if before and after:
        received = sum(r["received"] for kind, r in got if kind == "con")
        txns = after["transactions"] - before["transactions"]
        out["meta_txn_per_msg"] = txns / max(1, received)
        out["flushes"] = after["flushes"] - before["flushes"]
        out["cpu_us_per_msg"] = (after["cpu_s"] - before["cpu_s"]) * 1e6 / max(1, received)
    return out


def serve_flowmq(data_dir: str, amqp_port: int, stats_file: str) -> None:
    """Child mode: one Broker that counts its meta-store transactions."""
    import asyncio

    from meta_counting import count_transactions

    from flowmq_broker.runtime import tune_interpreter
    from flowmq_broker.server import Broker
    from flowmq_core.config import BrokerConfig

    tune_interpreter()  # as `flowmq serve` does
    interval = os.environ.get("BENCH_FLUSH_INTERVAL")
    if interval is not None:  # experiments only: what the batcher's interval costs
        import flowmq_commit.batcher as batcher

        batcher.DEFAULT_FLUSH_INTERVAL["file"] = float(interval)
    depth = os.environ.get("BENCH_PIPELINE_DEPTH")
    if depth is not None:  # experiments only: what pipelined flushes gain or cost
        import flowmq_commit.batcher as batcher

        batcher.PIPELINE_DEPTH = int(depth)

    async def main() -> None:
        config = BrokerConfig(
            data_dir=data_dir,
            http_port=0,
            mqtt_port=0,
            kafka_port=0,
            amqp_port=amqp_port,
            gossip_port=0,
            roles=["amqp", "admin"],
            admin_token="bench",
            node_id="bench",
        )
        broker = Broker(config)
        await broker.start()
        count = count_transactions(broker.meta)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        path = Path(stats_file)
        while not stop.is_set():
            stats = {
                "transactions": count[0],
                "flushes": broker.batcher.stats.flushes,
                "cpu_s": time.process_time(),
            }
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(stats))
            os.replace(tmp, path)
            try:
                await asyncio.wait_for(stop.wait(), 0.1)
            except TimeoutError:
                pass
        await broker.stop()

    try:
        import uvloop

        uvloop.run(main())
    except ImportError:
        asyncio.run(main())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--only", choices=["flowmq", "rabbitmq"])
    parser.add_argument("--loads", default="1x1,4x4,lat")
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--prefetch", type=int, default=256)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--rate", type=float, default=10_000)
    parser.add_argument("--json")
    parser.add_argument("--serve-flowmq", nargs=3, metavar=("DATA_DIR", "PORT", "STATS"))
    args = parser.parse_args()
    if args.serve_flowmq:
        data_dir, port, stats = args.serve_flowmq
        serve_flowmq(data_dir, int(port), stats)
        return
    loads = [x for x in args.loads.split(",") if x]
    workdir = Path(tempfile.mkdtemp(prefix="amqp-bench-"))
    brokers: list[Any] = []
    try:
        if args.only in (None, "flowmq"):
            brokers.append(FlowMQ(workdir))
        if args.only in (None, "rabbitmq"):
            if RABBIT_BIN.exists():
                brokers.append(_start_rabbitmq(workdir))
            else:
                print("rabbitmq-server is not installed: FlowMQ only", file=sys.stderr)
        rows = []
        for load in loads:
            for broker in brokers:
                row = run_load(broker, load, args)
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    finally:
        for broker in brokers:
            broker.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    _report(rows, loads, args, brokers)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")


def _report(rows: list[dict], loads: list[str], args: argparse.Namespace, brokers: list) -> None:
    versions = ", ".join(f"{b.name} {getattr(b, 'version', '')}".strip() for b in brokers)
    print(
        f"\nAMQP durable queue, persistent {args.size}-byte messages, window {args.window}, "
        f"prefetch {args.prefetch}, {args.duration:.0f} s per run ({versions})"
    )
    print(
        f"{'load':<6} {'broker':<9} {'msgs/s':>9} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'txn/msg':>8} {'ratio':>6}"
    )
    for load in loads:
        by = {r["broker"]: r for r in rows if r["load"] == load}
        base = by.get("rabbitmq")
        for name in ("flowmq", "rabbitmq"):
            r = by.get(name)
            if r is None:
                continue
            ratio = (
                f"{r['msgs_per_s'] / base['msgs_per_s']:.2f}"
                if base and name == "flowmq" and base["msgs_per_s"]
                else ""
            )
            txn = f"{r['meta_txn_per_msg']:.3f}" if "meta_txn_per_msg" in r else ""
            label = f"{load}@{int(args.rate)}/s" if load == "lat" else load
            print(
                f"{label:<6} {name:<9} {r['msgs_per_s']:>9.0f} {r['p50_ms']:>8.2f} "
                f"{r['p99_ms']:>8.2f} {txn:>8} {ratio:>6}"
            )


if __name__ == "__main__":
    main()
