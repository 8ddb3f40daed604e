"""The closed cluster plane between broker processes (DESIGN.md §12, docs/security.md).

Gossip datagrams and inter-broker links are authenticated by the cluster secret: brokers with
another secret do not join; a forged datagram or a link frame sent without the handshake is
dropped, counted in ``cluster_auth_failures_count{plane}`` and has no effect; a broker whose
cluster plane is not on loopback does not start without a secret.  Each refusal is checked
against a positive control that the same thing, done with the secret, works.
"""

from __future__ import annotations

import json
import queue
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from flowmq_broker.cluster import encode_message
from flowmq_cluster import ClusterSecret
from flowmq_cluster.auth import GossipSeal
from flowmq_core.message import Message
from tests.fixtures.broker_process import BrokerProcess, run_broker_expecting_failure, start_broker
from tests.fixtures.cluster import cluster_size, http, metric, wait_for, write_secret

pytestmark = pytest.mark.timeout(90)

TOKEN = "closed-plane"
STEP_S = 10.0
OTHER_SECRET = "another-cluster-altogether-0123456789"
FREE_PORTS = ("--http-port", "0", "--mqtt-port", "0", "--kafka-port", "0", "--amqp-port", "0",
              "--gossip-port", "0")  # fmt: skip


def auth_failures(broker: BrokerProcess, plane: str) -> float:
    return metric(broker.http, "cluster_auth_failures_count", f'plane="{plane}"')


def node_ids(broker: BrokerProcess) -> set[str]:
    nodes = http("GET", f"{broker.http}/api/v1/cluster/nodes", token=TOKEN)["data"]
    return {node["node_id"] for node in nodes}


def announce(node_id: str, port: int) -> bytes:
    """A well-formed gossip push-pull saying ``node_id`` is alive at 127.0.0.1:``port``."""
    state = {"k": "a", "n": node_id, "i": 1, "h": "127.0.0.1", "p": port, "m": {}}
    return json.dumps({"t": "pp", "f": node_id, "r": 0, "s": [state]}).encode()


class Subscriber:
    """An MQTT client subscribed to one topic; what it receives lands on a queue."""

    def __init__(self, broker: BrokerProcess, topic: str) -> None:
        self.messages: queue.Queue[bytes] = queue.Queue()
        subscribed = threading.Event()
        self.paho = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"plane-{topic}")
        self.paho.on_message = lambda _c, _u, message: self.messages.put(message.payload)
        self.paho.on_subscribe = lambda *_: subscribed.set()
        self.paho.connect("127.0.0.1", broker.ports["mqtt"])
        self.paho.loop_start()
        self.paho.subscribe(topic, qos=1)
        assert subscribed.wait(STEP_S), "no SUBACK"

    def close(self) -> None:
        self.paho.disconnect()
        self.paho.loop_stop()


@pytest.fixture(scope="module")
def solo(tmp_path_factory) -> Iterator[tuple[BrokerProcess, str]]:
    """One broker whose cluster plane is closed by a secret (from a file)."""
    root = tmp_path_factory.mktemp("closed-plane")
    secret = write_secret(root / "cluster_secret")
    broker = start_broker(
        root / "solo", "--node-id", "solo", "--admin-token", TOKEN, "--roles", "mqtt,admin",
        "--cluster-secret-file", str(root / "cluster_secret"),
    )  # fmt: skip
    try:
        yield broker, secret
    finally:
        broker.stop()


def read_until_closed(sock: socket.socket) -> list[Any]:
    """The frames the broker sends until it closes the connection (fails if it does not)."""
    unpacker = msgpack.Unpacker(raw=False)
    while True:
        try:
            data = sock.recv(65536)
        except ConnectionResetError:
            break
        if not data:
            break
        unpacker.feed(data)
    return list(unpacker)


