"""``flowmq cluster``: a multi-process FlowMQ cluster on one host.

Every process is a ``flowmq serve`` with its own ports and data dir ``<data-dir>/node-<i>``;
all share the SQLite meta store ``<data-dir>/meta.db``, the object directory
``<data-dir>/objects``, one admin token and one cluster secret (generated for this run unless
the environment gives one; DESIGN.md §12), and join node-0 by gossip (DESIGN.md §6, §9).
Process *i* runs MQTT if ``i < mqtt_num``, Kafka if ``i < kafka_num``, AMQP if
``i < amqp_num``, and the admin API (with metrics) always.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import queue
import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from flowmq_broker.admin_token import TOKEN_FILE, load_or_create_token
from flowmq_core.config import BrokerConfig

PROTOCOL_ROLES = ("mqtt", "kafka", "amqp")
PORT_NAMES = ("http", "mqtt", "mqtt_ws", "kafka", "amqp", "gossip")  # the keys of ports.json
STARTUP_TIMEOUT_S = 60.0
READY_POLL_S = 0.1  # a broker writes ports.json once it serves (whatever its log level)
STOP_TIMEOUT_S = 10.0
SECRET_ENV = ("FLOWMQ_CLUSTER_SECRET", "FLOWMQ_CLUSTER_SECRET_FILE")


@dataclasses.dataclass(frozen=True)
class NodePlan:
    """One process of the cluster: its roles and the ports it asks for (0 = any free)."""

    index: int
    roles: tuple[str, ...]
    ports: dict[str, int]

    @property
    def node_id(self) -> str:
        return f"node-{self.index}"


def plan_cluster(
    nodes: int, mqtt_num: int, kafka_num: int, amqp_num: int, any_ports: bool = False
) -> list[NodePlan]:
    """The processes to start: ``max(nodes, mqtt_num, kafka_num, amqp_num)`` of them.

    Ports are BrokerConfig's defaults plus the process index (or 0 with ``any_ports``);
    a process asks only for the ports of the roles it runs, plus HTTP and gossip."""
    counts = {"mqtt": mqtt_num, "kafka": kafka_num, "amqp": amqp_num}
    if nodes < 1 or min(counts.values()) < 0:
        raise ValueError("--nodes must be at least 1 and the role counts at least 0")
    defaults = BrokerConfig()
    plans = []
    for index in range(max(nodes, *counts.values())):
        protocols = tuple(role for role in PROTOCOL_ROLES if index < counts[role])
        ports = {
            name: 0 if any_ports else getattr(defaults, f"{name}_port") + index
            for name in PORT_NAMES
            if name in ("http", "gossip") or name in protocols
        }
        plans.append(NodePlan(index, (*protocols, "admin"), ports))
    return plans


def serve_command(
    plan: NodePlan, data_dir: Path, seed: str | None = None, log_level: str = "info"
) -> list[str]:
    """The ``flowmq serve`` command line of one process (``data_dir`` absolute)."""
    cmd = [
        sys.executable, "-m", "flowmq_broker.cli", "serve",
        "--processes", "1",  # each is one broker with ports of its own, not host mode
        "--data-dir", str(data_dir / plan.node_id),
        "--node-id", plan.node_id,
        "--meta", f"sqlite:///{data_dir / 'meta.db'}",
        "--objects", (data_dir / "objects").as_uri(),
        "--roles", ",".join(plan.roles),
        "--log-level", log_level,
    ]  # fmt: skip
    for name, port in plan.ports.items():
        cmd += [f"--{name}-port", str(port)]
    if "mqtt" in plan.roles:
        # Any free port: the default plus the index would meet another process's HTTP port.
        cmd += ["--mqtt-ws-port", "0"]
    if seed:
        cmd += ["--seeds", seed]
    return cmd


class _Child:
    """A running ``flowmq serve``; a thread copies its output, prefixed, to our stdout and
    reports its exit to the launcher's queue."""

    def __init__(self, plan: NodePlan, cmd: list[str], env: dict[str, str], cluster: _Cluster):
        self.plan = plan
        self.ports_file = cluster.data_dir / plan.node_id / "ports.json"
        self.ports_file.unlink(missing_ok=True)  # left by an earlier run
        self.ports: dict[str, int] = {}
        # Own process group: a terminal's Ctrl-C reaches only the launcher, which stops
        # the children itself (so their exit is never mistaken for a crash).
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
            process_group=0,
        )  # fmt: skip
        self.thread = threading.Thread(target=self._pump, args=(cluster,), daemon=True)
        self.thread.start()

    def _pump(self, cluster: _Cluster) -> None:
        assert self.proc.stdout is not None
        prefix = f"[{self.plan.node_id}] "
        for line in self.proc.stdout:
            cluster.write(prefix + line)
        self.proc.wait()
        cluster.events.put(("exit", self))


