"""What TLS costs: MQTT QoS 0 1→1 with TLS off and on, FlowMQ-py and Mosquitto, in one run.

    python benchmarks/tls_bench.py [--duration 5] [--repeat 3] [--msg-size 100] [--json out.json]

Makes a CA and a server certificate with the ``openssl`` command (as docs/security.md
does), then starts one ``flowmq serve`` with ``--tls-cert``/``--tls-key`` (this interpreter,
fresh data dir) and one Mosquitto configured as its users do — its plain ``listener`` and a
``listener`` with ``cafile``/``certfile``/``keyfile`` — so each broker serves both ports from
one process. The ``qos0`` load of ``mqtt_bench.py`` (its brokers, load generator and
measurement, unchanged) runs against the four listeners in turn, ``--repeat`` rounds, so
machine noise hits all alike; the median of the rounds is reported with the ratios TLS/plain
per broker and FlowMQ/Mosquitto per transport. The load generator's TLS clients are
``ssl``-wrapped sockets trusting the CA (TLS 1.3, the default suite of both ends).

The machine's interpreter speed is measured first (a pure-Python loop of dict and bytes
work, best of 5) and printed with the results: FlowMQ-py's figures scale with it, Mosquitto's
do not, so a FlowMQ/Mosquitto ratio is only comparable between machines of similar speed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import mqtt_bench as mb  # noqa: E402
from machine import cpu_model, interpreter_speed  # noqa: E402


def make_certificates(directory: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for 127.0.0.1/localhost: (ca, cert, key)."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
        "-days", "2", "-subj", "/CN=tls_bench CA",
    )  # fmt: skip
    openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
        "-subj", "/CN=localhost",
    )  # fmt: skip
    (directory / "server.ext").write_text(
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"
    )
    openssl(
        "x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "2", "-extfile", "server.ext", "-out", "server.crt",
    )  # fmt: skip
    return directory / "ca.crt", directory / "server.crt", directory / "server.key"


class Listener(mb.Broker):
    """One port of a running broker, plain or TLS: what ``mqtt_bench.run_load`` measures."""

    def __init__(self, broker: mb.Broker, key: str, port: int, cafile: str = "") -> None:
        super().__init__()
        self.broker = broker
        self.key = key  # in topics and client ids: unique per listener
        self.label = f"{broker.label} {'TLS' if cafile else 'plain'}"
        self.cafile = cafile
        self.procs, self.logs, self.ports = broker.procs, broker.logs, [port]

    def dropped(self) -> float | None:
        return self.broker.dropped()

    def problems(self) -> list[str]:
        return self.broker.problems()


def _wait_listening(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listens on {port}") from None
            time.sleep(0.05)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=5.0, help="seconds per run (default 5)")
    ap.add_argument("--repeat", type=int, default=3, help="rounds over the 4 listeners")
    ap.add_argument("--msg-size", type=int, default=100, help="payload bytes (default 100)")
    ap.add_argument("--mosquitto", default=mb.MOSQUITTO, help="mosquitto binary")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (logs, keys, data)")
    ap.add_argument("--json", help="also write the results to this file")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    load_args = mb.parse_args(
        ["--loads", "qos0", "--duration", str(args.duration), "--msg-size", str(args.msg_size)]
    )
    load = mb.make_loads(load_args)["qos0"]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    speed = interpreter_speed()
    workdir = Path(tempfile.mkdtemp(prefix="tls-bench-"))
    brokers: list[mb.Broker] = []
    workers: list = []
    rates: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}  # broker CPU, share of one core
    loadgen_cpu: dict[str, list[float]] = {}  # the busier of publisher and subscriber
    notes: dict[str, list[str]] = {}
    try:
        ca, cert, key = make_certificates(workdir)
        flowmq = mb.FlowMQ(workdir, 1, ("--tls-cert", str(cert), "--tls-key", str(key)))
        brokers.append(flowmq)
        tls_port = mb._free_port()
        mosquitto = mb.Mosquitto(
            workdir,
            args.mosquitto,
            load_args.mosquitto_max_queued,
            [
                f"listener {tls_port} 127.0.0.1",
                f"cafile {ca}",
                f"certfile {cert}",
                f"keyfile {key}",
            ],
        )
        brokers.append(mosquitto)
        _wait_listening(tls_port)
        listeners = [
            Listener(flowmq, "flowmq", flowmq.ports[0]),
            Listener(flowmq, "flowmq-tls", flowmq.ports_json[0]["mqtt_tls"], str(ca)),
            Listener(mosquitto, "mosquitto", mosquitto.ports[0]),
            Listener(mosquitto, "mosquitto-tls", tls_port, str(ca)),
        ]
        print(
            f"interpreter speed {speed:.1f} M loops/s · {flowmq.version} + {mosquitto.version} · "
            f"{ssl.OPENSSL_VERSION} · workdir {workdir}",
            flush=True,
        )
        tag = uuid.uuid4().hex[:4]
        for round_ in range(args.repeat):
            for listener in listeners:
                print(f"  round {round_ + 1}: {listener.label} …", end=" ", flush=True)
                r = mb.run_load(listener, load, load_args, f"{tag}{round_}", workers)
                rates.setdefault(listener.key, []).append(r["rate"])
                cpu.setdefault(listener.key, []).append(r["broker_cpu"])
                loadgen_cpu.setdefault(listener.key, []).append(max(r["pub_cpu"], r["sub_cpu"]))
                problems = list(dict.fromkeys(r["errors"]))
                if r["lost"]:
                    problems.append(f"{r['lost']:,} lost")
                notes.setdefault(listener.key, []).extend(problems)
                print(
                    f"{mb._fmt_rate(r['rate'])} msgs/s, broker CPU {r['broker_cpu']:.0%}, "
                    f"busiest load generator {max(r['pub_cpu'], r['sub_cpu']):.0%}"
                )
    finally:
        for p in workers:
            if p.is_alive():
                p.terminate()
        for b in brokers:
            b.stop()
        if not args.keep:
            subprocess.run(["rm", "-rf", str(workdir)], check=False)
    median = {k: statistics.median(v) for k, v in rates.items()}
    report = {
        "interpreter_mloops_per_s": round(speed, 2),
        "python": platform.python_version(),
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "openssl": ssl.OPENSSL_VERSION,
        "duration_s": args.duration,
        "repeat": args.repeat,
        "msg_size": args.msg_size,
        "rates": rates,
        "broker_cpu": cpu,
        "loadgen_cpu": loadgen_cpu,
        "median_msgs_per_s": median,
        "ratios": {
            "flowmq_tls_over_plain": median["flowmq-tls"] / median["flowmq"],
            "mosquitto_tls_over_plain": median["mosquitto-tls"] / median["mosquitto"],
            "flowmq_over_mosquitto_plain": median["flowmq"] / median["mosquitto"],
            "flowmq_over_mosquitto_tls": median["flowmq-tls"] / median["mosquitto-tls"],
        },
        "notes": {k: sorted(set(v)) for k, v in notes.items() if v},
    }
    print_report(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


def print_report(report: dict) -> None:
    m, ratio = report["median_msgs_per_s"], report["ratios"]
    print()
    print(
        f"MQTT 3.1.1 QoS 0 1→1 · {report['msg_size']}-byte payloads · "
        f"{report['duration_s']:g} s × {report['repeat']} rounds (median) · loopback · "
        f"{report['cpus']} CPUs ({report['cpu']})"
    )
    print(
        f"Python {report['python']}: interpreter speed {report['interpreter_mloops_per_s']} M "
        f"loops/s · {report['openssl']}"
    )
    print()
    row = "{:<18} {:>12} {:>12} {:>10}"
    print(row.format("msgs/s", "plain", "TLS", "TLS/plain"))
    print(
        row.format(
            "FlowMQ-py",
            mb._fmt_rate(m["flowmq"]),
            mb._fmt_rate(m["flowmq-tls"]),
            f"{ratio['flowmq_tls_over_plain']:.2f}",
        )
    )
    print(
        row.format(
            "Mosquitto",
            mb._fmt_rate(m["mosquitto"]),
            mb._fmt_rate(m["mosquitto-tls"]),
            f"{ratio['mosquitto_tls_over_plain']:.2f}",
        )
    )
    print(
        row.format(
            "FlowMQ/Mosquitto",
            f"{ratio['flowmq_over_mosquitto_plain']:.2f}",
            f"{ratio['flowmq_over_mosquitto_tls']:.2f}",
            "",
        )
    )
    for key, problems in report["notes"].items():
        print(f"note {key}: {'; '.join(problems)}")


if __name__ == "__main__":
    sys.exit(main())
