"""The same MQTT loads against FlowMQ-py and Mosquitto, in one run, side by side.

    python benchmarks/mqtt_bench.py [--duration 5] [--only flowmq|mosquitto]
        [--loads qos0,fanin,fanout,qos1,lat0,lat1] [--msg-size 100] [--rate 20000]
        [--window 256] [--flowmq-processes 1] [--sub-procs 2] [--json out.json]

Starts ``flowmq serve`` (this interpreter, fresh data dir) and Mosquitto (``/usr/sbin/mosquitto``,
generated config) on free loopback ports, runs every load against each broker in turn (load by
load, so machine noise hits both alike), prints msgs/s and p50/p99 latency with the ratio
FlowMQ/Mosquitto, and stops both brokers at the end, on errors, on Ctrl-C and on SIGTERM.
See benchmarks/README.md ("MQTT — mqtt_bench.py") for the method.

Loads (payload ``--msg-size`` bytes, MQTT 3.1.1, clean sessions, one fresh topic per run):

    qos0    QoS 0, 1 publisher → 1 subscriber                        msgs/s
    fanin   QoS 0, 4 publishers (topics …/p0…p3) → 1 subscriber (…/+) msgs/s
    fanout  QoS 0, 1 publisher → 10 subscribers                      deliveries/s
    qos1    QoS 1 both ways, 1 → 1, publisher window of 256 unacked    msgs/s
    lat0    QoS 0 1 → 1 at a fixed rate (20k msg/s)                    p50/p99 latency
    lat1    QoS 1 1 → 1 at a fixed rate                                p50/p99 latency

Throughput = messages received by the subscribers after the warm-up mark / time from that mark
to the last receive; publishers send as fast as the socket accepts. Every run also
reports what was sent against what arrived: a broker that drops messages shows as "lost".
The load generator is ``mqtt_loadgen.py`` (raw sockets, pre-encoded packets, one OS process per
publisher and up to ``--sub-procs`` subscriber processes per load copy).

``--flowmq-processes N`` starts N ``flowmq serve`` processes on one data dir (one meta store)
and runs N independent copies of every load, copy i entirely on process i (there is no
cross-process routing yet, so a publisher and its subscribers must share a process). Mosquitto
gets the same N copies on its one process.
"""

from __future__ import annotations

import argparse
import array
import contextlib
import ctypes
import getpass
import json
import math
import multiprocessing as mp
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import mqtt_loadgen as lg  # noqa: E402
from machine import interpreter_speed  # noqa: E402

MOSQUITTO = "/usr/sbin/mosquitto"
READY_MARK = " ready: "


@dataclass(frozen=True)
class Load:
    key: str
    title: str
    pubs: int
    subs: int
    qos: int
    metric: str  # "msgs/s", "deliveries/s" or "latency"
    paced: bool = False


def make_loads(args: argparse.Namespace) -> dict[str, Load]:
    rate = f"{args.rate / 1000:g}k/s"
    return {
        load.key: load
        for load in (
            Load("qos0", "QoS 0 1→1", 1, 1, 0, "msgs/s"),
            Load("fanin", f"QoS 0 {args.fanin}→1 fan-in", args.fanin, 1, 0, "msgs/s"),
            Load("fanout", f"QoS 0 1→{args.fanout} fan-out", 1, args.fanout, 0, "deliveries/s"),
            Load("qos1", f"QoS 1 1→1 (window {args.window})", 1, 1, 1, "msgs/s"),
            Load("lat0", f"latency QoS 0 1→1 @ {rate}", 1, 1, 0, "latency", paced=True),
            Load("lat1", f"latency QoS 1 1→1 @ {rate}", 1, 1, 1, "latency", paced=True),
        )
    }


# --- brokers ---------------------------------------------------------------------------------


