"""A persistent session reconnecting to a large stored backlog: the broker's RSS and the
CONNACK latency (issue #11).

    python benchmarks/mqtt_backlog_reconnect.py --messages 100000

A v5 subscriber (session expiry 600 s) subscribes at QoS 1 and leaves; a publisher stores
``--messages`` QoS 1 messages of ``--payload`` bytes for it (pipelined, ``BURST`` before
their PUBACKs are read). Then the subscriber reconnects (receive maximum
``--receive-maximum``) and takes every message, acknowledging each as it is read. Printed:
the broker's RSS before the reconnect, its peak from the CONNECT to the last message
(sampled every 10 ms from /proc), the time to CONNACK and to the last message. Compare two
trees by running this file with each one's ``PYTHONPATH`` (the broker process inherits it).
"""

from __future__ import annotations

import argparse
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from machine import cpu_model, interpreter_speed  # noqa: E402

from flowmq_wire.mqtt.codec import MqttDecoder, encode  # noqa: E402
from flowmq_wire.mqtt.packets import (  # noqa: E402
    Connack,
    Connect,
    Disconnect,
    Puback,
    Publish,
    Suback,
    Subscribe,
    SubscriptionOptions,
)
from tests.fixtures.broker_process import start_broker  # noqa: E402

BURST = 1000
TOPIC = "backlog/bench"
AWAY = {"session_expiry_interval": 600}


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


class Client:
    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.decoder = MqttDecoder(server=False, protocol_level=5, max_packet_size=None)
        self.pending: list = []

    def send(self, *packets) -> None:
        self.sock.sendall(b"".join(encode(p, 5) for p in packets))

    def read(self) -> list:
        """What arrived (at least one packet)."""
        while not self.pending:
            data = self.sock.recv(1 << 20)
            if not data:
                raise ConnectionError("closed by the broker")
            self.pending = self.decoder.feed(data)
        out, self.pending = self.pending, []
        return out

    def expect(self, cls: type):
        packets = self.read()
        assert len(packets) == 1 and isinstance(packets[0], cls), packets
        return packets[0]


class RssSampler(threading.Thread):
    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.peak = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.peak = max(self.peak, rss_kib(self.pid))
            time.sleep(0.01)


def store_backlog(port: int, count: int, payload: bytes) -> None:
    sub = Client(port)
    sub.send(Connect("backlog-sub", False, 600, properties=AWAY, protocol_level=5))
    sub.expect(Connack)
    sub.send(Subscribe(1, [(TOPIC, SubscriptionOptions(qos=1))]))
    sub.expect(Suback)
    sub.send(Disconnect())
    sub.sock.close()
    time.sleep(0.5)  # deliberate: the broker notices the subscriber gone before publishing
    pub = Client(port)
    pub.send(Connect("backlog-pub", True, 600, protocol_level=5))
    pub.expect(Connack)
    sent = 0
    while sent < count:
        burst = min(BURST, count - sent)
        pub.send(*(Publish(TOPIC, payload, 1, packet_id=i + 1) for i in range(burst)))
        acked = 0
        while acked < burst:
            for p in pub.read():
                assert isinstance(p, Puback) and p.reason_code == 0, p
                acked += 1
        sent += burst
    pub.send(Disconnect())
    pub.sock.close()


def reconnect(port: int, count: int, receive_maximum: int) -> tuple[float, float]:
    """(seconds to CONNACK, seconds to the last message)."""
    sub = Client(port)
    began = time.perf_counter()
    properties = {**AWAY, "receive_maximum": receive_maximum}
    sub.send(Connect("backlog-sub", False, 600, properties=properties, protocol_level=5))
    got = 0
    connack = None
    while got < count:
        acks = []
        for p in sub.read():
            if isinstance(p, Connack):
                assert p.session_present
                connack = time.perf_counter() - began
            elif isinstance(p, Publish):
                acks.append(Puback(p.packet_id))
                got += 1
        if acks:
            sub.send(*acks)
    done = time.perf_counter() - began
    sub.send(Disconnect())
    sub.sock.close()
    assert connack is not None
    return connack, done


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--payload", type=int, default=100)
    parser.add_argument("--receive-maximum", type=int, default=65535)
    args = parser.parse_args()
    print(f"{cpu_model()}; interpreter speed {interpreter_speed():.1f} M it/s")
    with tempfile.TemporaryDirectory() as tmp:
        broker = start_broker(Path(tmp) / "data", "--roles", "mqtt,admin", "--processes", "1")
        try:
            port = broker.ports["mqtt"]
            pid = broker.proc.pid
            store_backlog(port, args.messages, b"x" * args.payload)
            time.sleep(2.0)  # deliberate: the copies' purges and flushes settle
            before = rss_kib(pid)
            sampler = RssSampler(pid)
            sampler.start()
            connack, done = reconnect(port, args.messages, args.receive_maximum)
            sampler.stop.set()
            sampler.join()
            after = rss_kib(pid)
            print(
                f"{args.messages} stored QoS 1 messages of {args.payload} B, receive maximum "
                f"{args.receive_maximum}: RSS before {before / 1024:.1f} MiB, peak "
                f"{sampler.peak / 1024:.1f} MiB (+{(sampler.peak - before) / 1024:.1f} MiB), "
                f"after {after / 1024:.1f} MiB; CONNACK {connack * 1000:.0f} ms; all "
                f"{done:.2f} s"
            )
        finally:
            broker.stop()


if __name__ == "__main__":
    main()
