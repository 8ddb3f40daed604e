"""Host mode (DESIGN.md §14, docs/operations.md "Host mode"): ``flowmq serve --processes 2`` as
a real subprocess on free ports.  Its two broker processes share every client port (the
supervisor hands MQTT, Kafka and AMQP connections to them in turn, the kernel spreads the
others); each also answers on an HTTP port of its own (``ports.json`` ``processes``), which
is how the tests see where a connection landed."""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import time
import uuid
from pathlib import Path

import paho.mqtt.client as mqtt
import pika
import pytest
from kafka import KafkaConsumer, KafkaProducer

from tests.fixtures.broker_process import (
    PORT_OPTIONS,
    BrokerProcess,
    run_broker_expecting_failure,
    start_broker,
)
from tests.fixtures.cli import flowmq
from tests.fixtures.cluster import http
from tests.fixtures.waiting import wait_until
from tests.integration.mqtt.conftest import Paho

HOST_READY = "processes ready: "
TIMEOUT = 15.0


def start_host(data_dir: Path, processes: int = 2) -> BrokerProcess:
    return start_broker(data_dir, "--processes", str(processes), timeout=60, ready_mark=HOST_READY)


@pytest.fixture(scope="module")
def host(tmp_path_factory) -> BrokerProcess:
    broker = start_host(tmp_path_factory.mktemp("host") / "data")
    yield broker
    assert broker.stop() == 0


def own_http(broker: BrokerProcess) -> dict[str, str]:
    """node id -> the URL of that process's own HTTP port."""
    return {p["node_id"]: f"http://127.0.0.1:{p['http']}" for p in broker.ports["processes"]}


def node_of(broker: BrokerProcess, client_id: str) -> str | None:
    """The process an MQTT client id is connected to, from each process's clients list."""
    for node, url in own_http(broker).items():
        if any(c["client_id"] == client_id for c in api(broker, url, "/clients")):
            return node
    return None


def api(broker: BrokerProcess, url: str, path: str):
    """The ``data`` of an admin API answer."""
    return http("GET", f"{url}/api/v1{path}", token=broker.token)["data"]


def clients_on(broker: BrokerProcess, node: str, protocol: str) -> int:
    clients = api(broker, own_http(broker)[node], f"/clients?protocol={protocol}")
    return len(clients)


def connect_on(broker: BrokerProcess, node: str, prefix: str) -> Paho:
    """An MQTT client on the shared port that the kernel placed on ``node`` (clients landing
    elsewhere are disconnected and another is tried)."""
    for attempt in range(64):
        client_id = f"{prefix}-{attempt}-{uuid.uuid4().hex[:6]}"
        client = Paho(broker.ports["mqtt"], client_id)
        client.connect()
        landed = wait_until(lambda cid=client_id: node_of(broker, cid), TIMEOUT, what="client")
        if landed == node:
            return client
        client.client.disconnect()
        client.client.loop_stop()
    raise AssertionError(f"no connection landed on {node} in 64 tries")


def test_processes_form_one_cluster_behind_the_shared_ports(host):
    nodes = sorted(own_http(host))
    assert len(nodes) == 2 and all(n.endswith(("-p0", "-p1")) for n in nodes)
    for url in own_http(host).values():  # each process sees both, alive
        up = {n["node_id"] for n in api(host, url, "/cluster/nodes") if n["status"] == "up"}
        assert set(nodes) <= up
    for process in host.ports["processes"]:  # every client port is the shared one
        for name in ("mqtt", "mqtt_ws", "amqp"):
            assert process[name] == host.ports[name]
    # One token for all, generated once by the supervisor: the shared HTTP port takes it.
    assert api(host, host.http, "/health")["node_id"] in nodes


def test_mqtt_connections_are_spread_evenly_over_the_processes(host):
    """The supervisor hands connections to the processes in turn: 16 in a row are 8 + 8,
    where the kernel's SO_REUSEPORT hash made them that even 1 time in 5."""
    clients = []
    try:
        for i in range(16):
            client = Paho(host.ports["mqtt"], f"spread-{i}-{uuid.uuid4().hex[:6]}")
            client.connect()
            clients.append(client)
        counts = {
            node: sum(
                client["client_id"].startswith("spread-")
                for client in api(host, url, "/clients?protocol=mqtt")
            )
            for node, url in own_http(host).items()
        }
        assert sorted(counts.values()) == [8, 8], counts
    finally:
        for client in clients:
            client.client.disconnect()
            client.client.loop_stop()


