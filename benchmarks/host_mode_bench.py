"""Host mode against one process: MQTT QoS 0 fan-in, 4 publishers → 4 subscribers, in one run.

    python benchmarks/host_mode_bench.py [--processes 2] [--rounds 3] [--duration 5]
        [--msg-size 100] [--sub-procs 2] [--json out.json]

Starts ``flowmq serve --processes 1`` and ``flowmq serve --processes N`` (this interpreter,
fresh data dirs, free loopback ports) and runs the same load against each in turn, alternating
which goes first from round to round so machine noise hits both alike. The load: 4
publishers on ``…/p0``…``…/p3`` and 4 subscribers of ``…/+``, every connection to the one
MQTT port; in host mode the kernel spreads them over the processes (SO_REUSEPORT), so a
message usually crosses to another process once (DESIGN.md §14). Throughput is deliveries
per second summed over the subscribers, measured as ``mqtt_bench.py`` does (its load
generator and its ``run_load``: raw sockets, pre-encoded packets, one OS process per
publisher, ``--sub-procs`` subscriber processes).

Reported per round: deliveries/s of each, the ratio N/1, the brokers' CPU (cores, all
processes summed) and the load generator's CPU (cores, every publisher and subscriber process
summed: they share the machine's cores with the broker, so on a 2-core machine they bound what
host mode can show). The target of issue 12 is a ratio ≥ 1.5 with 2 processes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))

import mqtt_bench as mb  # noqa: E402

LOAD = mb.Load("fanin44", "QoS 0 4→4 fan-in", 4, 4, 0, "deliveries/s")
HOST_READY_S = 90.0


class HostModeFlowMQ(mb.FlowMQ):
    """``flowmq serve --processes N``: one supervisor, N broker processes (N = 1: the broker
    itself).  ``ports`` is the shared MQTT port; CPU and metrics are summed over the brokers."""

    def __init__(self, workdir: Path, processes: int) -> None:
        mb.Broker.__init__(self)
        self.processes = processes
        data = workdir / f"flowmq-x{processes}"
        data.mkdir()
        log = workdir / f"flowmq-x{processes}.log"
        self.logs.append(log)
        cmd = [sys.executable, "-m", "flowmq_broker.cli", "serve", "--data-dir", str(data)]
        cmd += ["--processes", str(processes), "--roles", "mqtt,admin", "--gossip-port", "0"]
        for option in ("--http-port", "--mqtt-port", "--mqtt-ws-port"):
            cmd += [option, "0"]
        proc = mb.spawn_logged(cmd, log)
        self.procs.append(proc)
        ports_file = data / "ports.json"
        deadline = time.monotonic() + HOST_READY_S
        while not (ports_file.exists() and "ready: " in log.read_text(errors="replace")):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"flowmq x{processes} did not start:\n{log.read_text()}")
            time.sleep(0.1)
        ports = json.loads(ports_file.read_text())
        self.ports = [ports["mqtt"]]
        self.http = [p["http"] for p in ports.get("processes", [ports])]
        self.version = f"FlowMQ-py ×{processes}"

    def dropped(self) -> float | None:
        """The brokers' drop count (``run_load`` reads it when the load starts and ends);
        their PUBLISH-out count is kept beside it, so deliveries the brokers wrote can be told
        from those the subscribers received (``written``)."""
        self.out_counts = [
            *getattr(self, "out_counts", [])[-1:],
            self._metric_sum("mqtt_messages_out_count"),
        ]
        return self._metric_sum("mqtt_messages_dropped_count")

    def written(self) -> float | None:
        """PUBLISH packets the brokers wrote between the last two ``dropped`` calls."""
        before, after = self.out_counts[-2:]
        return None if before is None or after is None else after - before

    def _metric_sum(self, name: str) -> float | None:
        total = 0.0
        for port in self.http:
            try:
                url = f"http://127.0.0.1:{port}/metrics"
                with urllib.request.urlopen(url, timeout=5) as response:
                    text = response.read().decode()
            except OSError:
                return None
            for line in text.splitlines():
                if line.startswith(name):
                    total += float(line.rsplit(None, 1)[1])
        return total

    def broker_pids(self) -> list[int]:
        pid = self.procs[0].pid
        if self.processes == 1:
            return [pid]
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            return [pid]
        return [pid, *map(int, children)]

    def cpu_seconds(self) -> float:
        """All the brokers' CPU seconds; each call's per-process figures are kept, so the
        split of a load's CPU over the processes can be shown (``cpu_split``)."""
        snapshot = {pid: mb._cpu_seconds(pid) for pid in self.broker_pids()}
        self.snapshots = [*getattr(self, "snapshots", [])[-1:], snapshot]
        return sum(snapshot.values())

    def cpu_split(self) -> list[float]:
        """CPU seconds of each broker process between the last two ``cpu_seconds`` calls
        (``run_load`` calls it when the load starts and ends); the supervisor left out."""
        before, after = self.snapshots[-2], self.snapshots[-1]
        pids = [pid for pid in after if pid != self.procs[0].pid or self.processes == 1]
        return [after[pid] - before.get(pid, 0.0) for pid in pids]

    def rss_mib(self) -> float:
        return sum(mb._rss_mib(pid) or 0.0 for pid in self.broker_pids())


