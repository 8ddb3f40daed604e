"""What authorization costs: MQTT QoS 0 1→1 and Kafka produce with no ACL rule and with 10,000
rules, in one run on one broker process, plus the decision itself timed in-process.

    python benchmarks/acl_bench.py [--rules 10000] [--duration 5] [--repeat 3] [--json out.json]

One ``flowmq serve`` (this interpreter, fresh data dir, every role, ``acl_default`` allow: a
loopback broker's default) runs for the whole run; the script flips its ACLs between

- ``off``: no rule;
- ``on``: ``--rules`` rules — the allows the load needs (``*`` may publish and subscribe
  ``bench/#``, produce and create ``stream:acl-bench-*``), deny rules under the same prefixes
  (so every decision walks past them), rules of other users and of ``*`` on other topics,
  streams and groups —

by writing them into (and deleting them from) the broker's SQLite meta store, as another
broker would (``flowmq_meta.acls.create_rules``/``delete_rules``), then waiting for its
anti-entropy to load them.  One process for both states: two brokers side by side differed
by ~19 % with identical settings on this machine (the second started was slower), far more
than what is measured here.

Each round runs the ``qos0`` load of ``mqtt_bench.py`` (its load generator and measurement,
unchanged; clients are anonymous, principal ``*``), then one librdkafka producer of
``kafka_bench.py`` (acks=all, 100-byte records) for ``--duration``, in both states (which
goes first alternates by round).  The median of the rounds is reported with the ratio on/off
per load.  Before the broker starts, the decision is timed with ``timeit`` on an
``Authorizer`` holding the same rules: a cached PUBLISH check (the one dict lookup of the MQTT
hot path), a cached stream check (Kafka produce, per topic of a request), and a miss (the
decision made from the rules).

The machine's interpreter speed (``machine.interpreter_speed``) is printed with the results.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import kafka_bench as kb  # noqa: E402  (also puts libs/ and services/ on sys.path)
import mqtt_bench as mb  # noqa: E402
from machine import cpu_model, interpreter_speed  # noqa: E402

from flowmq_core.acl import Authorizer, Rule  # noqa: E402

RECORD_SIZE = 100


def bench_rules(count: int) -> list[Rule]:
    """``count`` rules: what the load needs, then a mix of others up to ``count``."""
    rules = [
        Rule("*", "default", "bench/#", "publish", "allow"),
        Rule("*", "default", "bench/#", "subscribe", "allow"),
        Rule("*", "default", "stream:acl-bench-*", "produce", "allow"),
        Rule("*", "default", "stream:acl-bench-*", "create", "allow"),
    ]
    i = 0
    while len(rules) < count:
        kind = i % 5
        if kind == 0:  # denies under the load's own prefix: in every walk of its topics
            rules.append(Rule("*", "default", f"bench/deny{i}/#", "publish", "deny"))
        elif kind == 1:
            rules.append(Rule(f"user{i}", "default", f"tenant/{i}/#", "all", "allow"))
        elif kind == 2:
            rules.append(Rule("*", "default", f"site/{i}/+/telemetry", "subscribe", "allow"))
        elif kind == 3:
            rules.append(Rule("*", "default", f"stream:acl-bench-deny{i}", "produce", "deny"))
        else:
            rules.append(Rule(f"user{i}", "default", f"group:g{i}", "consume", "allow"))
        i += 1
    return rules[:count]


def time_decisions(rules: list[Rule]) -> dict[str, float]:
    """Nanoseconds per decision, best of 5 timeit runs."""
    authorizer = Authorizer(rules, default_allow=False)
    access = authorizer.access("default", None)
    topic = "bench/abcd/qos0/acl-on/c0"
    assert access.may_publish(topic) and access.allowed("produce", "stream", "acl-bench-on")
    cache = access.publish

    def best(stmt, number: int) -> float:
        names = {"cache": cache, "topic": topic, "access": access, "miss": miss}
        runs = timeit.repeat(stmt, number=number, repeat=5, globals=names)
        return min(runs) / number * 1e9

    misses = iter(range(10**9))

    def miss() -> bool:
        cache.clear()  # what a new topic (or the first message after a change) costs
        return access.may_publish(f"bench/t{next(misses)}/x")

    return {
        # The statement the MQTT adapter runs per PUBLISH (``acl_publish.get(topic)``).
        "publish_cached_ns": best("cache.get(topic)", 2_000_000),
        "stream_cached_ns": best('access.allowed("produce", "stream", "acl-bench-on")', 1_000_000),
        "publish_miss_ns": best("miss()", 20_000),
        "empty_statement_ns": best("pass", 2_000_000),
    }


class AclSwitch:
    """Writes the rules into the broker's meta store, or deletes them, and waits until the
    broker has loaded the change (anti-entropy reads the metadata version every second)."""

    APPLY_WAIT_S = 2.5

    def __init__(self, url: str, rules: list[Rule]) -> None:
        self.url = url
        self.rules = rules
        self.state = "off"

    def set(self, state: str) -> None:
        if state == self.state:
            return
        from flowmq_core.acl import rule_id
        from flowmq_meta import acls, open_meta_store

        async def write() -> None:
            store = open_meta_store(self.url)
            try:
                if state == "on":
                    await acls.create_rules(store, self.rules)
                else:
                    await acls.delete_rules(store, [rule_id(r) for r in self.rules])
            finally:
                await store.close()

        asyncio.run(write())
        time.sleep(self.APPLY_WAIT_S)
        self.state = state


def kafka_produce(bootstrap: str, topic: str, seconds: float) -> float:
    """Records/s one librdkafka producer gets acknowledged (acks=all)."""
    kb.create_topic(bootstrap, topic, 1)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    proc = ctx.Process(
        target=kb.produce_worker, args=(bootstrap, topic, RECORD_SIZE, seconds, results)
    )
    proc.start()
    records, _, elapsed = results.get(timeout=seconds + 120)
    proc.join(30)
    return records / elapsed


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rules", type=int, default=10_000, help="rules of the 'on' broker")
    ap.add_argument("--duration", type=float, default=5.0, help="seconds per run (default 5)")
    ap.add_argument("--repeat", type=int, default=3, help="rounds over off/on (default 3)")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (logs, data)")
    ap.add_argument("--json", help="also write the results to this file")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    load_args = mb.parse_args(["--loads", "qos0", "--duration", str(args.duration)])
    load = mb.make_loads(load_args)["qos0"]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    speed = interpreter_speed()
    rules = bench_rules(args.rules)
    decisions = time_decisions(rules)
    workdir = Path(tempfile.mkdtemp(prefix="acl-bench-"))
    broker: mb.FlowMQ | None = None
    workers: list = []
    rates: dict[str, list[float]] = {}
    notes: list[str] = []
    try:
        meta = f"sqlite:///{workdir / 'meta.db'}"
        broker = mb.FlowMQ(workdir, 1, ("--meta", meta, "--acl-default", "allow"))
        broker.key = "acl"
        switch = AclSwitch(meta, rules)
        print(
            f"interpreter speed {speed:.1f} M loops/s · {len(rules):,} rules on · "
            f"cached PUBLISH check {decisions['publish_cached_ns']:.0f} ns, cached stream "
            f"check {decisions['stream_cached_ns']:.0f} ns, miss "
            f"{decisions['publish_miss_ns'] / 1000:.1f} µs · workdir {workdir}",
            flush=True,
        )
        tag = uuid.uuid4().hex[:4]
        bootstrap = f"127.0.0.1:{broker.ports_json[0]['kafka']}"
        for round_ in range(args.repeat):
            # Alternate which goes first, so a drift of the machine hits both alike.
            for mode in ("off", "on") if round_ % 2 == 0 else ("on", "off"):
                switch.set(mode)
                print(f"  round {round_ + 1}, ACLs {mode}: MQTT qos0 …", end=" ", flush=True)
                r = mb.run_load(broker, load, load_args, f"{tag}{round_}{mode}", workers)
                rates.setdefault(f"mqtt-{mode}", []).append(r["rate"])
                problems = list(dict.fromkeys(r["errors"]))
                if r["lost"]:
                    problems.append(f"{r['lost']:,} lost")
                notes += [f"mqtt {mode}: {p}" for p in problems]
                print(
                    f"{mb._fmt_rate(r['rate'])} msgs/s (broker CPU {r['broker_cpu']:.0%}); "
                    "Kafka produce …",
                    end=" ",
                    flush=True,
                )
                rate = kafka_produce(bootstrap, f"acl-bench-{mode}-{round_}", args.duration)
                rates.setdefault(f"kafka-{mode}", []).append(rate)
                print(f"{mb._fmt_rate(rate)} records/s")
        notes += [f"broker log: {line}" for line in broker.problems()[:5]]
    finally:
        for p in workers:
            if p.is_alive():
                p.terminate()
        if broker is not None:
            broker.stop()
        if not args.keep:
            subprocess.run(["rm", "-rf", str(workdir)], check=False)
    median = {k: statistics.median(v) for k, v in rates.items()}
    report = {
        "interpreter_mloops_per_s": round(speed, 2),
        "python": platform.python_version(),
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "rules": len(rules),
        "duration_s": args.duration,
        "repeat": args.repeat,
        "decisions_ns": {k: round(v, 1) for k, v in decisions.items()},
        "rates": rates,
        "median": median,
        "ratios": {
            "mqtt_on_over_off": median["mqtt-on"] / median["mqtt-off"],
            "kafka_on_over_off": median["kafka-on"] / median["kafka-off"],
        },
        "notes": notes,
    }
    print_report(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


def print_report(report: dict) -> None:
    m, ratio, d = report["median"], report["ratios"], report["decisions_ns"]
    print()
    print(
        f"ACLs off vs {report['rules']:,} rules on · {report['duration_s']:g} s × "
        f"{report['repeat']} rounds (median) · loopback · {report['cpus']} CPUs ({report['cpu']})"
    )
    print(
        f"Python {report['python']}: interpreter speed {report['interpreter_mloops_per_s']} M "
        f"loops/s"
    )
    print(
        f"decision: cached PUBLISH {d['publish_cached_ns']:.0f} ns, cached stream "
        f"{d['stream_cached_ns']:.0f} ns, miss {d['publish_miss_ns']:.0f} ns "
        f"(timeit of an empty statement: {d['empty_statement_ns']:.0f} ns)"
    )
    print()
    row = "{:<28} {:>10} {:>10} {:>8}"
    print(row.format("", "off", "on", "on/off"))
    print(
        row.format(
            "MQTT QoS 0 1→1 msgs/s",
            mb._fmt_rate(m["mqtt-off"]),
            mb._fmt_rate(m["mqtt-on"]),
            f"{ratio['mqtt_on_over_off']:.3f}",
        )
    )
    print(
        row.format(
            "Kafka produce records/s",
            mb._fmt_rate(m["kafka-off"]),
            mb._fmt_rate(m["kafka-on"]),
            f"{ratio['kafka_on_over_off']:.3f}",
        )
    )
    for note in report["notes"]:
        print(f"note {note}")


if __name__ == "__main__":
    sys.exit(main())