def test_a_link_frame_sent_without_the_handshake_is_refused_and_not_delivered(solo):
    broker, _ = solo
    subscriber = Subscriber(broker, "plane/news")
    try:
        before = auth_failures(broker, "link")
        forged = ["fwd", "default", encode_message(Message("plane/news", b"forged")), True, []]
        attempts = (
            [forged],  # a frame straight away
            [["hello", "intruder"], forged],  # the hello links took before they had a secret
        )
        for attempt in attempts:
            with socket.create_connection(("127.0.0.1", broker.ports["cluster"]), STEP_S) as raw:
                raw.sendall(b"".join(msgpack.packb(f, use_bin_type=True) for f in attempt))
                frames = read_until_closed(raw)
            assert [frame[0] for frame in frames] == ["hello"]  # its challenge, then it hung up
        wait_for(
            lambda: auth_failures(broker, "link") == before + 2, STEP_S, "the refusals counted"
        )
        # Positive control: a legitimate publish reaches the same subscriber (and is the only
        # thing it got: the forged frame would have been delivered before it).
        subscriber.paho.publish("plane/news", b"legit", qos=1).wait_for_publish(STEP_S)
        assert subscriber.messages.get(timeout=STEP_S) == b"legit"
        assert subscriber.messages.empty()
    finally:
        subscriber.close()


def test_a_forged_gossip_datagram_is_dropped_counted_and_changes_nothing(solo):
    broker, secret = solo
    gossip = ("127.0.0.1", broker.ports["gossip"])
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as raw:
        raw.bind(("127.0.0.1", 0))
        body = announce("intruder", raw.getsockname()[1])
        before = auth_failures(broker, "gossip")
        raw.sendto(GossipSeal(ClusterSecret(OTHER_SECRET)).seal(body), gossip)  # wrong MAC
        wait_for(
            lambda: auth_failures(broker, "gossip") == before + 1, STEP_S, "the datagram counted"
        )
        assert "intruder" not in node_ids(broker)
        assert cluster_size(broker) == 1
        # Positive control: the very same datagram sealed with the secret is taken.
        raw.sendto(GossipSeal(ClusterSecret(secret)).seal(body), gossip)
        wait_for(lambda: "intruder" in node_ids(broker), STEP_S, "the sealed datagram taken")
        assert auth_failures(broker, "gossip") == before + 1


def test_brokers_with_another_secret_do_not_join_those_with_the_same_do(tmp_path: Path):
    """a and c share a secret (a from a file, c by flag); b has another (by environment)."""
    secret = write_secret(tmp_path / "cluster_secret")
    common = ("--admin-token", TOKEN, "--roles", "admin")
    a = start_broker(tmp_path / "a", "--node-id", "a", *common,
                     "--cluster-secret-file", str(tmp_path / "cluster_secret"))  # fmt: skip
    started = [a]
    try:
        seed = ("--seeds", f"127.0.0.1:{a.ports['gossip']}")
        env = {"FLOWMQ_CLUSTER_SECRET": OTHER_SECRET}
        started.append(start_broker(tmp_path / "b", "--node-id", "b", *common, *seed, env=env))
        b = started[-1]
        # "=": a URL-safe secret may begin with "-", which argparse would take for an option.
        started.append(
            start_broker(
                tmp_path / "c", "--node-id", "c", *common, *seed, f"--cluster-secret={secret}"
            )  # fmt: skip
        )
        c = started[-1]
        wait_for(lambda: cluster_size(a) == 2 and cluster_size(c) == 2, 15, "a and c join")
        # b asks its seed to let it in every probe interval; a drops every attempt
        wait_for(lambda: auth_failures(a, "gossip") >= 3, 15, "a refuses b three times")
        assert cluster_size(b) == 1 and cluster_size(a) == 2 and cluster_size(c) == 2
        assert "b" not in node_ids(a) and "b" not in node_ids(c)
    finally:
        for broker in reversed(started):
            broker.stop()


def test_a_broker_on_a_non_loopback_cluster_address_needs_a_secret(tmp_path: Path):
    data_dir = tmp_path / "public"
    code, output = run_broker_expecting_failure(data_dir, *FREE_PORTS, "--cluster-bind", "0.0.0.0")
    assert code != 0
    lines = output.strip().splitlines()
    assert len(lines) == 1, output
    assert lines[0].startswith("flowmq: ") and "cluster_secret" in lines[0], lines[0]
    assert not data_dir.exists()  # refused before anything was bound or written
    # Positive control: with a secret the same broker starts, its plane authenticated.
    broker = start_broker(
        data_dir, "--cluster-bind", "0.0.0.0", env={"FLOWMQ_CLUSTER_SECRET": OTHER_SECRET}
    )
    try:
        assert any("authenticated by the cluster secret" in line for line in broker.output)
    finally:
        broker.stop()
