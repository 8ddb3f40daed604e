"""A QoS 1 message PUBACKed to a publisher on one node reaches a persistent subscriber on
another node although that node is SIGKILLed and restarted (issue #11: one message lost per
round with a window of 1, the whole window of 20 with 20), or paused (SIGSTOP) past the
failure detector and resumed: the node is declared dead, a survivor adopts the session, and
the resumed node must neither resume it as its own nor make the adopter drop it (a publisher
window PUBACKed just after the SIGCONT was lost: the session was on no node, so the messages
matched no route), or killed and restarting while the others declare it dead (they must keep
its routes, refusing, until they see its new process)."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt import publish
from paho.mqtt.enums import CallbackAPIVersion

from benchmarks import chaos
from flowmq_meta import keys
from flowmq_meta.sqlite import SqliteMetaStore
from tests.fixtures.cluster import cluster_size
from tests.fixtures.waiting import wait_until

pytestmark = pytest.mark.timeout(240)

Fault = Callable[[chaos.ChaosCluster, str, chaos.Flow], None]
PAUSE_S = 12.0


def _kill_and_restart(cluster: chaos.ChaosCluster, name: str, _: chaos.Flow) -> None:
    cluster.kill(name)
    time.sleep(1.0)
    cluster.start(name)


def _pause(cluster: chaos.ChaosCluster, name: str, _: chaos.Flow) -> None:
    cluster.signal(name, signal.SIGSTOP)
    # Past the failure detector (about 5 s) and past the subscriber's keep alive (5 s, and as
    # long again for the PINGRESP): it gives up and reconnects, and its CONNECT waits in the
    # paused node's socket, to be read at the SIGCONT before the node learns it was fenced.
    time.sleep(PAUSE_S)
    cluster.signal(name, signal.SIGCONT)


def _missing_after_faults(
    tmp_path,
    level: int,
    nodes: tuple[str, ...],
    publishing: str,
    receiving: str,
    fault: Fault,
    rounds: int = 3,
) -> tuple[list[str], int]:
    """Publish from ``publishing`` into a persistent subscriber on ``receiving`` (window 20)
    through ``rounds`` of ``fault`` on the receiving node; the acknowledged messages that
    never arrived, and how many were acknowledged."""
    cluster = chaos.ChaosCluster(tmp_path, chaos.FileObjects(tmp_path))
    stop_publishing, stop_receiving = threading.Event(), threading.Event()
    flow = chaos.Flow()
    try:
        for name in nodes:
            cluster.start(name)
        processes = [cluster.nodes[name].process for name in nodes]
        wait_until(lambda: all(cluster_size(p) == len(nodes) for p in processes), 30, what="gossip")
        pub_node, sub_node = cluster.nodes[publishing], cluster.nodes[receiving]
        subscriber = chaos.MqttSubscriberLoad(sub_node, flow, stop_receiving, "focus/#", level)
        publisher = chaos.MqttPublisherLoad(pub_node, flow, stop_publishing, "focus/x", level)
        publisher.window = 20
        subscriber.start()
        wait_until(lambda: subscriber.subscribed, 15, what="subscribed")
        publisher.start()
        for _ in range(rounds):
            acked = len(flow.acked)
            wait_until(lambda n=acked: len(flow.acked) > n + 40, 60, what="acks")
            fault(cluster, receiving, flow)
        acked = len(flow.acked)
        wait_until(lambda: len(flow.acked) > acked + 40, 60, what="acks after the faults")
        stop_publishing.set()
        publisher.join(60)
        deadline = time.monotonic() + 30
        while flow.acked - set(flow.received) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        stop_publishing.set()
        stop_receiving.set()
        cluster.stop()
        output = cluster.output()
        (tmp_path / "brokers.log").write_text(output)
        # Shown with a failure (tmp_path is gone by the time a flaky one is looked at).
        print(_timeline(output, flow))
    return sorted(flow.acked - set(flow.received)), len(flow.acked)


# What the nodes said about each other and about sessions, and everything they warned of.
_TIMELINE = re.compile(
    r"WARNING|ERROR|Traceback|Fatal Python error|ready:|shutting down|had exited|dead|alive|"
    r"adopt|restarted|gone|taken over|moved"
)


def _timeline(output: str, flow: chaos.Flow) -> str:
    """What a failure of these tests needs to be understood: the publisher's refusals and
    acknowledgements, and the brokers' lines on membership, adoption and warnings (each
    process's lines in order, one process after another)."""
    lines = [line for line in output.splitlines() if _TIMELINE.search(line)]
    return (
        f"acknowledged {len(flow.acked)}, received {len(flow.received)}, resent "
        f"{len(flow.resent)}, refusals {dict(flow.errors)}\n" + "\n".join(lines[-200:])
    )


@pytest.mark.parametrize("level", [4, 5], ids=["3.1.1", "5"])
def test_acknowledged_messages_reach_a_subscriber_whose_node_restarts(tmp_path, level) -> None:
    missing, acked = _missing_after_faults(
        tmp_path, level, ("n1", "n2"), "n1", "n2", _kill_and_restart
    )
    assert not missing, f"{len(missing)} of {acked} acknowledged never arrived: {missing[:20]}"


@pytest.mark.parametrize("level", [4, 5], ids=["3.1.1", "5"])
def test_acknowledged_messages_reach_a_subscriber_whose_node_was_paused(tmp_path, level) -> None:
    # Three nodes, as in the chaos run that lost a window: the subscriber's node paused, the
    # publisher's node forwarding to the survivor that adopts the session.
    missing, acked = _missing_after_faults(tmp_path, level, ("n1", "n2", "n3"), "n3", "n1", _pause)
    assert not missing, f"{len(missing)} of {acked} acknowledged never arrived: {missing[:20]}"