@pytest.mark.parametrize("qos", [0, 1])
def test_subscriber_on_one_process_gets_messages_published_on_the_other(host, qos):
    p0, p1 = sorted(own_http(host))
    subscriber = connect_on(host, p0, "sub")
    publisher = connect_on(host, p1, "pub")
    try:
        topic = f"host/{uuid.uuid4().hex}/t"
        assert subscriber.subscribe(topic, qos) == [qos]
        for i in range(20):
            publisher.publish(topic, f"m{i}".encode(), qos=qos)
        got = subscriber.expect(20)
        assert [m.payload for m in got] == [f"m{i}".encode() for i in range(20)]
        assert {m.qos for m in got} == {qos}
    finally:
        for client in (subscriber, publisher):
            client.client.disconnect()
            client.client.loop_stop()


def test_the_flowmq_command_finds_the_shared_ports_in_data(host):
    """The README's tour, against ``./data`` of a host-mode broker."""
    cwd = host.data_dir.parent
    name = f"tour-{uuid.uuid4().hex[:8]}"
    created = flowmq("stream", "create", name, "--filter", f"{name}/#", cwd=cwd)
    assert created.returncode == 0, created.stderr
    # Made through one process, the stream reaches the other's routes within a gossip round
    # (the destination list reads the meta store at once; routing follows the catalog).
    for url in own_http(host).values():
        wait_until(
            lambda u=url: any(
                d["name"] == name for d in api(host, u, f"/routes?topic={name}/eu")["destinations"]
            ),
            TIMEOUT,
            what=f"stream {name} routed at {url}",
        )
    produced = flowmq("produce", f"{name}/eu", stdin="order 1\n", cwd=cwd)
    assert produced.returncode == 0, produced.stderr
    consumed = flowmq("consume", name, "--from-beginning", "--num", "1", cwd=cwd)
    assert consumed.returncode == 0, consumed.stderr
    assert consumed.stdout.strip() == "order 1"


def test_kafka_produce_and_consume_through_the_shared_port(host):
    bootstrap = f"127.0.0.1:{host.ports['kafka']}"
    topic = f"host-{uuid.uuid4().hex[:8]}"
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    for i in range(10):
        producer.send(topic, f"k{i}".encode(), partition=0)
    producer.flush(TIMEOUT)
    producer.close()
    # Several consumers in one group: their coordinator is one of the two processes,
    # whichever the shared port sent their bootstrap connection to.
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=f"g-{topic}",
        auto_offset_reset="earliest",
        consumer_timeout_ms=int(TIMEOUT * 1000),
    )
    got = []
    for message in consumer:
        got.append(message.value)
        if len(got) == 10:
            break
    consumer.commit()
    consumer.close()
    assert got == [f"k{i}".encode() for i in range(10)]


def test_amqp_publish_and_consume_through_the_shared_port(host):
    params = pika.ConnectionParameters("127.0.0.1", host.ports["amqp"])
    queue_name = f"host-{uuid.uuid4().hex[:8]}"
    publisher = pika.BlockingConnection(params)
    channel = publisher.channel()
    channel.queue_declare(queue_name, durable=True)
    channel.confirm_delivery()
    for i in range(10):
        channel.basic_publish("", queue_name, f"a{i}".encode())
    publisher.close()
    consumer = pika.BlockingConnection(params)
    got = []
    deadline = time.monotonic() + TIMEOUT
    channel = consumer.channel()
    # Declared again, as consumers do: this connection may be on the other process, which
    # learns of a new queue within a gossip round (docs/operations.md "Cluster").
    channel.queue_declare(queue_name, durable=True)
    for _method, _props, body in channel.consume(queue_name, inactivity_timeout=1):
        if body is not None:
            got.append(body)
            channel.basic_ack(_method.delivery_tag)
        if len(got) == 10 or time.monotonic() > deadline:
            break
    channel.cancel()
    consumer.close()
    assert sorted(got) == sorted(f"a{i}".encode() for i in range(10))


def _children(pid: int) -> dict[str, int]:
    """node id -> pid of the processes ``pid`` started (from /proc)."""
    found = {}
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    for child in map(int, text.split()):
        try:
            argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        except FileNotFoundError:
            continue  # it exited since the listing (a restart under way)
        if b"--node-id" in argv:
            found[argv[argv.index(b"--node-id") + 1].decode()] = child
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone as far as serving goes.
    return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc (Linux)")
