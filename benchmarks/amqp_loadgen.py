"""AMQP 0-9-1 load generator for ``amqp_bench.py``: raw asyncio clients, one per OS process.

pika manages a few thousand confirmed publishes per second, which would measure pika; these
clients pre-encode frames (the project's ``flowmq_wire.amqp`` codec) and write once per read:

- publisher: Confirm.Select, then persistent messages with at most ``window`` unconfirmed
  (a fixed ``rate`` if given); the first 8 body bytes are the send time (ns).
- consumer: Basic.Qos(prefetch), Basic.Consume with manual acks, one Basic.Ack per message;
  records the end-to-end latency of messages received after the warm-up mark.
"""

from __future__ import annotations

import asyncio
import collections
import struct
import time
from typing import Any

from pamqp import commands

from flowmq_wire.amqp import frames as fr
from flowmq_wire.amqp import properties
from flowmq_wire.amqp.methods import decode_method, encode_method

_TS = struct.Struct(">q")
PERSISTENT = properties.build({"delivery_mode": 2})


class Client(asyncio.Protocol):
    def __init__(self) -> None:
        self.reader = fr.FrameReader(1 << 20)
        self.transport: asyncio.Transport | None = None
        self.loop = asyncio.get_running_loop()
        self.waiter: asyncio.Future[Any] | None = None
        self.inbox: collections.deque[Any] = collections.deque()  # methods nobody awaited yet
        self.out: list[bytes] = []
        self.closed = self.loop.create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.write(fr.PROTOCOL_HEADER)  # type: ignore[attr-defined]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(exc)
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError("connection lost"))

    def data_received(self, data: bytes) -> None:
        for frame_type, _channel, payload in self.reader.feed(data):
            self.frame(frame_type, payload)
        if self.out:
            self.transport.write(b"".join(self.out))  # type: ignore[union-attr]
            self.out.clear()

    def frame(self, frame_type: int, payload: bytes) -> None:
        if frame_type == fr.FRAME_METHOD:
            method = decode_method(payload)
            if isinstance(method, commands.Connection.Close | commands.Channel.Close):
                raise SystemExit(f"broker closed: {method.reply_code} {method.reply_text}")
            if self.waiter is not None and not self.waiter.done():
                self.waiter.set_result(method)
            else:
                self.inbox.append(method)

    async def call(self, channel: int, method: Any) -> Any:
        self.transport.write(encode_method(channel, method))  # type: ignore[union-attr]
        return await self.wait()

    async def wait(self) -> Any:
        if self.inbox:
            return self.inbox.popleft()
        self.waiter = self.loop.create_future()
        return await asyncio.wait_for(self.waiter, 30)

    async def handshake(self) -> None:
        await self.wait()  # Start
        tune = await self.call(
            0, commands.Connection.StartOk(response="\0guest\0guest", mechanism="PLAIN")
        )
        self.transport.write(  # type: ignore[union-attr]
            encode_method(0, commands.Connection.TuneOk(tune.channel_max, tune.frame_max, 0))
        )
        await self.call(0, commands.Connection.Open(virtual_host="/"))
        await self.call(1, commands.Channel.Open())


class Publisher(Client):
    def __init__(self, queue: str, size: int, window: int, rate: float | None) -> None:
        super().__init__()
        self.window = window
        self.rate = rate
        self.outstanding = 0
        self.confirmed = 0
        self.sent = 0
        self.running = False
        self.nacked = 0
        publish = encode_method(1, commands.Basic.Publish(exchange="", routing_key=queue))
        header = struct.pack(">HHQ", 60, 0, size) + PERSISTENT
        self.prefix = publish + fr.frame(fr.FRAME_HEADER, 1, header)
        self.body_head = struct.pack(">BHI", fr.FRAME_BODY, 1, size)
        self.pad = b"x" * (size - 8)

    def message(self) -> bytes:
        return b"".join(
            (self.prefix, self.body_head, _TS.pack(time.time_ns()), self.pad, fr.FRAME_END_BYTE)
        )

    def frame(self, frame_type: int, payload: bytes) -> None:
        if self.running and frame_type == fr.FRAME_METHOD:
            index = fr.method_index(payload)
            if index in (fr.BASIC_ACK, fr.BASIC_NACK):
                tag, bits = fr.decode_tag_bits(payload)
                n = (tag - self.confirmed) if bits & 1 else 1
                self.confirmed = max(self.confirmed, tag) if bits & 1 else self.confirmed + 1
                self.outstanding -= n
                if index == fr.BASIC_NACK:
                    self.nacked += n
                if self.rate is None:
                    self.fill()
                return
        super().frame(frame_type, payload)

    def fill(self) -> None:
        n = self.window - self.outstanding
        if n > 0:
            self.out.extend(self.message() for _ in range(n))
            self.outstanding += n
            self.sent += n

    async def run(self, start: float, stop: float) -> dict[str, int]:
        await self.handshake()
        await self.call(1, commands.Confirm.Select())
        self.running = True
        await asyncio.sleep(max(0.0, start - time.time()))
        if self.rate is None:
            self.fill()
            self.transport.write(b"".join(self.out))  # type: ignore[union-attr]
            self.out.clear()
            await asyncio.sleep(max(0.0, stop - time.time()))
        else:
            tick = 0.001
            begun = time.time()
            while time.time() < stop:
                due = int((time.time() - begun) * self.rate) - self.sent
                room = self.window - self.outstanding
                n = min(due, room)
                if n > 0:
                    self.transport.write(  # type: ignore[union-attr]
                        b"".join(self.message() for _ in range(n))
                    )
                    self.outstanding += n
                    self.sent += n
                await asyncio.sleep(tick)
        self.running = False
        self.transport.close()  # type: ignore[union-attr]
        return {"sent": self.sent, "confirmed": self.confirmed, "nacked": self.nacked}