def _die_with_parent() -> None:
    """Child side of Popen: get SIGTERM if this script dies without cleaning up (Linux)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def spawn_logged(cmd: list[str], log: Path) -> subprocess.Popen:
    """Start ``cmd`` in its own session, output to ``log``, killed if this script dies."""
    with open(log, "wb") as sink:
        return subprocess.Popen(
            cmd,
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )


def wait_ready(proc: subprocess.Popen, log: Path, name: str, timeout: float = 60) -> None:
    """Poll ``log`` until ``flowmq serve`` writes its ready line (its only readiness signal)."""
    deadline = time.monotonic() + timeout
    while READY_MARK not in log.read_text(errors="replace"):
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}:\n{log.read_text()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{name} not ready in {timeout:.0f} s:\n{log.read_text()}")
        time.sleep(0.05)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cpu_times(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of process ``pid`` (/proc; 0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0, 0.0
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def _cpu_seconds(pid: int) -> float:
    return sum(_cpu_times(pid))


def _rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _stop(proc: subprocess.Popen, timeout: float = 10.0) -> int | None:
    if proc.poll() is None:
        proc.terminate()
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait(timeout)


class Broker:
    key = ""
    label = ""
    cafile = ""  # clients connect over TLS trusting this CA (tls_bench.py); "" = plain TCP

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []
        self.ports: list[int] = []  # MQTT port of each process
        self.logs: list[Path] = []

    def cpu_seconds(self) -> float:
        return sum(_cpu_seconds(p.pid) for p in self.procs)

    def rss_mib(self) -> float:
        return sum(_rss_mib(p.pid) or 0.0 for p in self.procs)

    def alive(self) -> bool:
        return all(p.poll() is None for p in self.procs)

    def dropped(self) -> float | None:
        return None

    def problems(self) -> list[str]:
        return []

    def stop(self) -> None:
        for proc in self.procs:
            _stop(proc)


def serve_command(data: Path, *extra: str) -> list[str]:
    """``flowmq serve`` with this interpreter on ``data``: one broker process (not host
    mode), every listener on a free port."""
    cmd = [sys.executable, "-m", "flowmq_broker.cli", "serve", "--data-dir", str(data)]
    cmd += ["--processes", "1"]
    for option in ("--http-port", "--mqtt-port", "--mqtt-ws-port", "--kafka-port", "--amqp-port"):
        cmd += [option, "0"]
    return [*cmd, "--gossip-port", "0", *extra]


class FlowMQ(Broker):
    key = "flowmq"
    label = "FlowMQ-py"
    PROBLEM = re.compile(r" (WARNING|ERROR|CRITICAL) |Traceback|Exception")

    def __init__(self, workdir: Path, processes: int, extra_args: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.http: list[int] = []
        self.ports_json: list[dict] = []  # each process's ports.json
        data = workdir / "flowmq-data"
        data.mkdir()
        ports_file = data / "ports.json"
        for i in range(processes):  # one after the other: each rewrites ports.json
            ports_file.unlink(missing_ok=True)
            log = workdir / f"flowmq-{i}.log"
            self.logs.append(log)
            cmd = serve_command(data, *extra_args)
            proc = spawn_logged(cmd, log)
            self.procs.append(proc)
            wait_ready(proc, log, "flowmq")
            ports = json.loads(ports_file.read_text())
            self.ports_json.append(ports)
            self.ports.append(ports["mqtt"])
            self.http.append(ports["http"])
        self.version = "FlowMQ-py" + (f" ×{processes}" if processes > 1 else "")

    def dropped(self) -> float | None:
        total = 0.0
        for port in self.http:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    text = r.read().decode()
            except OSError:
                return None
            for line in text.splitlines():
                if line.startswith("mqtt_messages_dropped_count"):
                    total += float(line.rsplit(None, 1)[1])
        return total

    def problems(self) -> list[str]:
        out = []
        for log in self.logs:
            with contextlib.suppress(OSError):
                out += [
                    ln
                    for ln in log.read_text(errors="replace").splitlines()
                    if self.PROBLEM.search(ln)
                ]
        return out


class Mosquitto(Broker):
    key = "mosquitto"
    label = "Mosquitto"
    PROBLEM = re.compile(r"Error|Warning|dropp|exceed|memory", re.I)
    IGNORE = re.compile(r"should not be run as root")

    def __init__(self, workdir: Path, binary: str, max_queued: int, extra: list[str]) -> None:
        super().__init__()
        port = _free_port()
        log = workdir / "mosquitto.log"
        conf = workdir / "mosquitto.conf"
        conf.write_text(
            "\n".join(
                [
                    f"listener {port} 127.0.0.1",
                    "allow_anonymous true",
                    "persistence false",
                    f"max_queued_messages {max_queued}",
                    "max_queued_bytes 0",
                    "set_tcp_nodelay true",  # as asyncio/uvloop sockets: fair latency
                    f"user {getpass.getuser()}",
                    f"log_dest file {log}",
                    "log_type error",
                    "log_type warning",
                    "log_type notice",
                    "log_type information",
                    *extra,
                    "",
                ]
            )
        )
        self.conf = conf
        self.logs.append(log)
        proc = subprocess.Popen(
            [binary, "-c", str(conf)],
            stdout=subprocess.DEVNULL,
            stderr=open(workdir / "mosquitto.stderr", "wb"),  # noqa: SIM115 (child keeps it)
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        self.procs.append(proc)
        deadline = time.monotonic() + 20
        while True:
            if proc.poll() is not None:
                err = (workdir / "mosquitto.stderr").read_text(errors="replace")
                raise RuntimeError(f"mosquitto exited with {proc.returncode}: {err}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError("mosquitto does not listen") from None
                time.sleep(0.05)
        self.ports.append(port)
        head = subprocess.run([binary, "-h"], capture_output=True, text=True).stdout
        found = re.search(r"version (\S+)", head)
        self.version = f"Mosquitto {found.group(1) if found else '?'}"

    def problems(self) -> list[str]:
        out = []
        for log in self.logs:
            with contextlib.suppress(OSError):
                for ln in log.read_text(errors="replace").splitlines():
                    if self.PROBLEM.search(ln) and not self.IGNORE.search(ln):
                        out.append(ln)
        return out


# --- one load against one broker -------------------------------------------------------------


def _percentile(sorted_values: list[int], q: float) -> float:
    if not sorted_values:
        return math.nan
    i = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))
    return float(sorted_values[i])


def run_load(broker: Broker, load: Load, args: argparse.Namespace, tag: str, workers: list) -> dict:
    ctx = mp.get_context("spawn")
    go = ctx.Event()
    go_time = ctx.RawValue("d", 0.0)
    out = ctx.Queue()
    copies = args.flowmq_processes
    size = args.msg_size
    pub_specs: dict[str, tuple[int, lg.PubSpec]] = {}
    sub_specs: dict[str, tuple[int, lg.SubSpec]] = {}
    expected = []
    pub_procs: list = []
    sub_procs: list = []
    for c in range(copies):
        port = broker.ports[c % len(broker.ports)]
        base = f"bench/{tag}/{load.key}/{broker.key}/c{c}"
        if load.pubs > 1:
            topics = [f"{base}/p{i}" for i in range(load.pubs)]
            topic_filter = f"{base}/+"
        else:
            topics = [base]
            topic_filter = base
        exp = ctx.RawValue("q", -1)
        expected.append(exp)
        prefix_pkt = lg.encode_publish(topics[0], b"\0" * size, load.qos, packet_id=1)
        prefix = prefix_pkt[: len(prefix_pkt) - size - len(topics[0]) - (2 if load.qos else 0)]
        for i, topic in enumerate(topics):
            name = f"c{c}-pub{i}"
            spec = lg.PubSpec(
                name,
                port,
                f"{tag}{load.key}{broker.key}c{c}p{i}",
                topic,
                size,
                load.qos,
                args.duration,
                window=args.window,
                rate=args.rate if load.paced else 0.0,
                cafile=broker.cafile,
            )
            pub_specs[name] = (c, spec)
            pub_procs.append(ctx.Process(target=lg.publisher, args=(spec, go, go_time, exp, out)))
        groups = min(load.subs, args.sub_procs) if not load.paced else 1
        ids = [f"{tag}{load.key}{broker.key}c{c}s{j}" for j in range(load.subs)]
        for g in range(groups):
            name = f"c{c}-sub{g}"
            spec = lg.SubSpec(
                name,
                port,
                ids[g::groups],
                topic_filter,
                load.qos,
                size,
                lg.packet_len(topics[0], size, load.qos),
                prefix,
                args.duration,
                args.warmup,
                latency=load.paced,
                nap=args.sub_nap,
                cafile=broker.cafile,
                persistent=args.persistent,
            )
            sub_specs[name] = (c, spec)
            sub_procs.append(ctx.Process(target=lg.subscriber, args=(spec, go, go_time, exp, out)))
    result: dict = {"load": load.key, "broker": broker.key, "errors": []}
    finished = False
    try:
        # Subscribers connect first, then publishers: a host-mode supervisor hands connections
        # to its processes in turn, so the publishers spread over them evenly (started
        # together, all four publishers of 4→4 landed on one of two processes in some rounds).
        for group, names in ((sub_procs, set(sub_specs)), (pub_procs, set(pub_specs))):
            for p in group:
                p.daemon = True
                p.start()
                workers.append(p)
            deadline = time.monotonic() + lg.READY_TIMEOUT_S
            while names:
                kind, name, value = out.get(timeout=max(0.1, deadline - time.monotonic()))
                if kind == "result":  # only errors come before "go"
                    raise RuntimeError(f"{name}: {value.get('error', value)}")
                names.discard(name)
        cpu0 = broker.cpu_seconds()
        dropped0 = broker.dropped()
        start = time.monotonic() + 0.2
        go_time.value = start
        go.set()
        results: dict[str, dict] = {}
        pending_pubs = {
            c: {n for n, (cc, _) in pub_specs.items() if cc == c} for c in range(copies)
        }
        deadline = start + args.duration + lg.HARD_EXTRA_S + 15
        while len(results) < len(pub_specs) + len(sub_specs):
            try:
                kind, name, value = out.get(timeout=max(0.1, deadline - time.monotonic()))
            except Exception:
                result["errors"].append("timed out waiting for load-generator results")
                break
            results[name] = value
            if "error" in value:
                result["errors"].append(f"{name}: {value['error'].strip().splitlines()[-1]}")
            if name in pub_specs:
                c = pub_specs[name][0]
                pending_pubs[c].discard(name)
                if not pending_pubs[c]:  # tell that copy's subscribers how many to expect
                    expected[c].value = sum(
                        results[n].get("sent", 0) for n, (cc, _) in pub_specs.items() if cc == c
                    )
        cpu1 = broker.cpu_seconds()
        dropped1 = broker.dropped()
        finished = True
    finally:  # on an error or an interrupt, do not wait for the workers' own deadlines
        procs = [p for p in sub_procs + pub_procs if p.pid is not None]  # those started
        for p in procs:
            if finished:
                p.join(5)
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(2)
            with contextlib.suppress(ValueError):
                workers.remove(p)
        out.close()
    pubs = [results[n] for n in pub_specs if n in results and "error" not in results[n]]
    subs = [results[n] for n in sub_specs if n in results and "error" not in results[n]]
    sent = sum(r["sent"] for r in pubs)
    want = 0
    for c in range(copies):
        sent_c = sum(
            results.get(n, {}).get("sent", 0) for n, (cc, _) in pub_specs.items() if cc == c
        )
        want += sent_c * load.subs
    received = sum(sum(r["received"]) for r in subs)
    result.update(sent=sent, expected=want, received=received, lost=want - received)
    for r in subs:
        result["errors"] += [f"subscriber: {e}" for e in r["errors"]]
        if r["bad_packets"]:
            result["errors"].append(f"subscriber: {r['bad_packets']} packets with a bad header")
    for r in pubs:
        if r.get("closed_by_broker"):
            result["errors"].append("publisher: connection closed by the broker")
        if r.get("bad_acks"):
            result["errors"].append(f"publisher: {r['bad_acks']} malformed PUBACKs")
        if r.get("acked") is not None and r["acked"] < r["sent"]:
            result["errors"].append(f"publisher: {r['sent'] - r['acked']} PUBLISH never acked")
        if r.get("behind"):
            result["errors"].append(
                f"publisher: QoS 1 window full, up to {r['behind']} messages behind schedule"
            )
        if r.get("rate") and args.rate and r["rate"] < 0.97 * args.rate:
            result["errors"].append(f"publisher: reached only {r['rate']:,.0f} msg/s")
    timed = [r for r in subs if r["t0"] is not None]
    if timed:
        t0 = min(r["t0"] for r in timed)
        t1 = max(r["t_last"] for r in timed)
        count = sum(r["c_last"] - r["c0"] for r in timed)
    else:  # everything arrived before the end of the warm-up: use what there is
        timed = [r for r in subs if r["t_first"] is not None]
        t0 = min((r["t_first"] for r in timed), default=0.0)
        t1 = max((r["t_last"] for r in timed), default=0.0)
        count = sum(r["c_last"] for r in timed)
    result["rate"] = count / (t1 - t0) if t1 > t0 else 0.0
    end = max((r["t_last"] or start for r in subs), default=start)
    wall = max(end - start, 1e-9)
    result["broker_cpu"] = (cpu1 - cpu0) / wall
    result["broker_cpu_s"] = cpu1 - cpu0
    result["wall"] = wall
    result["pub_cpu"] = max((r["cpu"] / max(r["wall"], 1e-9) for r in pubs), default=0.0)
    result["sub_cpu"] = max((r["cpu"] / max(r["wall"], 1e-9) for r in subs), default=0.0)
    # Each generator process's CPU while it ran the load (seconds; cores, and of them in the
    # kernel), so what bounds a run can be read: the broker, a generator process, the machine.
    result["workers"] = {
        name: {
            "cpu_s": r["cpu"],
            "cpu": r["cpu"] / max(r["wall"], 1e-9),
            "sys": r.get("sys", 0.0) / max(r["wall"], 1e-9),
            "bytes_per_read": r["read_bytes"] / r["reads"] if r.get("reads") else None,
        }
        for name, r in results.items()
        if "error" not in r
    }
    result["broker_dropped"] = (
        dropped1 - dropped0 if dropped0 is not None and dropped1 is not None else None
    )
    result["rss_mib"] = broker.rss_mib()
    result["max_gap_ms"] = max((r["max_gap"] for r in subs), default=0.0) * 1000
    timeline: list[int] = []
    for r in subs:
        for i, n in enumerate(r["timeline"]):
            if i == len(timeline):
                timeline.append(0)
            timeline[i] += n
    result["timeline"] = timeline
    if load.paced:
        lat = array.array("q")
        for r in subs:
            lat.frombytes(r["lat"])
        values = sorted(lat)
        result["p50_us"] = _percentile(values, 0.50) / 1000
        result["p99_us"] = _percentile(values, 0.99) / 1000
        result["max_us"] = (values[-1] / 1000) if values else math.nan
        result["samples"] = len(values)
    if not broker.alive():
        result["errors"].append("broker process died")
    return result


# --- report ----------------------------------------------------------------------------------


def _fmt_rate(v: float | None) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    if v >= 1e6:
        return f"{v / 1e6:.2f}M"
    if v >= 1e3:
        return f"{v / 1e3:.1f}k"
    return f"{v:.0f}"


def _fmt_us(v: float | None) -> str:
    if v is None or math.isnan(v):
        return "—"
    return f"{v:,.0f}" if v >= 100 else f"{v:.1f}"


def print_report(
    loads: list[Load], brokers: list[Broker], results: dict, args: argparse.Namespace
) -> None:
    names = [b.key for b in brokers]
    both = names == ["flowmq", "mosquitto"]
    heads = [b.label for b in brokers] + (["FlowMQ/Mosq"] if both else [])
    print()
    print(
        f"{' + '.join(b.version for b in brokers)} · MQTT 3.1.1 · {args.msg_size}-byte payloads · "
        f"{args.duration:g} s per load ({args.warmup:g} s warm-up) · loopback · "
        f"{os.cpu_count()} CPUs"
        + (f" · {args.flowmq_processes} load copies" if args.flowmq_processes > 1 else "")
    )
    print()
    row = "{:<32} {:<13}" + " {:>12}" * len(heads)
    print(row.format("load", "metric", *heads))
    print("-" * (46 + 13 * len(heads)))
    for load in loads:
        cells = [results.get((load.key, n)) for n in names]
        metrics = (
            [("p50 µs", "p50_us"), ("p99 µs", "p99_us")] if load.paced else [(load.metric, "rate")]
        )
        for i, (label, field) in enumerate(metrics):
            values = []
            for r in cells:
                if r is None or r.get("failed"):
                    values.append(None)
                else:
                    values.append(r[field])
            fmt = _fmt_us if load.paced else _fmt_rate
            texts = []
            for r, v in zip(cells, values, strict=True):
                mark = "*" if r is not None and r.get("lost", 0) > 0 else ""
                texts.append(("ERR" if r is not None and r.get("failed") else fmt(v)) + mark)
            if both:
                a, b = values
                ratio = (
                    f"{a / b:.2f}" if a and b and not math.isnan(a) and not math.isnan(b) else "—"
                )
                texts.append(ratio)
            print(row.format(load.title if i == 0 else "", label, *texts))
    print()
    print("latency rows: ratio < 1 means FlowMQ is faster; * = messages lost (see details)")
    print()
    print(
        "details: lost = deliveries expected (sent × subscribers) that never arrived; CPU = share"
        "\nof one core during the load; brk drops = FlowMQ's mqtt_messages_dropped_count during"
        "\nthe load; max gap = longest silence at a subscriber between its first and last receive"
    )
    drow = "{:<7} {:<10} {:>10} {:>10} {:>8} {:>8} {:>8} {:>8} {:>9} {:>8} {:>7}  {}"
    print(
        drow.format(
            "load",
            "broker",
            "sent",
            "received",
            "lost",
            "brk CPU",
            "pub CPU",
            "sub CPU",
            "brk drops",
            "max gap",
            "RSS MiB",
            "notes",
        )
    )
    for load in loads:
        for n in names:
            r = results.get((load.key, n))
            if r is None:
                continue
            if r.get("failed"):
                print(drow.format(load.key, n, *[""] * 10, r["failed"]))
                continue
            notes = "; ".join(dict.fromkeys(r["errors"]))
            if load.paced:
                notes = (f"{r['samples']} samples, max {_fmt_us(r['max_us'])} µs; " + notes).rstrip(
                    "; "
                )
            dropped = r["broker_dropped"]
            print(
                drow.format(
                    load.key,
                    n,
                    f"{r['sent']:,}",
                    f"{r['received']:,}",
                    f"{r['lost']:,}",
                    f"{r['broker_cpu']:.0%}",
                    f"{r['pub_cpu']:.0%}",
                    f"{r['sub_cpu']:.0%}",
                    "—" if dropped is None else f"{dropped:,.0f}",
                    f"{r['max_gap_ms']:,.0f} ms",
                    f"{r['rss_mib']:.0f}",
                    notes,
                )
            )


# --- main ------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=5.0, help="seconds per load (default 5)")
    ap.add_argument("--warmup", type=float, default=None, help="default: 20%% of --duration")
    ap.add_argument("--only", choices=["flowmq", "mosquitto"], help="run against one broker")
    ap.add_argument(
        "--loads",
        default="qos0,fanin,fanout,qos1,lat0,lat1",
        help="comma-separated subset of qos0,fanin,fanout,qos1,lat0,lat1 (default all)",
    )
    ap.add_argument("--msg-size", type=int, default=100, help="payload bytes (default 100)")
    ap.add_argument("--rate", type=float, default=20000, help="msg/s of the latency loads")
    ap.add_argument("--window", type=int, default=256, help="QoS 1 unacked PUBLISH per publisher")
    ap.add_argument(
        "--persistent",
        action="store_true",
        help="subscribers with persistent sessions (clean session 0): QoS 1/2 is stored first",
    )
    ap.add_argument("--fanin", type=int, default=4, help="publishers of the fan-in load")
    ap.add_argument("--fanout", type=int, default=10, help="subscribers of the fan-out load")
    ap.add_argument(
        "--sub-procs",
        type=int,
        default=2,
        help="subscriber OS processes per load copy (connections are spread over them)",
    )
    ap.add_argument(
        "--flowmq-processes",
        type=int,
        default=1,
        help="flowmq serve processes (one data dir); runs that many copies of each load",
    )
    ap.add_argument(
        "--sub-nap",
        type=float,
        default=0.0005,
        help="QoS 0 throughput loads: a subscriber sleeps this long (s) after a read under 32 KiB, "
        "so it reads in larger chunks and takes less CPU from the broker; 0 = never",
    )
    ap.add_argument("--mosquitto", default=MOSQUITTO, help="mosquitto binary")
    ap.add_argument(
        "--mosquitto-conf",
        action="append",
        default=[],
        metavar="LINE",
        help="extra mosquitto.conf line (repeatable), e.g. 'max_inflight_messages 20'",
    )
    ap.add_argument("--mosquitto-max-queued", type=int, default=1_000_000)
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (logs, data)")
    ap.add_argument("--json", help="also write the results to this file")
    args = ap.parse_args(argv)
    if args.warmup is None:
        args.warmup = 0.2 * args.duration
    if args.msg_size < lg.STAMP and any(k in args.loads for k in ("lat0", "lat1")):
        ap.error(f"latency loads need --msg-size >= {lg.STAMP} (the send time stamp)")
    if not 1 <= args.window < 1024:
        ap.error("--window must be 1..1023 (FlowMQ's receive maximum is 1024)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    all_loads = make_loads(args)
    keys = [k.strip() for k in args.loads.split(",") if k.strip()]
    unknown = [k for k in keys if k not in all_loads]
    if unknown:
        print(f"unknown load(s) {unknown}; choose from {list(all_loads)}", file=sys.stderr)
        return 2
    loads = [all_loads[k] for k in keys]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    # Ratios move with the machine (DESIGN.md §11): say how fast this one runs Python.
    speed = interpreter_speed()
    print(f"interpreter speed {speed:.1f} M loops/s (machine.interpreter_speed)", flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="mqtt-bench-"))
    brokers: list[Broker] = []
    workers: list = []
    results: dict = {}
    tag = uuid.uuid4().hex[:4]
    try:
        if args.only != "mosquitto":
            brokers.append(FlowMQ(workdir, args.flowmq_processes))
        if args.only != "flowmq":
            brokers.append(
                Mosquitto(workdir, args.mosquitto, args.mosquitto_max_queued, args.mosquitto_conf)
            )
        for b in brokers:
            print(
                f"{b.version}: MQTT port(s) {b.ports}, logs {[str(p) for p in b.logs]}", flush=True
            )
        for load in loads:
            for b in brokers:
                print(f"  {load.title} → {b.label} …", end=" ", flush=True)
                if not b.alive():
                    results[(load.key, b.key)] = {"failed": "broker not running"}
                    print("broker not running")
                    continue
                try:
                    r = run_load(b, load, args, tag, workers)
                except Exception as exc:  # one failed run does not end the comparison
                    results[(load.key, b.key)] = {"failed": f"{type(exc).__name__}: {exc}"[:300]}
                    print(f"failed: {exc}"[:300])
                    continue
                results[(load.key, b.key)] = r
                shown = (
                    f"p50 {_fmt_us(r['p50_us'])} µs p99 {_fmt_us(r['p99_us'])} µs"
                    if load.paced
                    else f"{_fmt_rate(r['rate'])} {load.metric}"
                )
                print(f"{shown}, sent {r['sent']:,} received {r['received']:,}", flush=True)
                # A fixed pause: let the broker close the old connections (mosquitto exposes no
                # connection metric to poll, so there is no common event to wait for).
                time.sleep(0.5)
        print_report(loads, brokers, results, args)
        for b in brokers:
            problems = b.problems()
            if problems:
                print(f"\n{b.label} log: {len(problems)} warning/error line(s), first ones:")
                for line in problems[:8]:
                    print("   ", line[:200])
        if args.json:
            Path(args.json).write_text(
                json.dumps(
                    {
                        "args": vars(args),
                        "brokers": {b.key: b.version for b in brokers},
                        "results": [
                            {k: v for k, v in r.items() if k != "lat"} | {"load": lk, "broker": bk}
                            for (lk, bk), r in results.items()
                        ],
                    },
                    indent=2,
                )
            )
        return 0
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    finally:
        for p in workers:
            if p.is_alive():
                p.terminate()
        for b in brokers:
            b.stop()
        if args.keep:
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