def test_a_killed_process_is_restarted_and_sigterm_stops_all(tmp_path):
    broker = start_host(tmp_path / "data")
    try:
        children = wait_until(lambda: len(_children(broker.proc.pid)) == 2 and
                              _children(broker.proc.pid), TIMEOUT, what="two children")  # fmt: skip
        victim_node = sorted(children)[1]
        client = connect_on(broker, victim_node, "victim")
        os.kill(children[victim_node], signal.SIGKILL)
        client.wait_disconnect()
        client.client.loop_stop()

        def restarted() -> bool:
            now = _children(broker.proc.pid)
            return victim_node in now and now[victim_node] != children[victim_node]

        wait_until(restarted, TIMEOUT, what="the killed process restarted")
        ports_file = broker.data_dir / f"process-{victim_node[-1]}" / "ports.json"
        wait_until(ports_file.exists, 60, what="the restarted process ready")
        # The client reconnects on the shared port, wherever it lands, and works.
        again = Paho(broker.ports["mqtt"], client.client._client_id.decode())
        again.connect()
        topic = f"host/{uuid.uuid4().hex}"
        assert again.subscribe(topic, 1) == [1]
        again.publish(topic, b"back", qos=1)
        assert again.get().payload == b"back"
        again.client.disconnect()
        again.client.loop_stop()
        # ...and the restarted process is back in the cluster and serves clients again:
        # a subscriber on it gets what is published on the other process.
        url = f"http://127.0.0.1:{json.loads(ports_file.read_text())['http']}"
        assert api(broker, url, "/health")["node_id"] == victim_node
        broker.ports["processes"][int(victim_node[-1])]["http"] = url.rsplit(":", 1)[1]

        def both_up() -> bool:
            return all(
                {n["node_id"] for n in api(broker, u, "/cluster/nodes") if n["status"] == "up"}
                >= set(children)
                for u in own_http(broker).values()
            )

        wait_until(both_up, 30, what="both processes up in each one's node table")
        subscriber = connect_on(broker, victim_node, "after")
        publisher = connect_on(broker, sorted(children)[0], "other")
        assert subscriber.subscribe(topic, 1) == [1]
        # The first forwards to a restarted process may be refused (0x80) while the link to
        # its new incarnation comes up: the publisher resends, as an MQTT client does.
        deadline = time.monotonic() + 30
        while True:
            publisher.client.publish(topic, b"across", qos=1)
            try:
                received = subscriber.messages.get(timeout=5)
                break
            except queue.Empty:
                assert time.monotonic() < deadline, (
                    "nothing published reached the restarted process"
                )
        assert received.payload == b"across"
        for c in (subscriber, publisher):
            c.client.disconnect()
            c.client.loop_stop()

        pids = list(_children(broker.proc.pid).values())
        broker.proc.send_signal(signal.SIGTERM)
        assert broker.proc.wait(30) == 0
        assert not any(_alive(pid) for pid in pids)
    finally:
        broker.stop()


def test_a_taken_shared_port_fails_the_start(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        free = [arg for opt in PORT_OPTIONS if opt != "--mqtt-port" for arg in (opt, "0")]
        code, output = run_broker_expecting_failure(
            tmp_path, "--processes", "2", "--mqtt-port", str(port), *free
        )
    assert code == 1
    assert f"flowmq: cannot listen on mqtt port {port}" in output
    assert not (tmp_path / "process-0").exists()  # nothing was started


def test_host_mode_refuses_a_meta_store_of_its_own_per_process(tmp_path):
    code, output = run_broker_expecting_failure(tmp_path, "--processes", "2", "--meta", "memory://")
    assert code == 2
    assert "needs a meta store its processes share" in output


def test_tls_connections_are_handed_over_and_their_handshake_done_by_the_process(tmp_path):
    from tests.fixtures.tls import make_pki
    from tests.integration.tls.conftest import mqtt_tls_client

    pki = make_pki(tmp_path / "pki")
    broker = start_broker(
        tmp_path / "data",
        "--processes", "2",
        "--tls-cert", str(pki.server.cert),
        "--tls-key", str(pki.server.key),
        timeout=60,
        ready_mark=HOST_READY,
    )  # fmt: skip
    clients = []
    try:
        # A client that never completes its handshake takes a turn and fails alone.
        with socket.create_connection(("127.0.0.1", broker.ports["mqtt_tls"])) as raw:
            raw.sendall(b"not a TLS ClientHello")
            raw.settimeout(TIMEOUT)
            raw.recv(1024)  # answered (an alert) or closed, or socket.timeout fails the test
        connected: queue.Queue[str] = queue.Queue()
        for i in range(4):
            client = mqtt_tls_client(pki, mqtt.MQTTv311, client_id=f"tls-spread-{i}")
            client.on_connect = lambda c, u, f, rc, p=None, i=i: connected.put(f"{i}:{rc}")
            client.connect("localhost", broker.ports["mqtt_tls"])
            client.loop_start()
            clients.append(client)
        assert sorted(connected.get(timeout=TIMEOUT) for _ in range(4)) == [
            f"{i}:Success" for i in range(4)
        ]
        counts = {
            node: sum(
                c["client_id"].startswith("tls-spread-") for c in api(broker, url, "/clients")
            )
            for node, url in own_http(broker).items()
        }
        assert sorted(counts.values()) == [2, 2], counts
    finally:
        for client in clients:
            client.disconnect()
            client.loop_stop()
        assert broker.stop() == 0