class Consumer(Client):
    def __init__(self, queue: str, prefetch: int, warmup_until: float) -> None:
        super().__init__()
        self.queue = queue
        self.prefetch = prefetch
        self.warmup_until_ns = int(warmup_until * 1e9)
        self.consuming = False
        self.expect_body = False
        self.tag = 0
        self.received = 0
        self.counted = 0
        self.latencies: list[int] = []

    def frame(self, frame_type: int, payload: bytes) -> None:
        if not self.consuming:
            super().frame(frame_type, payload)
            return
        if frame_type == fr.FRAME_METHOD:
            index = fr.method_index(payload)
            if index == fr.BASIC_DELIVER:
                n = payload[4]
                self.tag = struct.unpack_from(">Q", payload, 5 + n)[0]
                return
            super().frame(frame_type, payload)
        elif frame_type == fr.FRAME_BODY:
            now = time.time_ns()
            sent = _TS.unpack_from(payload)[0]
            self.received += 1
            if sent >= self.warmup_until_ns:
                self.counted += 1
                self.latencies.append(now - sent)
            self.out.append(
                fr.method_frame(1, b"\x00\x3c\x00\x50" + struct.pack(">QB", self.tag, 0))
            )

    async def run(self, stop: float) -> dict[str, Any]:
        await self.handshake()
        await self.call(1, commands.Basic.Qos(prefetch_count=self.prefetch))
        self.consuming = True
        self.transport.write(  # type: ignore[union-attr]
            encode_method(1, commands.Basic.Consume(queue=self.queue, consumer_tag="bench"))
        )
        await asyncio.sleep(max(0.0, stop - time.time()))
        self.transport.close()  # type: ignore[union-attr]
        return {"received": self.received, "counted": self.counted, "latencies": self.latencies}


async def _declare(port: int, queue: str) -> None:
    loop = asyncio.get_running_loop()
    _, client = await loop.create_connection(Client, "127.0.0.1", port)
    await client.handshake()
    await client.call(1, commands.Queue.Declare(queue=queue, durable=True))
    client.transport.close()  # type: ignore[union-attr]


def declare(port: int, queue: str) -> None:
    asyncio.run(_declare(port, queue))


def _run(coro_factory: Any) -> Any:
    try:
        import uvloop

        return uvloop.run(coro_factory())
    except ImportError:
        return asyncio.run(coro_factory())


def publisher_proc(
    port: int,
    queue: str,
    size: int,
    window: int,
    rate: float | None,
    start: float,
    stop: float,
    results: Any,
) -> None:
    async def main() -> dict[str, int]:
        loop = asyncio.get_running_loop()
        _, client = await loop.create_connection(
            lambda: Publisher(queue, size, window, rate), "127.0.0.1", port
        )
        return await client.run(start, stop)

    results.put(("pub", _run(main)))


def consumer_proc(
    port: int, queue: str, prefetch: int, warmup_until: float, stop: float, results: Any
) -> None:
    async def main() -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        _, client = await loop.create_connection(
            lambda: Consumer(queue, prefetch, warmup_until), "127.0.0.1", port
        )
        return await client.run(stop)

    results.put(("con", _run(main)))
