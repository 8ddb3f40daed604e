"""Kafka produce / consume / end-to-end latency against one FlowMQ broker process.

The broker runs in a child process (uvloop, file object store + SQLite meta store under a
temp dir, or ``--objects``/``--meta``), with its meta store wrapped to count transactions
and its batcher's stats readable, so every phase reports object PUTs (from ``/metrics``:
``s3_request_count{type="put"}``), flushes and meta transactions per MB ingested.  Clients
are librdkafka (confluent-kafka), each in a process of its own:

- produce: ``--producers`` processes send ``--record-size`` records (100 B and 1 KiB by
  default) with acks=all, linger.ms=5, for ``--seconds``; MB/s and records/s acknowledged;
- consume: one consumer reads the 1 KiB topic back from offset 0; MB/s;
- latency: records at a fixed ``--rate`` (default 20k/s) carry their send time; a consumer
  reports p50/p99 of receive - send;
- MQTT → Stream latency: an MQTT QoS 1 publisher (``mqtt_loadgen``'s paced one, 100-byte
  messages, window 256) sends at ``--mqtt-rate`` (default 10k/s) to a topic that a Stream
  takes (created through the admin API), and a Kafka consumer of that Stream reports p50/p99
  of receive - send (the durable write, then the long poll's wake-up);
- AMQP → Stream latency: the same with an AMQP publisher (``amqp_loadgen``'s paced one,
  persistent 100-byte messages with publisher confirms, window 256, ``--amqp-rate``).

    python benchmarks/kafka_bench.py                    # ~50 s
    python benchmarks/kafka_bench.py --seconds 10 --producers 2 --json
    python benchmarks/kafka_bench.py --sizes '' --rate 0 --mqtt-rate 10000 --amqp-rate 0
        # MQTT → Stream only (--mqtt-rate 0 --amqp-rate 10000: AMQP → Stream only)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import statistics
import struct
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
for _root in (HERE.parent / "libs", HERE.parent / "services"):
    if str(_root) not in sys.path:
        sys.path.insert(0, str(_root))


# -- the broker (child process) -------------------------------------------------------------------


def broker_main(data_dir: str, objects: str, meta: str, conn: Any) -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    from flowmq_broker.runtime import tune_interpreter

    tune_interpreter()  # as `flowmq serve` does (GC threshold, 1 ms GIL switch interval)
    asyncio.run(_serve(data_dir, objects, meta, conn))


async def _serve(data_dir: str, objects: str, meta: str, conn: Any) -> None:
    import logging

    from flowmq_broker.server import Broker
    from flowmq_core.config import BrokerConfig

    logging.basicConfig(level=logging.WARNING)
    config = BrokerConfig(
        data_dir=data_dir,
        objects=objects,
        meta=meta,
        http_port=0,
        mqtt_port=0,
        kafka_port=0,
        amqp_port=0,
        gossip_port=0,
        admin_token="bench",
        node_id="bench",
        roles=["kafka", "mqtt", "amqp", "admin"],
    )
    broker = Broker(config)
    await broker.start()
    from meta_counting import count_transactions

    transactions = count_transactions(broker.meta)
    conn.send({"ports": broker.ports, "flush_interval_s": broker.batcher.flush_interval})
    loop = asyncio.get_running_loop()
    while True:
        command = await loop.run_in_executor(None, conn.recv)
        if command == "stop":
            break
        stats = broker.batcher.stats
        conn.send(
            {
                "meta_transactions": transactions[0],
                "flushes": stats.flushes,
                "flushed_bytes": stats.bytes,
                "intent_transactions": stats.intent_transactions,
            }
        )
    await broker.stop()
    conn.send("stopped")


class BrokerHandle:
    def __init__(self, data_dir: str, objects: str, meta: str) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(
            target=broker_main, args=(data_dir, objects, meta, child), daemon=True
        )
        self.proc.start()
        hello = self.conn.recv()
        self.ports = hello["ports"]
        self.flush_interval_s = hello["flush_interval_s"]
        self.bootstrap = f"127.0.0.1:{self.ports['kafka']}"

    def stats(self) -> dict[str, float]:
        self.conn.send("stats")
        out = dict(self.conn.recv())
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ports['http']}/metrics") as r:
            for line in r.read().decode().splitlines():
                if line.startswith('s3_request_count{type="put"}'):
                    out["puts"] = float(line.split()[-1])
                elif line.startswith('kafka_messages_in_bytes_count{namespace="default"}'):
                    out["kafka_in_bytes"] = float(line.split()[-1])
        out.setdefault("puts", 0.0)
        out.setdefault("kafka_in_bytes", 0.0)
        return out

    def stop(self) -> None:
        self.conn.send("stop")
        self.conn.recv()
        self.proc.join(30)


# -- clients (child processes) ---------------------------------------------------------------------


def _quiet() -> Any:
    import logging

    logger = logging.getLogger("bench-librdkafka")
    logger.addHandler(logging.NullHandler())
    logger.propagate = False
    return logger


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, "logger": _quiet()})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)


def produce_worker(bootstrap: str, topic: str, size: int, seconds: float, results: Any) -> None:
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": 5,
            "batch.size": 1_000_000,
            "queue.buffering.max.kbytes": 262_144,
            "queue.buffering.max.messages": 1_000_000,
            "logger": _quiet(),
        }
    )
    value = os.urandom(size)  # incompressible, though nothing compresses here
    acked = [0]

    def delivered(err: Any, _msg: Any) -> None:
        if err is None:
            acked[0] += 1

    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        for _ in range(2000):
            try:
                producer.produce(topic, value, on_delivery=delivered)
            except BufferError:
                producer.poll(0.001)
        producer.poll(0)
    producer.flush(60)
    elapsed = time.perf_counter() - started
    results.put((acked[0], acked[0] * size, elapsed))


def consume_worker(bootstrap: str, topic: str, partitions: int, results: Any) -> None:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{time.time_ns()}",
            "enable.auto.commit": False,
            "fetch.max.bytes": 52_428_800,
            "max.partition.fetch.bytes": 4_194_304,
            "queued.max.messages.kbytes": 262_144,
            "logger": _quiet(),
        }
    )
    total = sum(
        consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
        for p in range(partitions)
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    count = size = 0
    started = time.perf_counter()
    while count < total and time.perf_counter() - started < 120:
        for m in consumer.consume(num_messages=10_000, timeout=0.5):
            if m.error() is None:
                count += 1
                size += len(m.value())
    elapsed = time.perf_counter() - started
    consumer.close()
    results.put((count, size, elapsed))


_STAMP = struct.Struct(">q")


def latency_producer(bootstrap: str, topic: str, rate: int, seconds: float, size: int) -> None:
    from confluent_kafka import Producer

    producer = Producer(
        {"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "logger": _quiet()}
    )
    pad = b"x" * max(0, size - _STAMP.size)
    tick = 0.001
    per_tick = rate * tick
    started = time.perf_counter()
    sent = 0.0
    while (now := time.perf_counter()) - started < seconds:
        due = int((now - started) * rate) - int(sent)
        for _ in range(max(0, due)):
            producer.produce(topic, _STAMP.pack(time.time_ns()) + pad)
        sent += max(0, due)
        producer.poll(0)
        time.sleep(max(0.0, tick - (time.perf_counter() - now)))
    del per_tick
    producer.flush(30)


def latency_consumer(
    bootstrap: str,
    topic: str,
    seconds: float,
    ready: Any,
    results: Any,
    monotonic: bool = False,
    fetch_wait_ms: int = 100,
) -> None:
    """Latencies of the records read, from the send time in their first 8 bytes: wall-clock
    ns (``latency_producer``) or, with ``monotonic``, ``time.monotonic_ns`` (mqtt_loadgen)."""
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"lat-{time.time_ns()}",
            "auto.offset.reset": "latest",
            "enable.auto.commit": False,
            # How long an idle long poll waits; new records wake it at once (librdkafka's
            # default is 500 ms, Java's fetch.max.wait.ms too): it does not add to latency.
            "fetch.wait.max.ms": fetch_wait_ms,
            "logger": _quiet(),
        }
    )
    assigned = threading.Event()
    consumer.subscribe([topic], on_assign=lambda c, ps: assigned.set())
    while not assigned.is_set():
        consumer.poll(0.1)
    ready.set()
    latencies: list[float] = []
    clock = time.monotonic_ns if monotonic else time.time_ns
    deadline = time.perf_counter() + seconds + 10
    while time.perf_counter() < deadline:
        # poll, not consume(n, timeout): the batch call waits for n records or the timeout,
        # which would add up to the timeout to every measured latency.
        m = consumer.poll(0.1)
        if m is not None and m.error() is None:
            latencies.append((clock() - _STAMP.unpack_from(m.value())[0]) / 1e6)
    consumer.close()
    results.put(latencies)


# -- phases ----------------------------------------------------------------------------------------


def _delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before.get(k, 0.0) for k in after}


def produce_phase(broker: BrokerHandle, size: int, args: argparse.Namespace) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    topic = f"bench-{size}"
    create_topic(broker.bootstrap, topic, args.partitions)
    before = broker.stats()
    results = ctx.Queue()
    procs = [
        ctx.Process(
            target=produce_worker, args=(broker.bootstrap, topic, size, args.seconds, results)
        )
        for _ in range(args.producers)
    ]
    for p in procs:
        p.start()
    outs = [results.get(timeout=args.seconds + 120) for _ in procs]
    for p in procs:
        p.join()
    after = broker.stats()
    records = sum(o[0] for o in outs)
    size_bytes = sum(o[1] for o in outs)
    elapsed = max(o[2] for o in outs)
    d = _delta(before, after)
    mb = d["kafka_in_bytes"] / 1e6 or 1.0
    return {
        "record_size": size,
        "records": records,
        "produce_MB_s": size_bytes / elapsed / 1e6,
        "produce_records_s": records / elapsed,
        "flushes": d["flushes"],
        "avg_flush_MB": d["flushed_bytes"] / max(d["flushes"], 1) / 1e6,
        "object_puts_per_MB": d["puts"] / mb,
        "meta_txns_per_MB": d["meta_transactions"] / mb,
        "puts_per_flush": d["puts"] / max(d["flushes"], 1),
        "meta_txns_per_flush": d["meta_transactions"] / max(d["flushes"], 1),
    }


def consume_phase(broker: BrokerHandle, args: argparse.Namespace) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    proc = ctx.Process(
        target=consume_worker, args=(broker.bootstrap, "bench-1024", args.partitions, results)
    )
    proc.start()
    count, size, elapsed = results.get(timeout=300)
    proc.join()
    return {
        "records": count,
        "consume_MB_s": size / elapsed / 1e6,
        "consume_records_s": count / elapsed,
    }


def latency_phase(broker: BrokerHandle, args: argparse.Namespace) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    topic = "bench-latency"
    create_topic(broker.bootstrap, topic, args.partitions)
    results = ctx.Queue()
    ready = ctx.Event()
    consumer = ctx.Process(
        target=latency_consumer,
        args=(
            broker.bootstrap,
            topic,
            args.latency_seconds,
            ready,
            results,
            False,
            args.fetch_wait,
        ),
    )
    consumer.start()
    ready.wait(60)
    time.sleep(1.0)
    producer = ctx.Process(
        target=latency_producer,
        args=(broker.bootstrap, topic, args.rate, args.latency_seconds, args.latency_size),
    )
    producer.start()
    producer.join()
    latencies = results.get(timeout=args.latency_seconds + 60)
    consumer.join()
    return {"rate_records_s": args.rate, **_latency_summary(latencies, args.rate)}


def _latency_summary(latencies: list[float], rate: int) -> dict[str, Any]:
    # The first second is warm-up (connections, metadata); drop it.
    skip = min(len(latencies) // 10, rate)
    body = latencies[skip:] or latencies
    body.sort()
    q = statistics.quantiles(body, n=100) if len(body) > 1 else [0.0] * 99
    return {
        "records": len(latencies),
        "e2e_p50_ms": q[49],
        "e2e_p99_ms": q[98],
        "e2e_max_ms": body[-1] if body else 0.0,
    }


def _stream_with_consumer(
    broker: BrokerHandle, args: argparse.Namespace, stream: str, topic: str, monotonic: bool
) -> tuple[Any, Any]:
    """Create ``stream`` taking ``topic`` through the admin API and start a Kafka consumer
    of it (``latency_consumer``); returns the consumer process and its results queue."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{broker.ports['http']}/api/v1/streams",
        data=json.dumps({"name": stream, "topic_filters": [topic]}).encode(),
        headers={"Authorization": "Bearer bench", "Content-Type": "application/json"},
        method="POST",
    )
    urllib.request.urlopen(request, timeout=10).close()
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    ready = ctx.Event()
    consumer = ctx.Process(
        target=latency_consumer,
        args=(
            broker.bootstrap,
            stream,
            args.latency_seconds,
            ready,
            results,
            monotonic,
            args.fetch_wait,
        ),
    )
    consumer.start()
    ready.wait(60)
    time.sleep(1.0)
    return consumer, results


