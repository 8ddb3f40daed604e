"""Queue store fixtures: a memory meta store, a local object store under ``tmp_path``, the
batcher and a ``QueueEngine`` on a clock the test controls, plus helpers that consume."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest

from flowmq_commit import GroupCommitBatcher
from flowmq_core.message import Message
from flowmq_meta import open_meta_store
from flowmq_objstore import open_object_store
from flowmq_queue import Delivery, QueueEngine, QueueOptions


class Clock:
    def __init__(self) -> None:
        self.offset = 0

    def __call__(self) -> int:
        import time

        return time.time_ns() // 1_000_000 + self.offset


class Env:
    def __init__(self, engine: QueueEngine, batcher: GroupCommitBatcher, clock: Clock) -> None:
        self.engine = engine
        self.batcher = batcher
        self.clock = clock
        self.options: dict[tuple[str, str], QueueOptions] = {}
        self.dead: list[tuple[str, Message]] = []

    def queue(self, name: str, **opts: Any) -> QueueOptions:
        o = QueueOptions(**opts)
        self.options[("default", name)] = o
        return o

    async def publish(self, name: str, *payloads: bytes, **fields: Any) -> list[int]:
        opts = self.options[("default", name)]
        futures = [
            self.engine.enqueue("default", name, Message(name, p, **fields), opts) for p in payloads
        ]
        return list(await asyncio.gather(*futures))

    def consumer(
        self, name: str, prefetch: int = 0, no_ack: bool = False, claim_ahead: bool = False
    ) -> Inbox:
        inbox = Inbox()
        inbox.consumer = self.engine.subscribe(
            "default",
            name,
            f"c{id(inbox)}",
            inbox.deliver,
            prefetch=prefetch,
            no_ack=no_ack,
            claim_ahead=claim_ahead,
        )
        return inbox

    @contextlib.contextmanager
    def counted_transactions(
        self, before: Callable[[int], Awaitable[None]] | None = None
    ) -> Iterator[list[int]]:
        """Counts every meta-store transaction (flushes and rounds alike) while open, in
        the list's one item; ``before(n)`` is awaited before the n-th one runs."""
        meta = self.batcher.meta
        inner = meta.transact
        count = [0]

        async def counting(fn: Any) -> Any:
            count[0] += 1
            if before is not None:
                await before(count[0])
            return await inner(fn)

        meta.transact = counting  # type: ignore[method-assign]
        try:
            yield count
        finally:
            meta.transact = inner  # type: ignore[method-assign]

    async def settle(self) -> None:
        """Let pending rounds run to completion."""
        for _ in range(20):
            await asyncio.sleep(0.01)
            if not self.engine.claims.pending():
                break
        await asyncio.sleep(0.02)


class Inbox:
    def __init__(self) -> None:
        self.items: list[Delivery] = []
        self.event = asyncio.Event()
        self.consumer: Any = None

    def deliver(self, deliveries: list[Delivery]) -> None:
        self.items.extend(deliveries)
        self.event.set()

    async def wait(self, n: int, timeout: float = 5.0) -> list[Delivery]:
        async with asyncio.timeout(timeout):
            while len(self.items) < n:
                self.event.clear()
                await self.event.wait()
        return self.items

    def payloads(self) -> list[bytes]:
        return [d.message.payload for d in self.items]


@pytest.fixture
async def env(tmp_path) -> AsyncIterator[Env]:
    meta = open_meta_store("memory://")
    objects = open_object_store((tmp_path / "objects").as_uri())
    batcher = GroupCommitBatcher(meta, objects, node_id="test", flush_interval=0.002)
    await batcher.start()
    clock = Clock()
    holder: dict[str, Env] = {}

    def dead_letter(ns: str, message: Message) -> list[Any]:
        holder["env"].dead.append((ns, message))
        return []

    engine = QueueEngine(
        meta,
        objects,
        batcher,
        options=lambda ns, q: holder["env"].options.get((ns, q)),
        dead_letter=dead_letter,
        lease_ms=2_000,
        clock=clock,
    )
    e = holder["env"] = Env(engine, batcher, clock)
    engine.start()
    yield e
    await engine.close()
    await batcher.close()
    await objects.close()
    await meta.close()