class _Cluster:
    def __init__(self, data_dir: Path, token: str, log_level: str):
        self.data_dir = data_dir
        self.log_level = log_level
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", "FLOWMQ_ADMIN_TOKEN": token}
        if not any(name in os.environ for name in SECRET_ENV):
            # One random secret per run closes the cluster plane, local as it is: another
            # process on this host cannot join, forward messages or take over sessions.
            self.env["FLOWMQ_CLUSTER_SECRET"] = secrets.token_urlsafe(32)
        self.children: list[_Child] = []
        # SimpleQueue.put is reentrant, so the signal handler may use it too.
        self.events: queue.SimpleQueue[tuple[str, _Child | None]] = queue.SimpleQueue()
        self._out = threading.Lock()

    def write(self, text: str) -> None:
        with self._out:
            sys.stdout.write(text)
            sys.stdout.flush()

    def start(self, plan: NodePlan, seed: str | None) -> None:
        cmd = serve_command(plan, self.data_dir, seed, self.log_level)
        # The token and the cluster secret go by environment, not by flag: command lines are
        # visible to all users.
        self.children.append(_Child(plan, cmd, self.env, self))

    def wait(self, until_ready: bool) -> str:
        """Block until every child is ready ("ready", only if ``until_ready``), a signal
        ("signal"), a child exits ("exit") or the startup deadline passes ("timeout")."""
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if until_ready and all(child.ports_file.exists() for child in self.children):
                for child in self.children:
                    child.ports = json.loads(child.ports_file.read_text())
                return "ready"
            if until_ready and time.monotonic() > deadline:
                self.write(f"flowmq cluster: not ready within {STARTUP_TIMEOUT_S:.0f} s\n")
                return "timeout"
            try:
                kind, child = self.events.get(timeout=READY_POLL_S if until_ready else None)
            except queue.Empty:
                continue
            if kind == "exit" and child is not None:
                code = child.proc.returncode
                self.write(f"flowmq cluster: {child.plan.node_id} exited with code {code}\n")
                return kind
            if kind == "signal":
                return kind

    def stop(self) -> None:
        """SIGTERM every child, SIGKILL those still running after STOP_TIMEOUT_S."""
        for child in self.children:
            if child.proc.poll() is None:
                child.proc.terminate()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for child in self.children:
            try:
                child.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.proc.kill()
                child.proc.wait()
        for child in self.children:
            child.thread.join(timeout=2)

    def table(self, token_hint: str) -> str:
        header = ("node", "pid", "roles", *PORT_NAMES)
        rows = [header] + [
            (child.plan.node_id, str(child.proc.pid), ",".join(child.plan.roles),
             *(str(child.ports.get(name, "-")) for name in PORT_NAMES))
            for child in self.children
        ]  # fmt: skip
        widths = [max(len(row[col]) for row in rows) for col in range(len(header))]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
                 for row in rows]  # fmt: skip
        http = self.children[0].ports["http"]
        return (
            f"flowmq cluster: {len(self.children)} processes ready (data dir {self.data_dir})\n"
            + "\n".join(lines)
            + f"\nadmin token: {token_hint}; e.g. curl -H 'Authorization: Bearer <token>' "
            f"http://127.0.0.1:{http}/api/v1/cluster/nodes\n"
            "Ctrl-C stops all processes\n"
        )


