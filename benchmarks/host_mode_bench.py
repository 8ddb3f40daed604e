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
processes summed; CPU-seconds per process with the kernel's share), the load generator's CPU
(cores: what each publisher and subscriber process measured from the start signal to its end,
summed, and each process's; they share the machine's cores with the brokers), CPU-seconds per
million deliveries of the brokers and of the generator, each broker process's share of the
load's time (from just before the start signal to the last result) on a CPU, waiting for one
and asleep (``/proc/<pid>/schedstat``), and how the connections and the publishers fell on
the processes; per round and at the end, the ratio those CPU costs allow
on idle cores, the load spread evenly or as it fell (``ceiling``): on a machine shared with
other work the measured ratio says how the scheduler shared the cores. The target of issue 12 is a ratio ≥ 1.5 with
2 processes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))

import mqtt_bench as mb  # noqa: E402
from machine import interpreter_speed  # noqa: E402

LOAD = mb.Load("fanin44", "QoS 0 4→4 fan-in", 4, 4, 0, "deliveries/s")
HOST_READY_S = 90.0
DROPPED, OUT, IN = (f"mqtt_messages_{kind}_count" for kind in ("dropped", "out", "in"))
CONNECTIONS = "mqtt_connections"
SNAPSHOT = (DROPPED, OUT, IN, CONNECTIONS)


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
        each process's PUBLISH-out, PUBLISH-in and connection counts are kept beside it, so
        deliveries the brokers wrote can be told from those the subscribers received
        (``written``) and the spread of the load over the processes shown (``spread``)."""
        snapshot = self._metrics()
        self.metric_snapshots = [*getattr(self, "metric_snapshots", [])[-1:], snapshot]
        return None if snapshot is None else sum(p[DROPPED] for p in snapshot)

    def _between(self, name: str) -> list[float] | None:
        """Each process's growth of counter ``name`` between the last two ``dropped`` calls."""
        before, after = self.metric_snapshots[-2:]
        if before is None or after is None:
            return None
        return [b[name] - a[name] for a, b in zip(before, after, strict=True)]

    def written(self) -> float | None:
        """PUBLISH packets the brokers wrote between the last two ``dropped`` calls."""
        out = self._between(OUT)
        return None if out is None else sum(out)

    def spread(self) -> str:
        """How the load fell on the processes: connections when it started, and each one's
        share of the PUBLISH packets read from the publishers during it."""
        first = self.metric_snapshots[-2]
        read = self._between(IN)
        if first is None or read is None:
            return "unknown"
        connections = " + ".join(f"{p[CONNECTIONS]:.0f}" for p in first)
        total = sum(read) or 1.0
        shares = " / ".join(f"{n / total:.0%}" for n in read)
        return f"connections {connections}, publishers' messages read {shares}"

    def _metrics(self) -> list[dict[str, float]] | None:
        """The counters of ``SNAPSHOT`` from each process's own /metrics (None: one did not
        answer; a broker saturated by the load answers slowly, hence the long timeout)."""
        found = []
        for port in self.http:
            try:
                url = f"http://127.0.0.1:{port}/metrics"
                with urllib.request.urlopen(url, timeout=30) as response:
                    text = response.read().decode()
            except OSError:
                return None
            values = dict.fromkeys(SNAPSHOT, 0.0)
            for line in text.splitlines():
                name = line.split("{", 1)[0].split(" ", 1)[0]
                if name in values:
                    values[name] += float(line.rsplit(None, 1)[1])
            found.append(values)
        return found

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
        """All the brokers' CPU seconds; each call's per-process figures (user, system) are
        kept, so the split of a load's CPU over the processes can be shown (``cpu_split``),
        and their scheduler times with the call's time (``sched_split``)."""
        pids = self.broker_pids()
        snapshot = {pid: mb._cpu_times(pid) for pid in pids}
        self.snapshots = [*getattr(self, "snapshots", [])[-1:], snapshot]
        sched = (time.monotonic(), {pid: _sched_times(pid) for pid in pids})
        self.sched_snapshots = [*getattr(self, "sched_snapshots", [])[-1:], sched]
        return sum(user + system for user, system in snapshot.values())

    def sched_split(self) -> list[tuple[float, float, float]]:
        """Each broker process's share of the time between the last two ``cpu_seconds``
        calls spent on a CPU, waiting for one (runnable) and asleep (/proc/<pid>/schedstat):
        asleep while cores are free is the flow control between the processes holding it
        back, waiting is the machine (DESIGN.md §14); the supervisor left out."""
        (t0, before), (t1, after) = self.sched_snapshots[-2:]
        wall = max(t1 - t0, 1e-9)
        split = []
        for pid in after:
            if pid == self.procs[0].pid and self.processes > 1:
                continue
            run0, wait0 = before.get(pid, (0.0, 0.0))
            run1, wait1 = after[pid]
            running, waiting = (run1 - run0) / wall, (wait1 - wait0) / wall
            split.append((running, waiting, max(0.0, 1 - running - waiting)))
        return split

    def cpu_split(self) -> list[tuple[float, float]]:
        """CPU seconds (all, of them in the kernel) of each broker process between the last
        two ``cpu_seconds`` calls (``run_load`` calls it when the load starts and ends); the
        supervisor left out."""
        before, after = self.snapshots[-2], self.snapshots[-1]
        pids = [pid for pid in after if pid != self.procs[0].pid or self.processes == 1]
        split = []
        for pid in pids:
            user0, system0 = before.get(pid, (0.0, 0.0))
            user1, system1 = after[pid]
            split.append((user1 + system1 - user0 - system0, system1 - system0))
        return split

    def rss_mib(self) -> float:
        return sum(mb._rss_mib(pid) or 0.0 for pid in self.broker_pids())


