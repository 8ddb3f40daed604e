"""MQTT across a local FlowMQ cluster: fan-in throughput (1 node, 2 nodes, Mosquitto) and how
long a new route or destination takes to reach every node of a 3-node cluster.

    python benchmarks/cluster_bench.py [--duration 5] [--rounds 3] [--fanin 4]
        [--routes 200] [--streams 200] [--skip-fanin] [--skip-routes] [--json out.json]

Part 1, fan-in (``--fanin`` QoS 0 publishers, topics ``…/p0…``, → subscribers on ``…/+``; the
load generator, method and Mosquitto of ``mqtt_bench.py``). Scenarios, run in turn in every
round so machine noise hits all alike:

    mosquitto   Mosquitto, all clients on it
    1node       one FlowMQ node (standalone), all clients on it
    2n-local    2-node cluster, all clients on node 1 (nothing forwarded: cost of the cluster)
    2n-split    2-node cluster, publishers half on each node, 1 subscriber on node 1
                (the publishers of node 2 are forwarded: half of the messages)
    2n-both     2-node cluster, publishers half on each node, 1 subscriber on each node
                (``…/+`` and ``…/#``, each gets every message: deliveries/s)

Part 2, propagation in a 3-node cluster (every node all roles; one shared SQLite meta store):

    route       a fresh MQTT client on node i (rotating) subscribes to a fresh filter; time from
                SUBSCRIBE sent to SUBACK (by design after every peer applied the route) and
                to the first answer of each other node's route test (``GET /api/v1/routes``)
                that lists node i in ``subscriber_nodes``; every route test sent after the
                SUBACK must list it (checked, counted as violations)
    stream      ``POST /api/v1/streams`` on node i; time to the 201 and until both other
                nodes' route test lists the stream in ``destinations``; then DELETE, and the
                time until both other nodes no longer list it

The route tests are polled over keep-alive HTTP connections, one thread per other node, every
``--poll-interval`` seconds from the moment the SUBSCRIBE / POST is sent. Each stream
create/delete comes after a random pause (``--stream-jitter``): metadata changes travel on the
gossip rounds (every 200 ms), and back-to-back requests would fall into step with them.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import math
import multiprocessing as mp
import os
import random
import shutil
import signal
import socket
import statistics
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import mqtt_bench as mb  # noqa: E402
import mqtt_loadgen as lg  # noqa: E402

TOKEN = "cluster-bench"


# --- FlowMQ processes ------------------------------------------------------------------------


class FlowMQCluster(mb.FlowMQ):
    """``nodes`` ``flowmq serve`` processes, each its own data dir and node id, one meta store and
    object store; nodes 2… join by gossip through node 1. ``nodes=1`` is a standalone broker."""

    def __init__(self, workdir: Path, nodes: int, name: str) -> None:
        mb.Broker.__init__(self)
        self.key = name
        self.label = f"FlowMQ {name}"
        self.http: list[int] = []
        self.node_ids: list[str] = []
        root = workdir / name
        root.mkdir()
        gossip = None
        for i in range(nodes):
            node = f"{name}-n{i + 1}"
            data = root / f"n{i + 1}"
            data.mkdir()
            log = workdir / f"{node}.log"
            self.logs.append(log)
            cmd = mb.serve_command(
                data,
                *("--node-id", node, "--meta", f"sqlite:///{root / 'meta.db'}"),
                *("--objects", (root / "objects").as_uri(), "--admin-token", TOKEN),
            )
            if gossip is not None:
                cmd += ["--seeds", f"127.0.0.1:{gossip}"]
            proc = mb.spawn_logged(cmd, log)
            self.procs.append(proc)
            mb.wait_ready(proc, log, node)
            ports = json.loads((data / "ports.json").read_text())
            gossip = gossip or ports["gossip"]
            self.ports.append(ports["mqtt"])
            self.http.append(ports["http"])
            self.node_ids.append(node)
        deadline = time.monotonic() + 30
        while nodes > 1 and any(
            self.metric(i, "gossip_cluster_size") < nodes for i in range(nodes)
        ):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name}: nodes did not see each other within 30 s")
            time.sleep(0.1)
        self.version = f"FlowMQ-py ×{nodes}" if nodes > 1 else "FlowMQ-py"
        self.linked_after = self.wait_linked() if nodes > 1 else 0.0

    def wait_linked(self, timeout: float = 60.0) -> float:
        """Seconds (once every node counts every member) until, for every node, a route test on
        each other node sent right after a SUBACK there lists the subscription: a SUBACK only
        waits for the peers whose link port it has learnt by gossip."""
        t0 = time.monotonic()
        conns = [_conn(p) for p in self.http]
        pending = list(range(len(self.ports)))
        attempt = 0
        try:
            while pending:
                if time.monotonic() - t0 > timeout:
                    raise TimeoutError(f"{self.key}: routes not propagated within {timeout:g} s")
                i = pending[0]
                attempt += 1
                sock = lg.connect(self.ports[i], f"probe{i}-{attempt}")
                try:
                    topic = f"probe/{uuid.uuid4().hex}"
                    lg.subscribe(sock, topic, 0)
                    ok = all(
                        self.node_ids[i] in _route_test(conns[j], topic)["subscriber_nodes"]
                        for j in range(len(self.ports))
                        if j != i
                    )
                finally:
                    lg._close(sock)
                if ok:
                    pending.pop(0)
                else:
                    time.sleep(0.1)
        finally:
            for c in conns:
                c.close()
        return time.monotonic() - t0

    def metric(self, i: int, name: str) -> float:
        """Sum of the samples of metric ``name`` (any labels) at node ``i``; nan if unreachable."""
        try:
            url = f"http://127.0.0.1:{self.http[i]}/metrics"
            with urllib.request.urlopen(url, timeout=5) as r:
                text = r.read().decode()
        except OSError:
            return math.nan
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " "):
                total += float(line.rsplit(None, 1)[1])
        return total

    def metric_total(self, name: str) -> float:
        return sum(self.metric(i, name) for i in range(len(self.http)))


# --- part 1: fan-in with placements ------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    key: str
    title: str
    broker: str  # key of the broker object
    pub_nodes: tuple[int, ...]  # node index of each publisher
    sub_nodes: tuple[int, ...]  # node index of each subscriber (each gets every message)


def scenarios(fanin: int) -> list[Scenario]:
    split = tuple(i % 2 for i in range(fanin))
    return [
        Scenario("mosquitto", "Mosquitto", "mosquitto", (0,) * fanin, (0,)),
        Scenario("1node", "FlowMQ 1 node", "single", (0,) * fanin, (0,)),
        Scenario("2n-local", "2 nodes, all on node 1", "pair", (0,) * fanin, (0,)),
        Scenario("2n-split", "2 nodes, pubs split, sub on n1", "pair", split, (0,)),
        Scenario("2n-both", "2 nodes, pubs split, sub on each", "pair", split, (0, 1)),
    ]


def _per_node(broker: mb.Broker, name: str) -> list[float]:
    if not isinstance(broker, FlowMQCluster):
        return []
    return [broker.metric(i, name) for i in range(len(broker.http))]


def run_fanin(broker: mb.Broker, sc: Scenario, args: argparse.Namespace, tag: str, workers: list):
    """One fan-in run: ``mqtt_loadgen`` publishers and subscribers placed per ``sc``."""
    ctx = mp.get_context("spawn")
    go = ctx.Event()
    go_time = ctx.RawValue("d", 0.0)
    out = ctx.Queue()
    exp = ctx.RawValue("q", -1)  # every subscriber gets every message
    size = args.msg_size
    base = f"cbench/{tag}/{sc.key}"
    topics = [f"{base}/p{i}" for i in range(len(sc.pub_nodes))]
    filters = [f"{base}/+", f"{base}/#"]
    qos = args.qos
    prefix_pkt = lg.encode_publish(topics[0], b"\0" * size, qos, packet_id=1)
    prefix = prefix_pkt[: len(prefix_pkt) - size - len(topics[0]) - (2 if qos else 0)]
    pub_names, sub_names, procs = [], [], []
    for i, (topic, node) in enumerate(zip(topics, sc.pub_nodes, strict=True)):
        spec = lg.PubSpec(
            f"pub{i}", broker.ports[node], f"{tag}{sc.key}p{i}", topic, size, qos, args.duration
        )
        pub_names.append(spec.name)
        procs.append(ctx.Process(target=lg.publisher, args=(spec, go, go_time, exp, out)))
    for j, node in enumerate(sc.sub_nodes):
        spec = lg.SubSpec(
            f"sub{j}",
            broker.ports[node],
            [f"{tag}{sc.key}s{j}"],
            filters[j % 2],
            qos,
            size,
            lg.packet_len(topics[0], size, qos),
            prefix,
            args.duration,
            args.warmup,
            nap=args.sub_nap,
        )
        sub_names.append(spec.name)
        procs.append(ctx.Process(target=lg.subscriber, args=(spec, go, go_time, exp, out)))
    for p in procs:
        p.daemon = True
        p.start()
        workers.append(p)
    is_flowmq = isinstance(broker, FlowMQCluster)
    result: dict = {"scenario": sc.key, "errors": []}
    results: dict[str, dict] = {}
    finished = False
    try:
        waiting = set(pub_names) | set(sub_names)
        deadline = time.monotonic() + lg.READY_TIMEOUT_S
        while waiting:
            kind, name, value = out.get(timeout=max(0.1, deadline - time.monotonic()))
            if kind == "result":
                raise RuntimeError(f"{name}: {value.get('error', value)}")
            waiting.discard(name)
        cpu0 = [mb._cpu_seconds(p.pid) for p in broker.procs]
        drop0 = broker.metric_total("mqtt_messages_dropped_count") if is_flowmq else None
        fwd0 = broker.metric_total("broker_messages_forwarded_count") if is_flowmq else None
        pub0 = _per_node(broker, "broker_messages_published_count")
        start = time.monotonic() + 0.2
        go_time.value = start
        go.set()
        deadline = start + args.duration + lg.HARD_EXTRA_S + 15
        while len(results) < len(procs):
            try:
                kind, name, value = out.get(timeout=max(0.1, deadline - time.monotonic()))
            except Exception:
                result["errors"].append("timed out waiting for load-generator results")
                break
            results[name] = value
            if "error" in value:
                result["errors"].append(f"{name}: {value['error'].strip().splitlines()[-1]}")
            if all(n in results for n in pub_names) and exp.value < 0:
                exp.value = sum(results[n].get("sent", 0) for n in pub_names)
        cpu1 = [mb._cpu_seconds(p.pid) for p in broker.procs]
        drop1 = broker.metric_total("mqtt_messages_dropped_count") if is_flowmq else None
        fwd1 = broker.metric_total("broker_messages_forwarded_count") if is_flowmq else None
        pub1 = _per_node(broker, "broker_messages_published_count")
        finished = True
    finally:
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
    pubs = [results[n] for n in pub_names if "error" not in results.get(n, {"error": 1})]
    subs = [results[n] for n in sub_names if "error" not in results.get(n, {"error": 1})]
    sent = sum(r["sent"] for r in pubs)
    received = sum(sum(r["received"]) for r in subs)
    want = sent * len(sc.sub_nodes)
    for r in subs:
        result["errors"] += [f"subscriber: {e}" for e in r["errors"]]
    timed = [r for r in subs if r["t0"] is not None]
    if timed:
        t0 = min(r["t0"] for r in timed)
        t1 = max(r["t_last"] for r in timed)
        count = sum(r["c_last"] - r["c0"] for r in timed)
    else:
        t0 = t1 = 0.0
        count = 0
    wall = max((r["t_last"] or start for r in subs), default=start) - start
    result.update(
        sent=sent,
        expected=want,
        received=received,
        lost=want - received,
        rate=count / (t1 - t0) if t1 > t0 else 0.0,
        offered=sent / args.duration,
        broker_cpu=[(b - a) / max(wall, 1e-9) for a, b in zip(cpu0, cpu1, strict=True)],
        pub_cpu=max((r["cpu"] / max(r["wall"], 1e-9) for r in pubs), default=0.0),
        sub_cpu=max((r["cpu"] / max(r["wall"], 1e-9) for r in subs), default=0.0),
        dropped=None if drop0 is None else drop1 - drop0,
        forwarded=None if fwd0 is None else fwd1 - fwd0,
        published=[b - a for a, b in zip(pub0, pub1, strict=True)],
        pub_sent=[
            sum(results[f"pub{i}"].get("sent", 0) for i, m in enumerate(sc.pub_nodes) if m == node)
            for node in sorted(set(sc.pub_nodes))
        ],
        max_gap_ms=max((r["max_gap"] for r in subs), default=0.0) * 1000,
    )
    if not broker.alive():
        result["errors"].append("broker process died")
    return result


# --- part 2: propagation ---------------------------------------------------------------------


class Poller(threading.Thread):
    """Polls one node's route test for ``topic`` until ``check(data)`` is true (or ``until``).
    Every poll is kept as (sent, answered, check result)."""

    def __init__(self, conn: http.client.HTTPConnection, topic: str, check, interval: float):
        super().__init__(daemon=True)
        self.conn = conn
        self.path = "/api/v1/routes?topic=" + urllib.parse.quote(topic, safe="")
        self.check = check
        self.interval = interval
        self.polls: list[tuple[float, float, bool]] = []
        self.seen_at: float | None = None
        self.stop_at = time.monotonic() + 10.0
        self.error: str | None = None

    def run(self) -> None:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        try:
            while time.monotonic() < self.stop_at:
                t_sent = time.monotonic()
                self.conn.request("GET", self.path, headers=headers)
                body = json.loads(self.conn.getresponse().read())
                t_got = time.monotonic()
                ok = bool(self.check(body["data"]))
                self.polls.append((t_sent, t_got, ok))
                if ok:
                    self.seen_at = t_got
                    return
                if self.interval:
                    time.sleep(self.interval)
        except Exception as exc:  # noqa: BLE001 (reported)
            self.error = f"{type(exc).__name__}: {exc}"


def _conn(port: int) -> http.client.HTTPConnection:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.connect()
    conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn


def _route_test(conn: http.client.HTTPConnection, topic: str) -> dict:
    path = "/api/v1/routes?topic=" + urllib.parse.quote(topic, safe="")
    return _admin(conn, "GET", path)[1]["data"]


def _admin(conn: http.client.HTTPConnection, method: str, path: str, body=None) -> tuple[int, dict]:
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    conn.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
    resp = conn.getresponse()
    return resp.status, json.loads(resp.read())


def _watch(cluster: FlowMQCluster, conns, origin: int, topic: str, check, interval: float):
    pollers = [
        Poller(conns[j], topic, check, interval) for j in range(len(cluster.http)) if j != origin
    ]
    return pollers


def run_routes(cluster: FlowMQCluster, args: argparse.Namespace, tag: str) -> dict:
    n = len(cluster.ports)
    conns = [_conn(p) for p in cluster.http]
    suback, visible, visible_each, samples = [], [], [], []
    violations, errors = 0, []
    socks = []
    try:
        for k in range(args.routes):
            i = k % n
            node = cluster.node_ids[i]
            topic_filter = f"rp/{tag}/{k}/+"
            sock = lg.connect(cluster.ports[i], f"rp{tag}{k}")
            socks.append(sock)
            pollers = _watch(
                cluster,
                conns,
                i,
                f"rp/{tag}/{k}/x",
                lambda d, node=node: node in d["subscriber_nodes"],
                args.poll_interval,
            )
            t_sub = time.monotonic()
            for p in pollers:
                p.start()
            lg.subscribe(sock, topic_filter, 0)
            t_ack = time.monotonic()
            for p in pollers:
                p.join()
            suback.append(t_ack - t_sub)
            seen = []
            for p in pollers:
                if p.error or p.seen_at is None:
                    errors.append(f"route {k}: {p.error or 'never visible'}")
                    continue
                seen.append(p.seen_at - t_sub)
                visible_each.append(p.seen_at - t_sub)
                late = sum(1 for s, _, ok in p.polls if s > t_ack and not ok)
                violations += late
                if late:
                    errors.append(
                        f"route {k} on {node}: {late} route test(s) after the SUBACK without it, "
                        f"visible {1000 * (p.seen_at - t_sub):.0f} ms after SUBSCRIBE"
                    )
            samples.append([k, node, round(t_ack - t_sub, 6), [round(x, 6) for x in seen]])
            if len(seen) == n - 1:
                visible.append(max(seen))
            if args.route_gap:
                time.sleep(args.route_gap)
    finally:
        for sock in socks:
            lg._close(sock)
        for c in conns:
            c.close()
    return {
        "suback": suback,
        "visible": visible,
        "visible_each": visible_each,
        "violations": violations,
        "errors": errors,
        "samples": samples,
    }


def run_streams(cluster: FlowMQCluster, args: argparse.Namespace, tag: str) -> dict:
    n = len(cluster.ports)
    conns = [_conn(p) for p in cluster.http]
    created, visible, deleted, gone = [], [], [], []
    errors: list[str] = []
    try:
        for k in range(args.streams):
            i = k % n
            name = f"cb-{tag}-{k}"
            topic = f"rps/{tag}/{k}/x"

            def listed(d, name=name) -> bool:
                return any(x["name"] == name for x in d["destinations"])

            for what, method, path, body, check, lat, vis in (
                (
                    "create",
                    "POST",
                    "/api/v1/streams",
                    {"name": name, "topic_filters": [f"rps/{tag}/{k}/#"]},
                    listed,
                    created,
                    visible,
                ),
                (
                    "delete",
                    "DELETE",
                    f"/api/v1/streams/{name}",
                    None,
                    lambda d, listed=listed: not listed(d),
                    deleted,
                    gone,
                ),
            ):
                time.sleep(random.uniform(0, args.stream_jitter))  # not in step with gossip
                pollers = _watch(cluster, conns, i, topic, check, args.poll_interval)
                t0 = time.monotonic()
                for p in pollers:
                    p.start()
                status, answer = _admin(conns[i], method, path, body)
                t1 = time.monotonic()
                for p in pollers:
                    p.join()
                if status not in (200, 201):
                    errors.append(f"stream {k} {what}: HTTP {status} {answer.get('error')}")
                    break
                lat.append(t1 - t0)
                seen = [p.seen_at - t0 for p in pollers if p.seen_at is not None]
                for p in pollers:
                    if p.error or p.seen_at is None:
                        errors.append(f"stream {k} {what}: {p.error or 'not seen in 10 s'}")
                if len(seen) == n - 1:
                    vis.append(max(seen))
    finally:
        for c in conns:
            c.close()
    return {
        "create": created,
        "visible": visible,
        "delete": deleted,
        "gone": gone,
        "errors": errors,
    }


# --- report ----------------------------------------------------------------------------------


def _pct(values: list[float], q: float) -> float:
    return mb._percentile(sorted(values), q)


def _ms(v: float) -> str:
    if math.isnan(v):
        return "—"
    return f"{v * 1000:.1f}" if v < 0.1 else f"{v * 1000:,.0f}"


def _spread(values: list[float]) -> str:
    if not values:
        return "—"
    med = statistics.median(values)
    return (
        f"{mb._fmt_rate(med)} ({mb._fmt_rate(min(values))}–{mb._fmt_rate(max(values))})"
        if len(values) > 1
        else mb._fmt_rate(med)
    )


def _lost(rs: list[dict]) -> str:
    lost = sum(r["lost"] for r in rs)
    want = sum(r["expected"] for r in rs)
    return f"{lost / want:.1%}" if lost and want else str(lost)


def report_fanin(scs: list[Scenario], runs: dict[str, list[dict]], args) -> None:
    print()
    print(
        f"Fan-in: QoS {args.qos}, {args.fanin} publishers → subscribers on …/+ (…/#), MQTT 3.1.1, "
        f"{args.msg_size}-byte payloads, {args.duration:g} s per run ({args.warmup:g} s warm-up), "
        f"{args.rounds} round(s), {os.cpu_count()} CPUs shared by brokers and load generators"
    )
    print(
        "received = messages (deliveries) per s at the subscribers, median (min–max) over the "
        "rounds;\nratios of medians; sent/s = publishers' total; lost = share of the expected "
        "deliveries that never arrived"
    )
    row = "{:<34} {:>12} {:>24} {:>7} {:>7} {:>9} {:>10}"
    print(row.format("scenario", "metric", "received", "/1node", "/Mosq", "sent/s", "lost"))
    print("-" * 108)
    med = {k: statistics.median([r["rate"] for r in v]) if v else math.nan for k, v in runs.items()}
    for sc in scs:
        rs = runs.get(sc.key, [])
        metric = "deliveries/s" if len(sc.sub_nodes) > 1 else "msgs/s"
        m = med.get(sc.key, math.nan)
        one, mosq = med.get("1node", math.nan), med.get("mosquitto", math.nan)
        print(
            row.format(
                sc.title,
                metric,
                _spread([r["rate"] for r in rs]),
                f"{m / one:.2f}" if one and not math.isnan(one) else "—",
                f"{m / mosq:.2f}" if mosq and not math.isnan(mosq) else "—",
                mb._fmt_rate(statistics.median([r["offered"] for r in rs]) if rs else None),
                _lost(rs),
            )
        )
    print()
    drow = "{:<10} {:>3} {:>11} {:>11} {:>11} {:>9} {:>11} {:>9} {:>8} {:>8} {:>8}  {}"
    print(
        drow.format(
            "scenario",
            "rnd",
            "rate",
            "sent",
            "received",
            "lost",
            "forwarded",
            "drops",
            "brk CPU",
            "pub CPU",
            "max gap",
            "notes",
        )
    )
    for sc in scs:
        for n, r in enumerate(runs.get(sc.key, []), 1):
            print(
                drow.format(
                    sc.key,
                    n,
                    mb._fmt_rate(r["rate"]),
                    f"{r['sent']:,}",
                    f"{r['received']:,}",
                    f"{r['lost']:,}",
                    "—" if r["forwarded"] is None else f"{r['forwarded']:,.0f}",
                    "—" if r["dropped"] is None else f"{r['dropped']:,.0f}",
                    "+".join(f"{c:.0%}" for c in r["broker_cpu"]),
                    f"{r['pub_cpu']:.0%}",
                    f"{r['max_gap_ms']:,.0f} ms",
                    "; ".join(dict.fromkeys(r["errors"]))[:200],
                )
            )


def report_propagation(routes: dict | None, streams: dict | None, args) -> None:
    print()
    print(
        "Propagation, 3-node cluster (shared SQLite meta store), ms from the request sent; "
        f"route tests polled every {args.poll_interval * 1000:g} ms"
    )
    row = "{:<58} {:>6} {:>8} {:>8} {:>8}"
    print(row.format("", "n", "p50", "p99", "max"))
    print("-" * 92)

    def line(title: str, values: list[float]) -> None:
        print(
            row.format(
                title,
                len(values),
                _ms(_pct(values, 0.5)),
                _ms(_pct(values, 0.99)),
                _ms(max(values) if values else math.nan),
            )
        )

    if routes is not None:
        line("route: SUBSCRIBE → SUBACK", routes["suback"])
        line("route: SUBSCRIBE → listed by both other nodes", routes["visible"])
        line("route: SUBSCRIBE → listed by one other node (each)", routes["visible_each"])
    if streams is not None:
        line("stream: POST → 201", streams["create"])
        line("stream: POST → listed by both other nodes", streams["visible"])
        line("stream: DELETE → 200", streams["delete"])
        line("stream: DELETE → gone from both other nodes", streams["gone"])
    if routes is not None:
        print(
            f"route tests sent after the SUBACK that did not list the route: {routes['violations']}"
        )
    for what in (routes, streams):
        if what and what["errors"]:
            print(f"{len(what['errors'])} error(s), first: {what['errors'][:3]}")


# --- main ------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=5.0, help="seconds per fan-in run")
    ap.add_argument("--warmup", type=float, default=None, help="default: 20%% of --duration")
    ap.add_argument("--rounds", type=int, default=3, help="fan-in rounds (every scenario each)")
    ap.add_argument("--fanin", type=int, default=4, help="publishers (even: split over 2 nodes)")
    ap.add_argument("--msg-size", type=int, default=100)
    ap.add_argument("--qos", type=int, choices=(0, 1), default=0, help="QoS of the fan-in load")
    ap.add_argument("--sub-nap", type=float, default=0.0005, help="as mqtt_bench --sub-nap")
    ap.add_argument(
        "--scenarios",
        default="mosquitto,1node,2n-local,2n-split,2n-both",
        help="comma-separated subset of the fan-in scenarios",
    )
    ap.add_argument("--routes", type=int, default=200, help="route propagation samples")
    ap.add_argument("--streams", type=int, default=200, help="stream propagation samples")
    ap.add_argument("--poll-interval", type=float, default=0.001, help="route test poll, s")
    ap.add_argument("--route-gap", type=float, default=0.01, help="pause between samples, s")
    ap.add_argument(
        "--stream-jitter",
        type=float,
        default=0.25,
        help="random pause (0..this, s) before each stream create/delete, so the requests do "
        "not fall into step with the 200 ms gossip rounds",
    )
    ap.add_argument("--skip-fanin", action="store_true")
    ap.add_argument("--skip-routes", action="store_true")
    ap.add_argument("--mosquitto", default=mb.MOSQUITTO)
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (logs, data)")
    ap.add_argument("--json", help="also write the results to this file")
    args = ap.parse_args(argv)
    if args.warmup is None:
        args.warmup = 0.2 * args.duration
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    workdir = Path(tempfile.mkdtemp(prefix="cluster-bench-"))
    brokers: dict[str, mb.Broker] = {}
    workers: list = []
    tag = uuid.uuid4().hex[:4]
    wanted = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    scs = [sc for sc in scenarios(args.fanin) if sc.key in wanted]
    runs: dict[str, list[dict]] = {sc.key: [] for sc in scs}
    routes = streams = None
    load0 = os.getloadavg()
    try:
        if not args.skip_fanin and scs:
            needed = {sc.broker for sc in scs}
            if "mosquitto" in needed:
                brokers["mosquitto"] = mb.Mosquitto(workdir, args.mosquitto, 1_000_000, [])
            if "single" in needed:
                brokers["single"] = FlowMQCluster(workdir, 1, "single")
            if "pair" in needed:
                brokers["pair"] = FlowMQCluster(workdir, 2, "pair")
            for key, b in brokers.items():
                linked = getattr(b, "linked_after", 0.0)
                print(
                    f"{key}: {b.version}, MQTT ports {b.ports}"
                    + (f", routes reach every node {linked:.1f} s after start" if linked else ""),
                    flush=True,
                )
            for rnd in range(args.rounds):
                for sc in scs:
                    b = brokers[sc.broker]
                    print(f"  round {rnd + 1} {sc.title} …", end=" ", flush=True)
                    try:
                        r = run_fanin(b, sc, args, f"{tag}r{rnd}", workers)
                    except Exception as exc:  # one failed run does not end the comparison
                        print(f"failed: {exc}"[:300])
                        continue
                    runs[sc.key].append(r)
                    print(
                        f"{mb._fmt_rate(r['rate'])}, sent {r['sent']:,} received "
                        f"{r['received']:,} lost {r['lost']:,}",
                        flush=True,
                    )
                    # A fixed pause, as in mqtt_bench: let the brokers close the old
                    # connections (mosquitto exposes no metric to poll for it).
                    time.sleep(0.5)
            for b in brokers.values():
                b.stop()
        if not args.skip_routes and (args.routes or args.streams):
            trio = brokers["trio"] = FlowMQCluster(workdir, 3, "trio")
            print(
                f"trio: {trio.version}, nodes {trio.node_ids}, routes reach every node "
                f"{trio.linked_after:.1f} s after start",
                flush=True,
            )
            if args.routes:
                print(f"  route propagation × {args.routes} …", flush=True)
                routes = run_routes(trio, args, tag)
            if args.streams:
                print(f"  stream propagation × {args.streams} …", flush=True)
                streams = run_streams(trio, args, tag)
        load1 = os.getloadavg()
        if scs and not args.skip_fanin:
            report_fanin(scs, runs, args)
        if routes or streams:
            report_propagation(routes, streams, args)
        print(f"\nload average at start {load0[0]:.2f}, at end {load1[0]:.2f}")
        for b in brokers.values():
            problems = b.problems()
            if problems:
                print(f"\n{b.version} logs: {len(problems)} warning/error line(s), first ones:")
                for ln in problems[:8]:
                    print("   ", ln[:200])
        if args.json:
            Path(args.json).write_text(
                json.dumps(
                    {"args": vars(args), "fanin": runs, "routes": routes, "streams": streams},
                    indent=1,
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
        for b in brokers.values():
            b.stop()
        if args.keep:
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
