"""``flowmq cluster`` starts a real multi-process cluster on one host and stops all of it."""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from flowmq_broker.launcher import plan_cluster
from tests.fixtures.cli import flowmq
from tests.fixtures.cluster import metric, wait_for

pytestmark = pytest.mark.timeout(90)


def test_plan_has_as_many_processes_as_the_largest_count():
    plans = plan_cluster(nodes=1, mqtt_num=3, kafka_num=1, amqp_num=1)
    assert [plan.node_id for plan in plans] == ["node-0", "node-1", "node-2"]
    assert plans[0].roles == ("mqtt", "kafka", "amqp", "admin")
    assert plans[1].roles == plans[2].roles == ("mqtt", "admin")
    # Standard ports plus the index; only the ports of the roles a process runs.
    assert plans[2].ports == {"http": 8082, "mqtt": 1885, "gossip": 7948}
    assert plans[0].ports == {
        "http": 8080,
        "mqtt": 1883,
        "kafka": 9092,
        "amqp": 5672,
        "gossip": 7946,
    }


def test_plan_options():
    assert len(plan_cluster(nodes=4, mqtt_num=1, kafka_num=2, amqp_num=0)) == 4
    assert plan_cluster(nodes=2, mqtt_num=0, kafka_num=0, amqp_num=0)[1].roles == ("admin",)
    assert all(
        port == 0
        for plan in plan_cluster(2, 2, 2, 2, any_ports=True)
        for port in plan.ports.values()
    )
    with pytest.raises(ValueError):
        plan_cluster(nodes=0, mqtt_num=1, kafka_num=1, amqp_num=1)


class Launcher:
    """``flowmq cluster`` as a subprocess; its output lines arrive on a queue."""

    def __init__(self, data_dir: Path, *args: str):
        cmd = [
            sys.executable,
            "-m",
            "flowmq_broker.cli",
            "cluster",
            "--data-dir",
            str(data_dir),
            *args,
        ]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
        self.output: list[str] = []
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line)
            self.lines.put(line)
        self.lines.put(None)

    def next_line(self, deadline: float) -> str:
        try:
            line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError("launcher output stopped:\n" + "".join(self.output)) from None
        assert line is not None, "launcher exited:\n" + "".join(self.output)
        return line

    def table(self, timeout: float = 60) -> dict[str, dict[str, str]]:
        """The table printed once every process is ready: node id -> column -> value."""
        deadline = time.monotonic() + timeout
        while " processes ready " not in self.next_line(deadline):
            pass
        header = self.next_line(deadline).split()
        rows = {}
        while not (line := self.next_line(deadline)).startswith("admin token:"):
            cells = dict(zip(header, line.split(), strict=True))
            rows[cells["node"]] = cells
        return rows


@pytest.fixture
def launcher(tmp_path):
    started: list[Launcher] = []

    def start(*args: str) -> Launcher:
        started.append(Launcher(tmp_path / "data", *args))
        return started[-1]

    yield start
    for each in started:  # a failed test must not leave a cluster running
        if each.proc.poll() is None:
            each.proc.send_signal(signal.SIGINT)
            try:
                each.proc.wait(20)
            except subprocess.TimeoutExpired:
                each.proc.kill()
                each.proc.wait()


def mqtt_round_trip(port: int, timeout: float = 10) -> bytes:
    """Subscribe, publish and receive one message through the broker at ``port``."""
    connected, received = threading.Event(), queue.Queue()
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="launcher-test")

    def on_connect(client, userdata, flags, reason, properties) -> None:
        if not reason.is_failure:
            connected.set()

    client.on_connect = on_connect
    client.on_message = lambda c, userdata, message: received.put(message.payload)
    client.connect("127.0.0.1", port)
    client.loop_start()
    try:
        assert connected.wait(timeout), "no CONNACK"
        client.subscribe("launcher/test", qos=1)
        deadline = time.monotonic() + timeout
        while True:  # until the subscription is in place, a publish may find no subscriber
            client.publish("launcher/test", b"hello", qos=1).wait_for_publish(timeout)
            try:
                return received.get(timeout=0.5)
            except queue.Empty:
                assert time.monotonic() < deadline, "message not delivered"
    finally:
        client.disconnect()
        client.loop_stop()