def mqtt_stream_latency_phase(broker: BrokerHandle, args: argparse.Namespace) -> dict[str, Any]:
    """MQTT QoS 1 publishes into a Stream, read back by a Kafka consumer."""
    import mqtt_loadgen

    stream, topic = "mqtt-latency", "bench/stream"
    consumer, results = _stream_with_consumer(broker, args, stream, topic, True)
    ctx = mp.get_context("spawn")
    spec = mqtt_loadgen.PubSpec(
        name="pub",
        port=broker.ports["mqtt"],
        client_id="bench-stream-pub",
        topic=topic,
        msg_size=100,
        qos=1,
        duration=args.latency_seconds,
        rate=args.mqtt_rate,
    )
    go, go_time, expected, out = ctx.Event(), ctx.Value("d", 0.0), ctx.Value("q", -1), ctx.Queue()
    publisher = ctx.Process(target=mqtt_loadgen.publisher, args=(spec, go, go_time, expected, out))
    publisher.start()
    assert out.get(timeout=60)[0] == "ready"
    go_time.value = time.monotonic() + 0.2
    go.set()
    _, _, sent = out.get(timeout=args.latency_seconds + 60)
    publisher.join()
    latencies = results.get(timeout=args.latency_seconds + 60)
    consumer.join()
    if "error" in sent:
        raise RuntimeError(sent["error"])
    return {
        "rate_msgs_s": args.mqtt_rate,
        "sent_rate_msgs_s": sent["rate"],
        "acked": sent["acked"],
        **_latency_summary(latencies, args.mqtt_rate),
    }