def run_cluster(
    plans: list[NodePlan], data_dir: str | Path, admin_token: str = "", log_level: str = "info"
) -> int:
    """Start the processes, print their ports, and run until a signal (exit 0) or until a
    process exits or fails to start (exit 1); all processes are stopped either way."""
    root = Path(data_dir).expanduser().absolute()
    root.mkdir(parents=True, exist_ok=True)
    token, generated = load_or_create_token(admin_token, root)
    if admin_token:
        token_hint = "the one given with --admin-token"
    elif generated:
        token_hint = f"{token} (generated; kept in {root / TOKEN_FILE})"
    else:
        token_hint = f"in {root / TOKEN_FILE}"
    cluster = _Cluster(root, token, log_level)

    def on_signal(signum: int, frame: object) -> None:
        cluster.events.put(("signal", None))

    handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {signum: signal.signal(signum, on_signal) for signum in handled}
    try:
        cluster.start(plans[0], seed=None)
        outcome = cluster.wait(until_ready=True)
        if outcome == "ready":
            seed = f"127.0.0.1:{cluster.children[0].ports['gossip']}"
            for plan in plans[1:]:  # all at once; each only needs node-0
                cluster.start(plan, seed)
            outcome = cluster.wait(until_ready=True)
        if outcome == "ready":
            cluster.write(cluster.table(token_hint))
            outcome = cluster.wait(until_ready=False)
    finally:
        cluster.write(f"flowmq cluster: stopping {len(cluster.children)} processes\n")
        cluster.stop()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return 0 if outcome == "signal" else 1


def add_cluster_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    cpus = os.cpu_count() or 1
    cluster = sub.add_parser(
        "cluster",
        help="run a multi-process cluster on this host (one flowmq serve per process)",
        description="Start max(--nodes, --mqtt-num, --kafka-num, --amqp-num) broker processes "
        "sharing one SQLite meta store and object directory under --data-dir. Process i runs "
        "MQTT if i < mqtt-num, Kafka if i < kafka-num, AMQP if i < amqp-num, and the admin "
        "API and metrics always. Ctrl-C stops them all.",
    )
    cluster.add_argument("--data-dir", default=BrokerConfig.data_dir,
                         help=f"shared directory; node i keeps its own in node-i (default {BrokerConfig.data_dir})")  # fmt: skip
    cluster.add_argument("--nodes", type=int, default=cpus,
                         help=f"number of processes at least (default: CPU count, {cpus} here)")  # fmt: skip
    for role in PROTOCOL_ROLES:
        cluster.add_argument(f"--{role}-num", type=int, default=None,
                             help=f"processes running {role} (default: every process)")  # fmt: skip
    ports = cluster.add_mutually_exclusive_group()
    cluster.set_defaults(any_ports=False)
    ports.add_argument("--base-ports", dest="any_ports", action="store_false",
                       help="process i listens on the standard ports plus i (the default)")  # fmt: skip
    ports.add_argument("--any-ports", dest="any_ports", action="store_true",
                       help="every process takes free ports (printed when ready)")  # fmt: skip
    cluster.add_argument("--admin-token", default=os.environ.get("FLOWMQ_ADMIN_TOKEN", ""),
                         help="admin API token for all processes (default: generated once, kept in <data-dir>/admin_token)")  # fmt: skip
    cluster.add_argument("--log-level", default=BrokerConfig.log_level,
                         choices=("debug", "info", "warning", "error"))  # fmt: skip
    return cluster


def cluster_command(args: argparse.Namespace) -> int:
    """Run ``flowmq cluster`` with the options parsed by ``add_cluster_parser``."""
    given = [n for n in (args.mqtt_num, args.kafka_num, args.amqp_num) if n is not None]
    every = max([args.nodes, *given])  # a role count left out: every process runs the role
    mqtt, kafka, amqp = (
        every if n is None else n for n in (args.mqtt_num, args.kafka_num, args.amqp_num)
    )
    try:
        plans = plan_cluster(args.nodes, mqtt, kafka, amqp, any_ports=args.any_ports)
    except ValueError as exc:
        print(f"flowmq: {exc}", file=sys.stderr)
        return 2
    return run_cluster(plans, args.data_dir, args.admin_token, args.log_level)