def _sched_times(pid: int) -> tuple[float, float]:
    """Seconds process ``pid``'s main thread spent on a CPU and waiting for one (0 once it is
    gone, or without schedstat)."""
    try:
        running, waiting, _ = Path(f"/proc/{pid}/schedstat").read_text().split()
    except (OSError, ValueError):
        return 0.0, 0.0
    return int(running) / 1e9, int(waiting) / 1e9


def _workers(result: dict) -> str:
    """Each load-generator process's CPU (cores, the kernel's share in parentheses), and a
    subscriber's mean read (what a read's cost is spread over)."""
    return ", ".join(
        f"{name.split('-', 1)[1]} {w['cpu']:.2f} ({w['sys']:.2f})"
        + (f" {w['bytes_per_read'] / 1024:.0f} KiB/read" if w.get("bytes_per_read") else "")
        for name, w in sorted(result["workers"].items())
    )


def _sched(result: dict) -> str:
    """Each broker process's ``sched_split``, as running / waiting / asleep."""
    return " + ".join(
        f"{run:.2f}/{wait:.2f}/{sleep:.2f}" for run, wait, sleep in result["sched_split"]
    )


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
    result = mb.run_load(broker, LOAD, load_args, tag, [])
    # The generator's CPU as its processes measured it from the start signal to their end
    # (their start-up and connection set-up left out), in cores of the load's wall time.
    generator_s = sum(w["cpu_s"] for w in result["workers"].values())
    result["generator_cpu"] = generator_s / result["wall"]
    result["cpu_split"] = broker.cpu_split()
    result["sched_split"] = broker.sched_split()
    result["written"] = broker.written()
    result["spread"] = broker.spread()
    # Deliveries per second of broker CPU: what a delivery costs, whatever share of the
    # cores the broker got on a shared machine.
    result["per_cpu"] = result["rate"] / result["broker_cpu"] if result["broker_cpu"] else 0.0
    # CPU-seconds per million deliveries (all received, warm-up included), of the brokers
    # and of the generator: the fair comparison when the machine, not a broker, is the bound.
    received = max(result["received"], 1) / 1e6
    result["broker_per_m"] = result["broker_cpu_s"] / received
    result["generator_per_m"] = generator_s / received
    return result


def ceiling(one: dict, many: dict, processes: int, as_spread: bool = False) -> float:
    """The ratio N/1 that these CPU costs per delivery allow on this machine's cores with
    nothing else running: each broker process takes at most one core, and the brokers and the
    generator share the cores.  The load spread evenly over the N processes, or
    (``as_spread``) as in this run: its busiest process, at one core, then sets the rate."""
    cores = len(os.sched_getaffinity(0))
    c1, g1 = one["broker_per_m"], one["generator_per_m"]
    cn, gn = many["broker_per_m"], many["generator_per_m"]
    busiest = 1 / processes
    split = [total for total, _ in many["cpu_split"]]
    if as_spread and sum(split) > 0:
        busiest = max(split) / sum(split)
    return min(1 / (cn * busiest), cores / (cn + gn)) / min(1 / c1, cores / (c1 + g1))


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
                f"{args.duration:g} s per run · loopback · {os.cpu_count()} CPUs · "
                f"interpreter speed {interpreter_speed():.1f} M loops/s "
                f"(machine.interpreter_speed) · load average {os.getloadavg()[0]:.2f}"
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
                n = f"x{args.processes}"
                split = " + ".join(f"{c:.1f} (sys {k:.1f})" for c, k in many["cpu_split"])
                print(
                    f"      CPU-s per million deliveries, brokers: x1 {one['broker_per_m']:.2f}, "
                    f"{n} {many['broker_per_m']:.2f}; generator: x1 "
                    f"{one['generator_per_m']:.2f}, {n} {many['generator_per_m']:.2f}; "
                    f"load average {os.getloadavg()[0]:.2f}"
                )
                print(f"      {n} CPU-seconds per process {split}; {many['spread']}")
                print(
                    "      share of the load's time on a CPU / waiting for one / asleep: x1 "
                    + _sched(one)
                    + f"; {n} "
                    + _sched(many)
                )
                if one["received"] and many["received"]:
                    print(
                        "      ratio these CPU costs allow on idle cores: load spread evenly "
                        f"{ceiling(one, many, args.processes):.2f}, spread as here "
                        f"{ceiling(one, many, args.processes, as_spread=True):.2f}"
                    )
                for name, res in (("x1", one), (n, many)):
                    print(f"      {name} generator cores (sys): {_workers(res)}")
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
            ceilings = [
                ceiling(row["x1"], row[f"x{args.processes}"], args.processes)
                for row in rows
                if row["x1"]["received"] and row[f"x{args.processes}"]["received"]
            ]
            if ceilings:
                print(
                    f"ratio these CPU costs allow on {len(os.sched_getaffinity(0))} idle cores "
                    f"(load spread evenly): median {statistics.median(ceilings):.2f}, range "
                    f"{min(ceilings):.2f}–{max(ceilings):.2f}"
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
