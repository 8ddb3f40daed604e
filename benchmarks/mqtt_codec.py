"""Decode/encode rates of flowmq_wire.mqtt for the broker's hot path.

    python benchmarks/mqtt_codec.py [--seconds 1] [--payload 100] [--chunk 65536]

Decoding feeds a server-side MqttDecoder (CONNECT already seen) a stream of PUBLISH packets in
socket-read sized chunks (``--chunk`` bytes, so packets straddle chunk boundaries as they do on
a real connection), i.e. many packets per ``feed()`` call. Encoding builds one PUBLISH per call
through each encoding entry point. All figures are packets per second on one core.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from flowmq_wire.mqtt import (
    Connect,
    MqttDecoder,
    PreparedPublish,
    Puback,
    Publish,
    encode,
    encode_publish,
)

TOPIC = "bench/device0001/temperature"
BATCH = 1000


def rate(fn: Callable[[], int], seconds: float, rounds: int = 3) -> float:
    """Packets per second of ``fn`` (which returns how many packets it handled): the best of
    ``rounds`` runs of ``seconds`` each, since a shared 2-core machine is noisy."""
    fn()  # warm up
    best = 0.0
    for _ in range(rounds):
        count = 0
        start = time.perf_counter()
        deadline = start + seconds
        while True:
            count += fn()
            now = time.perf_counter()
            if now >= deadline:
                break
        best = max(best, count / (now - start))
    return best


def decode_bench(stream: bytes, per_stream: int, level: int, chunk: int) -> Callable[[], int]:
    chunks = [stream[i : i + chunk] for i in range(0, len(stream), chunk)]
    connect = encode(Connect("bench"), level)

    def run() -> int:
        decoder = MqttDecoder()
        decoder.feed(connect)
        feed = decoder.feed
        got = 0
        for c in chunks:
            got += len(feed(c))
        assert got == per_stream, got
        return got

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=0.5, help="per round; best of 3")
    parser.add_argument("--payload", type=int, default=100, help="payload bytes")
    parser.add_argument("--chunk", type=int, default=65536, help="bytes per feed() call")
    parser.add_argument("--packets", type=int, default=20000, help="packets per decoded stream")
    args = parser.parse_args()
    payload = bytes(range(256)) * (args.payload // 256 + 1)
    payload = payload[: args.payload]
    n = args.packets

    rows: list[tuple[str, float]] = []
    for level in (4, 5):
        for qos in (0, 1):
            pid = 1 if qos else None
            one = encode_publish(TOPIC, payload, qos, False, False, pid, None, level)
            stream = one * n
            rows.append(
                (
                    f"decode  v{level} QoS {qos} PUBLISH ({len(one)} B/pkt, {args.chunk} B feeds)",
                    rate(decode_bench(stream, n, level, args.chunk), args.seconds),
                )
            )
        puback = encode(Puback(1), level)
        rows.append(
            (
                f"decode  v{level} PUBACK",
                rate(decode_bench(puback * n, n, level, args.chunk), args.seconds),
            )
        )
    for level in (4, 5):
        for qos in (0, 1):
            pid = 1 if qos else None

            def enc_fast(qos: int = qos, pid: int | None = pid, level: int = level) -> int:
                ep = encode_publish
                for _ in range(BATCH):
                    ep(TOPIC, payload, qos, False, False, pid, None, level)
                return BATCH

            packet = Publish(TOPIC, payload, qos, False, False, pid)

            def enc_obj(packet: Publish = packet, level: int = level) -> int:
                for _ in range(BATCH):
                    encode(packet, level)
                return BATCH

            prepared = PreparedPublish(TOPIC, payload, None, level)

            def enc_prepared(prepared: PreparedPublish = prepared, qos: int = qos) -> int:
                e = prepared.encode
                for i in range(1, BATCH + 1):
                    e(qos, False, False, i if qos else None)
                return BATCH

            rows.append(
                (f"encode  v{level} QoS {qos} encode_publish()", rate(enc_fast, args.seconds))
            )
            rows.append(
                (f"encode  v{level} QoS {qos} encode(Publish)", rate(enc_obj, args.seconds))
            )
            rows.append(
                (
                    f"encode  v{level} QoS {qos} PreparedPublish.encode() (fan-out)",
                    rate(enc_prepared, args.seconds),
                )
            )
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value / 1e6:6.2f} M pkt/s  ({1e9 / value:6.0f} ns/pkt)")


if __name__ == "__main__":
    main()