def test_cluster_runs_each_role_where_planned_and_stops_every_process(launcher, tmp_path):
    cluster = launcher(
        "--nodes", "2", "--mqtt-num", "2", "--kafka-num", "1", "--amqp-num", "1",
        "--any-ports", "--admin-token", "launcher",
    )  # fmt: skip
    table = cluster.table()
    assert sorted(table) == ["node-0", "node-1"]
    assert table["node-0"]["roles"] == "mqtt,kafka,amqp,admin"
    assert table["node-1"]["roles"] == "mqtt,admin"
    assert table["node-1"]["kafka"] == table["node-1"]["amqp"] == "-"
    node1_ports = json.loads((tmp_path / "data" / "node-1" / "ports.json").read_text())
    assert node1_ports["node_id"] == "node-1"
    assert "kafka" not in node1_ports and "amqp" not in node1_ports
    assert node1_ports["mqtt"] == int(table["node-1"]["mqtt"])
    # One shared meta store and object directory, each process its own data dir.
    assert (tmp_path / "data" / "meta.db").exists()

    wait_for(
        lambda: all(
            metric(f"http://127.0.0.1:{row['http']}", "gossip_cluster_size") == 2
            for row in table.values()
        ),
        timeout=15,
    )
    assert mqtt_round_trip(int(table["node-1"]["mqtt"])) == b"hello"
    # `flowmq cluster status` (the admin API, not the launcher) sees both from either node.
    env = {"FLOWMQ_URL": f"http://127.0.0.1:{table['node-1']['http']}", "FLOWMQ_TOKEN": "launcher"}
    status = flowmq("cluster", "status", "-o", "json", env=env)
    assert status.returncode == 0, status.stderr
    nodes = json.loads(status.stdout)
    assert sorted((n["node_id"], n["status"], n["self"]) for n in nodes) == [
        ("node-0", "up", False),
        ("node-1", "up", True),
    ]
    assert {tuple(n["roles"]) for n in nodes} == {
        ("mqtt", "kafka", "amqp", "admin"),
        ("mqtt", "admin"),
    }
    assert len({n["version"] for n in nodes}) == 1

    pids = [int(row["pid"]) for row in table.values()]
    assert all(Path(f"/proc/{pid}").exists() for pid in pids)
    cluster.proc.send_signal(signal.SIGINT)
    assert cluster.proc.wait(15) == 0, "".join(cluster.output)
    # The launcher waited for its children, so their pids are gone (not even zombies).
    assert not [pid for pid in pids if Path(f"/proc/{pid}").exists()]


def test_cluster_stops_when_a_process_dies(launcher):
    cluster = launcher("--nodes", "2", "--mqtt-num", "0", "--kafka-num", "0", "--amqp-num", "0",
                       "--any-ports")  # fmt: skip
    table = cluster.table()
    os.kill(int(table["node-1"]["pid"]), signal.SIGKILL)
    assert cluster.proc.wait(15) == 1
    assert not Path(f"/proc/{table['node-0']['pid']}").exists()
    assert any("node-1 exited" in line for line in cluster.output)


def test_the_cluster_is_closed_by_a_secret_the_launcher_generates(launcher):
    cluster = launcher("--nodes", "1", "--mqtt-num", "0", "--kafka-num", "0", "--amqp-num", "0",
                       "--any-ports")  # fmt: skip
    row = cluster.table()["node-0"]
    proc = Path(f"/proc/{row['pid']}")
    given = [
        var.split(b"=", 1)[1]
        for var in (proc / "environ").read_bytes().split(b"\0")
        if var.startswith(b"FLOWMQ_CLUSTER_SECRET=")
    ]
    assert len(given) == 1 and len(given[0]) >= 32  # by environment, random and long
    assert b"secret" not in (proc / "cmdline").read_bytes()  # never on the command line
    http = f"http://127.0.0.1:{row['http']}"
    failures = 'plane="gossip"'
    assert metric(http, "cluster_auth_failures_count", failures) == 0
    # What a broker without the secret sends (a plain push-pull to join) is refused.
    join = {"t": "pp", "f": "x", "r": 1, "s": [{"k": "a", "n": "x", "i": 1, "h": "127.0.0.1",
                                                "p": 9, "m": {}}]}  # fmt: skip
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as raw:
        raw.sendto(json.dumps(join).encode(), ("127.0.0.1", int(row["gossip"])))
    wait_for(lambda: metric(http, "cluster_auth_failures_count", failures) == 1, timeout=10)
    assert metric(http, "gossip_cluster_size") == 1