def _children_cpu() -> float:
    """CPU seconds of this script's finished (waited-for) children: the load generator's
    processes, which ``run_load`` joins; the brokers are still running, so not counted."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_once(broker: HostModeFlowMQ, args: argparse.Namespace, tag: str) -> dict:
    load_args = SimpleNamespace(
        duration=args.duration,
        warmup=args.warmup,
        msg_size=args.msg_size,
        window=256,
        rate=0.0,
        sub_procs=args.sub_procs,
        sub_nap=args.sub_nap,
        persistent=False,
        flowmq_processes=1,  # one copy of the load, every connection to the shared port
    )
    cpu0, t0 = _children_cpu(), time.monotonic()
    result = mb.run_load(broker, LOAD, load_args, tag, [])
    wall = time.monotonic() - t0
    # The generator's processes live from their start to the end of the load (set-up and the
    # warm-up included), so this is CPU over the whole call: a lower bound on its share while
    # the clock ran.
    result["generator_cpu"] = (_children_cpu() - cpu0) / wall
    result["cpu_split"] = broker.cpu_split()
    result["written"] = broker.written()
    # Deliveries per second of broker CPU: what a delivery costs, whatever share of the
    # cores the broker got on a shared machine.
    result["per_cpu"] = result["rate"] / result["broker_cpu"] if result["broker_cpu"] else 0.0
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--processes", type=int, default=2, help="host mode processes (default 2)")
    ap.add_argument("--rounds", type=int, default=3, help="alternated rounds (default 3)")
    ap.add_argument("--duration", type=float, default=5.0, help="seconds per run (default 5)")
    ap.add_argument("--warmup", type=float, default=None, help="default: 20%% of --duration")
    ap.add_argument("--msg-size", type=int, default=100, help="payload bytes (default 100)")
    ap.add_argument("--sub-procs", type=int, default=2, help="subscriber OS processes")
    ap.add_argument("--sub-nap", type=float, default=0.0005, help="as in mqtt_bench.py")
    ap.add_argument("--json", help="also write the results to this file")
    args = ap.parse_args()
    if args.warmup is None:
        args.warmup = args.duration * 0.2
    brokers: list[HostModeFlowMQ] = []
    rows = []
    with tempfile.TemporaryDirectory(prefix="flowmq-hostbench-") as tmp:
        try:
            brokers = [HostModeFlowMQ(Path(tmp), 1), HostModeFlowMQ(Path(tmp), args.processes)]
            print(
                f"MQTT 3.1.1 · {LOAD.title} · {args.msg_size}-byte payloads · "
                f"{args.duration:g} s per run · loopback · {os.cpu_count()} CPUs"
            )
            head = "{:>5} {:>10} {:>12} {:>12} {:>7} {:>10} {:>10} {:>9} {:>9}"
            print(head.format("round", "first", "x1 deliv/s", f"x{args.processes} deliv/s",
                              "ratio", "x1 cpu", f"x{args.processes} cpu", "gen x1",
                              f"gen x{args.processes}"))  # fmt: skip
            for r in range(args.rounds):
                order = brokers if r % 2 == 0 else brokers[::-1]
                got = {}
                for broker in order:
                    got[broker.processes] = run_once(broker, args, f"r{r}x{broker.processes}")
                one, many = got[1], got[args.processes]
                ratio = many["rate"] / one["rate"] if one["rate"] else math.nan
                rows.append({"round": r, "x1": one, f"x{args.processes}": many, "ratio": ratio})
                print(head.format(
                    r, f"x{order[0].processes}", f"{one['rate']:,.0f}", f"{many['rate']:,.0f}",
                    f"{ratio:.2f}", f"{one['broker_cpu']:.2f}", f"{many['broker_cpu']:.2f}",
                    f"{one['generator_cpu']:.2f}", f"{many['generator_cpu']:.2f}",
                ))  # fmt: skip
                split = " + ".join(f"{c:.1f}" for c in many["cpu_split"])
                print(
                    f"      deliveries per broker CPU-second: x1 {one['per_cpu']:,.0f}, "
                    f"x{args.processes} {many['per_cpu']:,.0f}; x{args.processes} CPU-seconds "
                    f"per process {split}"
                )
                for name, res in (("x1", one), (f"x{args.processes}", many)):
                    if res.get("lost"):
                        print(
                            f"      {name}: {res['lost']:,} of {res['expected']:,} not received "
                            f"(the brokers wrote {res['written'] or 0:,.0f} PUBLISH packets "
                            f"and counted {res['broker_dropped'] or 0:,.0f} dropped)"
                        )
                    for error in res["errors"]:
                        print(f"      {name}: {error}")
            ratios = [row["ratio"] for row in rows if not math.isnan(row["ratio"])]
            if ratios:
                print(
                    f"ratio x{args.processes}/x1: median {statistics.median(ratios):.2f}, "
                    f"range {min(ratios):.2f}–{max(ratios):.2f}"
                )
            for broker in brokers:
                for line in broker.problems()[:5]:
                    print(f"  {broker.version}: {line}")
        finally:
            for broker in brokers:
                broker.stop()
    if args.json:
        for row in rows:
            for res in row.values():
                if isinstance(res, dict):
                    res.pop("timeline", None)
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
