"""Memory of idle MQTT connections: RSS of `flowmq serve` idle, then with N connected clients.

    python benchmarks/mqtt_idle_memory.py --connections 10000

Each client is a raw socket that sends CONNECT (3.1.1, keep alive 600) and one SUBSCRIBE, then
stays silent. Needs `ulimit -n` above N + a few hundred.
"""

from __future__ import annotations

import argparse
import resource
import socket
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flowmq_wire.mqtt.codec import MqttDecoder, encode  # noqa: E402
from flowmq_wire.mqtt.packets import Connect, Subscribe, SubscriptionOptions  # noqa: E402
from tests.fixtures.broker_process import start_broker  # noqa: E402


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--connections", type=int, default=10_000)
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, args.connections + 1000), hard))

    with tempfile.TemporaryDirectory() as tmp:
        # All its clients come from 127.0.0.1: lift the per-address limit above their number.
        per_address = str(args.connections + 1000)
        broker = start_broker(
            Path(tmp) / "data",
            "--roles",
            "mqtt,admin",
            "--max-connections-per-address",
            per_address,
            "--processes",
            "1",
        )
        try:
            port = broker.ports["mqtt"]
            time.sleep(1.0)  # let start-up garbage settle before the idle reading
            idle = rss_kib(broker.proc.pid)
            sockets = []
            for i in range(args.connections):
                s = socket.create_connection(("127.0.0.1", port))
                s.sendall(
                    encode(Connect(client_id=f"idle-{i}", keep_alive=600), 4)
                    + encode(Subscribe(1, [(f"idle/{i}", SubscriptionOptions(qos=1))]), 4)
                )
                sockets.append(s)
            for s in sockets:  # CONNACK + SUBACK: the broker has set every session up
                decoder = MqttDecoder(server=False, protocol_level=4)
                got = []
                while len(got) < 2:
                    got += decoder.feed(s.recv(4096))
            time.sleep(1.0)  # deliberate: let set-up garbage settle before the loaded reading
            loaded = rss_kib(broker.proc.pid)
            per_connection = (loaded - idle) * 1024 / args.connections
            print(f"idle RSS {idle / 1024:.1f} MiB; with {args.connections} connections "
                  f"{loaded / 1024:.1f} MiB; {per_connection / 1024:.1f} KiB per connection")  # fmt: skip
            for s in sockets:
                s.close()
        finally:
            broker.stop()


if __name__ == "__main__":
    main()
