"""Host mode: ``flowmq serve --processes N``, every core of a host behind one port (DESIGN.md §14).

This module is the supervisor, the parent process; it runs no broker itself.  It starts N
``flowmq serve --processes 1 --reuse-port true`` children that

- share the client ports: the supervisor accepts the MQTT, Kafka and AMQP connections (plain
  and TLS) and hands each to the next ready child in turn over a socket pair
  (``flowmq_broker.listeners.HandedOver``), as Node.js's cluster module does; the kernel's
  SO_REUSEPORT spreading, still used for MQTT over WebSocket and the HTTP API, hashes each
  connection, and put all four publishers of a benchmark on one process in 2 rounds of 8
  (``benchmarks/README.md``, host mode);
- share the meta store (SQLite in WAL mode is safe for several processes,
  ``flowmq_meta.sqlite``) and the object store, resolved from the data dir given;
- form a cluster among themselves exactly as separate brokers do: node ids ``<node>-p<i>``
  (``<node>``: ``node_id``, else host name and HTTP port), each with its own gossip and
  inter-broker link port on ``cluster_bind``, seeded with each other (and with ``seeds``).

Invariants and how they are kept:

- A shared port stays ours while the supervisor runs: it binds every shared port itself
  first (SO_REUSEPORT), which also turns port 0 into one concrete port for all children, and
  holds it until it exits.  It listens on the handed-over ones once every child is ready
  (no child binds them) and never on the others (so the kernel gives it none of their
  connections).  A restarted child therefore always binds its ports again, and is handed
  connections again once it is ready.
- The cluster plane stays closed: without a configured secret (and without ``seeds``, which
  name brokers that have none) the supervisor generates one for the run, as ``flowmq
  cluster`` does, so another process on the host cannot join the children's cluster.
- The admin token is generated once, here, before any child starts, and handed to the
  children by environment with the rest of the configuration (command lines are visible to
  every user; the environment is not).  Each child keeps only ``ports.json`` in its own data
  dir ``<data_dir>/process-<i>``; ``<data_dir>/ports.json`` lists the shared ports.
- A child that dies is restarted with backoff; one that fails before all are ready fails
  the start (exit 1).  SIGTERM, SIGINT and SIGHUP stop every child (SIGTERM, SIGKILL after
  ``STOP_TIMEOUT_S``) and the supervisor exits 0.  Children run in their own process group
  (a terminal's Ctrl-C reaches the supervisor only, so a child's exit is never mistaken for
  a crash) and get SIGTERM if the supervisor dies (Linux).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import ipaddress
import json
import logging
import os
import queue
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from flowmq_broker.admin_token import load_or_create_token
from flowmq_broker.listeners import (
    BACKLOG,
    HANDOFF_FD_ENV,
    HANDOFF_MESSAGE,
    HANDOFF_PORTS_ENV,
    bind_socket,
    log_admin_api,
)
from flowmq_core.config import BrokerConfig

log = logging.getLogger("flowmq.hostmode")

STARTUP_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
POLL_S = 0.2
RESTART_BACKOFF_S = (0.5, 30.0)  # first delay, cap; doubled per crash in a row
STABLE_S = 30.0  # a child up this long starts its next backoff from the first delay


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


# The shared ports whose connections the supervisor accepts and hands over (the others are
# spread by SO_REUSEPORT).
HANDED_OVER = frozenset({"mqtt", "kafka", "amqp", "mqtt_tls", "kafka_tls", "amqp_tls"})


def shared_port_names(config: BrokerConfig) -> list[str]:
    """The ``ports.json`` names of the ports the children share (``<name>_port`` keys)."""
    roles = config.roles
    names = ["http"]
    if "mqtt" in roles:
        names += ["mqtt", "mqtt_ws"]
    names += [role for role in ("kafka", "amqp") if role in roles]
    if config.tls_cert:
        names += [f"{role}_tls" for role in ("mqtt", "kafka", "amqp") if role in roles]
        names += ["mqtt_wss"] * ("mqtt" in roles) + ["http_tls"]
    return names


@dataclasses.dataclass
class _Child:
    index: int
    node_id: str
    data_dir: Path
    command: list[str]
    proc: subprocess.Popen | None = None
    started: float = 0.0
    crashes: int = 0  # in a row
    restart_at: float | None = None
    ready: bool = False
    # The supervisor's end of the socket pair its connections are handed over on.
    channel: socket.socket | None = None

    @property
    def ports_file(self) -> Path:
        return self.data_dir / "ports.json"


def _die_with_supervisor() -> None:
    """Child side of Popen: SIGTERM when the supervisor dies, even by SIGKILL (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _env_value(value: object) -> str | None:
    """A config value as its ``FLOWMQ_<KEY>`` environment variable reads it (None: unset)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(value)
    return str(value)


def _loopback_for(host: str) -> str:
    """An address reaching ``host`` from this host (the unspecified address: loopback)."""
    address = ipaddress.ip_address(host)
    if address.is_unspecified:
        return "::1" if address.version == 6 else "127.0.0.1"
    return host


def _free_udp_port(host: str) -> int:
    family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class HostMode:
    """The supervisor of one ``flowmq serve --processes N`` run."""

    def __init__(self, config: BrokerConfig, processes: int) -> None:
        self.config = config
        self.processes = processes
        self.resolved = config.resolved()
        self.root = Path(self.resolved.data_dir).expanduser()
        self.reserved: dict[str, socket.socket] = {}
        self.ports: dict[str, int] = {}
        self.children: list[_Child] = []
        self.env: dict[str, str] = {}
        # SimpleQueue.put is reentrant: the signal handler may use it.
        self.events: queue.SimpleQueue[int] = queue.SimpleQueue()
        self.stopping = False
        self._next_child = 0  # where the hand-over's round-robin goes next
        self._turn = threading.Lock()

    # --- set-up ------------------------------------------------------------------------
    def reserve_ports(self) -> None:
        """Bind every shared port (see the module docstring); raises OSError naming it."""
        for name in shared_port_names(self.resolved):
            port = getattr(self.resolved, f"{name}_port")
            try:
                sock = bind_socket(self.resolved.bind, port, reuse_port=True)
            except OSError as exc:
                raise OSError(
                    exc.errno, f"cannot listen on {name} port {port}: {exc.strerror}"
                ) from None
            self.reserved[name] = sock
            self.ports[name] = sock.getsockname()[1]

    def plan(self) -> None:
        """The children's commands and environment (after ``reserve_ports``)."""
        cfg = self.resolved
        base = self.config.node_id or f"{socket.gethostname()}-{self.ports['http']}"
        gossip = [
            cfg.gossip_port + i if cfg.gossip_port else _free_udp_port(cfg.cluster_bind)
            for i in range(self.processes)
        ]
        seed_host = _loopback_for(cfg.cluster_bind)
        seed_host = f"[{seed_host}]" if ":" in seed_host else seed_host
        for i in range(self.processes):
            seeds = [f"{seed_host}:{port}" for j, port in enumerate(gossip) if j != i]
            command = [
                sys.executable, "-m", "flowmq_broker.cli", "serve",
                "--processes", "1", "--reuse-port", "true",
                "--node-id", f"{base}-p{i}",
                "--data-dir", str(self.root / f"process-{i}"),
                "--meta", cfg.meta, "--objects", cfg.objects,
                "--gossip-port", str(gossip[i]),
                "--cluster-port", str(cfg.cluster_port + i if cfg.cluster_port else 0),
                "--seeds", ",".join([*seeds, *cfg.seeds]),
            ]  # fmt: skip
            for name, port in self.ports.items():
                command += [f"--{name.replace('_', '-')}-port", str(port)]
            self.children.append(_Child(i, f"{base}-p{i}", self.root / f"process-{i}", command))
        env = {k: v for k, v in os.environ.items() if k != "FLOWMQ_CONFIG"}
        for field in dataclasses.fields(BrokerConfig):
            value = _env_value(getattr(self.config, field.name))
            var = f"FLOWMQ_{field.name.upper()}"
            if value is None:
                env.pop(var, None)
            else:
                env[var] = value
        token, generated = load_or_create_token(self.config.admin_token, self.root)
        if generated:
            print(
                f"flowmq: generated admin token {token} "
                f"(kept in {self.root / 'admin_token'}; shown only this once)",
                flush=True,
            )
        env["FLOWMQ_ADMIN_TOKEN"] = token
        handed = [str(port) for name, port in self.ports.items() if name in HANDED_OVER]
        env[HANDOFF_PORTS_ENV] = ",".join(handed)
        if not self.config.read_cluster_secret() and not cfg.seeds:
            env["FLOWMQ_CLUSTER_SECRET"] = secrets.token_urlsafe(32)
            env.pop("FLOWMQ_CLUSTER_SECRET_FILE", None)
        self.env = env

    # --- children ----------------------------------------------------------------------
    def spawn(self, child: _Child) -> None:
        child.data_dir.mkdir(parents=True, exist_ok=True)
        child.ports_file.unlink(missing_ok=True)  # left by an earlier run
        child.ready = False
        child.restart_at = None
        child.started = time.monotonic()
        if child.channel is not None:
            child.channel.close()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        ours.setblocking(False)  # a stopped child must not hold up the others' connections
        child.channel = ours
        try:
            child.proc = subprocess.Popen(
                child.command,
                env={**self.env, HANDOFF_FD_ENV: str(theirs.fileno())},
                pass_fds=(theirs.fileno(),),
                process_group=0,
                preexec_fn=_die_with_supervisor if sys.platform == "linux" else None,
            )
        finally:
            theirs.close()

    def _exited(self, child: _Child) -> bool:
        return child.proc is not None and child.proc.poll() is not None

    def wait_ready(self) -> str:
        """Until every child has written its ports.json ("ready"), a signal ("signal"), a
        child exits ("exit") or the start-up deadline passes ("timeout")."""
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if self._signalled(POLL_S):
                return "signal"
            for child in self.children:
                if self._exited(child):
                    assert child.proc is not None
                    log.error(
                        "%s exited with code %d at start", child.node_id, child.proc.returncode
                    )
                    return "exit"
                child.ready = child.ready or child.ports_file.exists()
            if all(child.ready for child in self.children):
                return "ready"
            if time.monotonic() > deadline:
                log.error("host mode: not ready within %.0f s", STARTUP_TIMEOUT_S)
                return "timeout"

    def supervise(self) -> None:
        """Restart children that die, with backoff, until a signal."""
        while not self._signalled(POLL_S):
            now = time.monotonic()
            for child in self.children:
                assert child.proc is not None
                if child.restart_at is not None:
                    if now >= child.restart_at:
                        log.info("host mode: restarting %s", child.node_id)
                        self.spawn(child)
                elif self._exited(child):
                    if now - child.started >= STABLE_S:
                        child.crashes = 0
                    first, cap = RESTART_BACKOFF_S
                    delay = min(cap, first * 2**child.crashes)
                    child.crashes += 1
                    child.restart_at = now + delay
                    log.warning(
                        "host mode: %s exited with code %d; restarting in %.1f s",
                        child.node_id,
                        child.proc.returncode,
                        delay,
                    )
                elif not child.ready and child.ports_file.exists():
                    child.ready = True
                    log.info("host mode: %s ready again", child.node_id)

    # --- hand-over ----------------------------------------------------------------------
    def start_handing_over(self) -> None:
        """Listen on the handed-over ports and accept on each in a thread of its own."""
        for name, sock in self.reserved.items():
            if name in HANDED_OVER:
                sock.listen(BACKLOG)
                threading.Thread(
                    target=self._accept, args=(sock, self.ports[name]), daemon=True
                ).start()

    def _accept(self, listener: socket.socket, port: int) -> None:
        header = HANDOFF_MESSAGE.pack(port)
        while not self.stopping:
            try:
                conn, _ = listener.accept()
            except OSError:
                if self.stopping:
                    return
                time.sleep(0.05)  # out of descriptors, say: the backlog waits meanwhile
                continue
            with conn:
                self._hand_over(header, conn)

    def _hand_over(self, header: bytes, conn: socket.socket) -> None:
        """To the next ready child that takes it; if none does, the connection closes."""
        for _ in range(len(self.children)):
            with self._turn:
                child = self.children[self._next_child % len(self.children)]
                self._next_child += 1
            channel = child.channel
            if channel is None or not child.ready:
                continue
            try:
                socket.send_fds(channel, [header], [conn.fileno()])
                return
            except OSError:  # gone, or too far behind: the next one
                continue

    def _signalled(self, timeout: float) -> bool:
        try:
            self.events.get(timeout=timeout)
        except queue.Empty:
            return False
        self.stopping = True
        return True

    def stop(self) -> None:
        """SIGTERM every child, SIGKILL those still running after STOP_TIMEOUT_S."""
        self.stopping = True
        running = [c.proc for c in self.children if c.proc is not None and c.proc.poll() is None]
        for proc in running:
            proc.terminate()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for proc in running:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for name, sock in self.reserved.items():
            if name in HANDED_OVER:
                with contextlib.suppress(OSError):  # wakes its accepting thread
                    sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        for child in self.children:
            if child.channel is not None:
                child.channel.close()

    def write_ports(self) -> None:
        """``<data_dir>/ports.json``: the shared ports (what clients and ``flowmq`` use) and
        each process's own ports file, as a single broker's."""
        path = self.root / "ports.json"
        tmp = path.with_suffix(".json.tmp")
        own = [json.loads(child.ports_file.read_text()) for child in self.children]
        tmp.write_text(json.dumps({"node_id": self.children[0].node_id.rsplit("-p", 1)[0],
                                   **self.ports, "processes": own}, indent=2) + "\n")  # fmt: skip
        os.replace(tmp, path)

    def run(self) -> int:
        """Start, supervise, stop: 0 after a signal, 1 when the start failed."""

        def on_signal(signum: int, frame: object) -> None:
            self.events.put(signum)

        handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        previous = {signum: signal.signal(signum, on_signal) for signum in handled}
        try:
            try:
                self.reserve_ports()
            except OSError as exc:
                print(f"flowmq: {exc.strerror}", file=sys.stderr)
                return 1
            self.root.mkdir(parents=True, exist_ok=True)
            (self.root / "ports.json").unlink(missing_ok=True)
            self.plan()
            for child in self.children:
                self.spawn(child)
            outcome = self.wait_ready()
            if outcome == "ready":
                self.start_handing_over()
                self.write_ports()
                log.info(
                    "host mode: %d processes ready: %s",
                    self.processes,
                    ", ".join(f"{k}={v}" for k, v in self.ports.items()),
                )
                log_admin_api(self.resolved.bind, self.ports["http"], self.root)
                self.supervise()
                outcome = "signal"
        finally:
            log.info("host mode: stopping %d processes", len(self.children))
            self.stop()
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        return 0 if outcome == "signal" else 1


def run_host_mode(config: BrokerConfig, processes: int) -> int:
    """Run ``processes`` broker processes behind the configured ports until a signal."""
    if not hasattr(socket, "SO_REUSEPORT"):
        print("flowmq: host mode (processes > 1) needs SO_REUSEPORT", file=sys.stderr)
        return 2
    if config.resolved().meta.startswith("memory:"):
        # Each process would have a meta store of its own: no shared catalog, no cluster.
        print(
            "flowmq: host mode (processes > 1) needs a meta store its processes share "
            "(sqlite:// or fdb://), not memory://; or use --processes 1",
            file=sys.stderr,
        )
        return 2
    return HostMode(config, processes).run()