async def _restart_writes(meta_path: Path, node: str, *, records: bool, token: bool) -> None:
    """What a restarting broker writes first: its session records marked as its new process's
    (``MqttServer.restore_sessions``), a new start token for its routes, which stay while it
    restores those sessions (``ClusterRouting.start``)."""
    store = SqliteMetaStore(str(meta_path))
    begin, end = keys.SESSIONS.range()

    def write(tr) -> None:  # noqa: ANN001
        if records:
            for key, raw in tr.get_range(begin, end):
                record = json.loads(raw)
                if record.get("node") == node:
                    tr.set(key, json.dumps({**record, "process": "restarting"}).encode())
        if token:
            version = json.dumps({"token": "restarting", "seq": 0}).encode()
            tr.set(keys.ROUTE_VERSIONS.pack(node), version)

    try:
        await store.transact(write)
    finally:
        await store.close()


def _restart_seen_before_gossip(cluster: chaos.ChaosCluster, name: str, flow: chaos.Flow) -> None:
    """``name`` is killed, and its restart marks its session records and writes its new start
    token just as the others declare it dead, before gossip sees the new process: made here
    by the test itself, to hold the order that was a race in the chaos run; then it really
    restarts."""
    # n1, the lowest node, which adopts the sessions of a dead node, forwards to it once: it
    # knows its process, and so adopts no session a new process of it marked.
    publish.single("focus/from-n1", b"n1", qos=1, port=cluster.nodes["n1"].port("mqtt"))
    cluster.kill(name)
    asyncio.run(_restart_writes(cluster.meta_path, name, records=True, token=False))
    publishing = cluster.nodes["n2"].process
    wait_until(lambda: cluster_size(publishing) == 2, 30, what=f"{name} declared dead")
    asyncio.run(_restart_writes(cluster.meta_path, name, records=False, token=True))

    def answered() -> int:  # acknowledged, or refused (and sent again)
        return len(flow.acked) + sum(flow.errors.values())

    # Past the anti-entropy (every second) that forgot its routes.
    before = answered()
    wait_until(lambda: answered() > before + 100, 60, what="publishes answered")
    cluster.start(name)


def test_messages_published_while_a_dead_node_restarts_are_refused_not_lost(tmp_path) -> None:
    """The publisher's node took the restarting node's new start token for routes cleared by
    an adopter and forgot them, although no one adopted the session (its record names the new
    process): what was published meanwhile matched no route and was PUBACKed without being
    stored (the chaos run at 761f369 lost two publisher windows so)."""
    missing, acked = _missing_after_faults(
        tmp_path, 5, chaos.NODES, "n2", "n3", _restart_seen_before_gossip, rounds=1
    )
    assert not missing, f"{len(missing)} of {acked} acknowledged never arrived: {missing[:20]}"


def _publish_at_once(port: int, topic: str, count: int) -> list[str]:
    """Publish ``count`` QoS 1 v5 messages the moment the connection is up; the payloads
    PUBACKed as stored (a refusal, 0x80, is a failure reason code)."""
    acked: list[str] = []
    done = threading.Event()
    payloads: dict[int, str] = {}
    client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)

    def on_publish(client, userdata, mid, reason_code, properties) -> None:  # noqa: ANN001
        if not reason_code.is_failure:
            acked.append(payloads[mid])
        if len(payloads) == count and mid == max(payloads):
            done.set()

    client.on_publish = on_publish
    client.connect("127.0.0.1", port)
    client.loop_start()
    try:
        for i in range(count):
            payload = f"{topic}/at-once-{i}"
            payloads[client.publish(topic, payload, qos=1).mid] = payload
        done.wait(30)
    finally:
        client.loop_stop()
        client.disconnect()
    return acked


def test_a_node_just_restarted_acknowledges_nothing_for_routes_it_has_not_read(tmp_path) -> None:
    """A broker that restarts takes client connections before gossip there has seen its
    peers, and their routes were read only for peers seen alive: a QoS 1 message for a
    persistent session on another node matched no route and was PUBACKed without being
    stored for it (the chaos run at d9f9928 lost 22 and 10 so, within 1.5 s of a restart of
    the publisher's node).  Until it has seen them, it refuses instead."""
    cluster = chaos.ChaosCluster(tmp_path, chaos.FileObjects(tmp_path))
    flow, stop = chaos.Flow(), threading.Event()
    try:
        for name in ("n1", "n2"):
            cluster.start(name)
        processes = [cluster.nodes[name].process for name in ("n1", "n2")]
        wait_until(lambda: all(cluster_size(p) == 2 for p in processes), 30, what="gossip")
        subscriber = chaos.MqttSubscriberLoad(cluster.nodes["n1"], flow, stop, "focus/#", 5)
        subscriber.start()
        wait_until(lambda: subscriber.subscribed, 15, what="subscribed")
        cluster.kill("n2")
        # Restarted with no seed it can reach, the node learns n1 only when n1's failure
        # detector next probes it: the moments a busy machine gave the chaos run, made wide.
        n1_ports = cluster.nodes["n1"].ports
        gossip_port = n1_ports["gossip"]
        n1_ports["gossip"] = chaos._free_port()
        try:
            cluster.start("n2")
        finally:
            n1_ports["gossip"] = gossip_port
        acked = _publish_at_once(cluster.nodes["n2"].port("mqtt"), "focus/x", 20)
        deadline = time.monotonic() + 15
        while set(acked) - set(flow.received) and time.monotonic() < deadline:
            time.sleep(0.1)
        missing = sorted(set(acked) - set(flow.received))
        assert not missing, f"{len(missing)} of {len(acked)} acknowledged never arrived"
    finally:
        stop.set()
        cluster.stop()
        (tmp_path / "brokers.log").write_text(cluster.output())