def amqp_stream_latency_phase(broker: BrokerHandle, args: argparse.Namespace) -> dict[str, Any]:
    """AMQP persistent publishes with confirms into a Stream, read back by a Kafka consumer:
    ``amqp_loadgen``'s paced publisher (100-byte bodies, window 256, the default exchange,
    so the routing key is the topic), the consumer as in the MQTT phase."""
    import amqp_loadgen

    stream = topic = "amqp-latency-in"
    consumer, results = _stream_with_consumer(broker, args, stream, topic, False)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    start = time.time() + 0.5
    publisher = ctx.Process(
        target=amqp_loadgen.publisher_proc,
        args=(
            broker.ports["amqp"], topic, 100, 256, float(args.amqp_rate), start,
            start + args.latency_seconds, out,
        ),
    )  # fmt: skip
    publisher.start()
    _, sent = out.get(timeout=args.latency_seconds + 60)
    publisher.join()
    latencies = results.get(timeout=args.latency_seconds + 60)
    consumer.join()
    return {
        "rate_msgs_s": args.amqp_rate,
        "sent_rate_msgs_s": sent["sent"] / args.latency_seconds,
        "acked": sent["confirmed"],
        "nacked": sent["nacked"],
        **_latency_summary(latencies, args.amqp_rate),
    }


