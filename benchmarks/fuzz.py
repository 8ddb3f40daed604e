"""Fuzz the live MQTT, Kafka and AMQP listeners of a `flowmq serve` process (issue #11).

    python benchmarks/fuzz.py --frames 1000000 --protocol all --seed 1

Per protocol a fresh broker (all roles, a data dir of its own) gets ``--frames`` frames over
raw sockets: valid handshakes followed by valid and mutated frames, junk, truncated and
oversized lengths (tests/fixtures/fuzz).  After each of ``--batches`` batches the broker must
be alive and serve a normal client of every protocol (paho-mqtt, kafka-python, pika).
Prints per protocol the frames sent, crashes, tracebacks in the broker's log, RSS before,
after and at its peak, and the round trips; exits 1 on a crash, a traceback or a failed round
trip (and, with ``--max-rss-growth``, on RSS growth past it).
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.fixtures.broker_process import start_broker  # noqa: E402
from tests.fixtures.cli import flowmq_user  # noqa: E402
from tests.fixtures.fuzz.kafka import FUZZ_USER  # noqa: E402
from tests.fixtures.fuzz.run import PROTOCOLS, Report, fuzz  # noqa: E402


def run_one(protocol: str, args: argparse.Namespace) -> Report:
    with tempfile.TemporaryDirectory(prefix=f"fuzz-{protocol}-") as tmp:
        data = Path(tmp) / "data"
        user, password = FUZZ_USER
        added = flowmq_user(data, "add", user, "--password", password)
        if added.returncode:
            raise SystemExit(f"could not add the fuzz user: {added.stderr}")
        broker = start_broker(data, *args.broker_args)
        try:
            return asyncio.run(
                fuzz(broker, protocol, args.frames, seed=args.seed, batches=args.batches)
            )
        finally:
            broker.stop()
            if args.log:
                Path(args.log).with_suffix(f".{protocol}.log").write_text("".join(broker.output))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--frames", type=int, default=100_000, help="frames per protocol")
    parser.add_argument("--protocol", choices=[*PROTOCOLS, "all"], default="all")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--batches", type=int, default=10, help="round trips checked after each")
    parser.add_argument("--max-rss-growth", type=float, default=0.0, help="MiB; 0: not checked")
    parser.add_argument("--log", help="keep the broker logs as LOG.<protocol>.log")
    parser.add_argument(
        "broker_args", nargs="*", help="extra `flowmq serve` options (after --)", default=[]
    )
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 8192), hard))
    failed = False
    for protocol in PROTOCOLS if args.protocol == "all" else [args.protocol]:
        report = run_one(protocol, args)
        print("\n".join(report.lines()), flush=True)
        too_big = args.max_rss_growth and report.rss_growth_mib > args.max_rss_growth
        failed |= not report.passed or bool(too_big)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