def main() -> None:
    import machine

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="per produce phase")
    parser.add_argument("--sizes", default="1024,100", help="record sizes to produce")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--producers", type=int, default=1, help="producer processes")
    parser.add_argument("--rate", type=int, default=20_000, help="latency phase records/s")
    parser.add_argument("--latency-seconds", type=float, default=8.0)
    parser.add_argument("--latency-size", type=int, default=100)
    parser.add_argument(
        "--mqtt-rate", type=int, default=10_000, help="MQTT → Stream msgs/s (0: skip)"
    )
    parser.add_argument(
        "--amqp-rate", type=int, default=10_000, help="AMQP → Stream msgs/s (0: skip)"
    )
    parser.add_argument(
        "--fetch-wait", type=int, default=100, help="the latency consumers' fetch.wait.max.ms"
    )
    parser.add_argument("--dir", default=None, help="data dir (default: a temp dir)")
    parser.add_argument("--objects", default="", help="object store URL (default: file)")
    parser.add_argument("--meta", default="", help="meta store URL (default: SQLite)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        broker = BrokerHandle(str(Path(tmp) / "data"), args.objects, args.meta)
        report: dict[str, Any] = {
            "config": {
                "flush_interval_ms": broker.flush_interval_s * 1000,
                "partitions": args.partitions,
                "producers": args.producers,
                "acks": "all",
                "linger_ms": 5,
                "cpus": os.cpu_count(),
                "interpreter_speed": machine.interpreter_speed(),
                "load_average": os.getloadavg(),
            }
        }
        try:
            sizes = [int(s) for s in args.sizes.split(",") if s]
            for size in sizes:
                report[f"produce_{size}B"] = produce_phase(broker, size, args)
            if 1024 in sizes:
                report["consume_1024B"] = consume_phase(broker, args)
            if args.rate > 0:
                report["latency"] = latency_phase(broker, args)
            if args.mqtt_rate > 0:
                report["mqtt_stream_latency"] = mqtt_stream_latency_phase(broker, args)
            if args.amqp_rate > 0:
                report["amqp_stream_latency"] = amqp_stream_latency_phase(broker, args)
        finally:
            broker.stop()
    if args.json:
        print(json.dumps(report, indent=2))
        return
    for section, values in report.items():
        print(section)
        for key, value in values.items():
            shown = f"{value:,.2f}" if isinstance(value, float) else value
            print(f"  {key:24} {shown}")


if __name__ == "__main__":
    main()
