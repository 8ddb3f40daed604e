"""Harness for gossip tests: real UDP on 127.0.0.1 with a fast SWIM configuration."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pytest

from flowmq_cluster import ClusterSecret, Gossip, GossipConfig, Status

# 10x faster than the memberlist LAN defaults
FAST = GossipConfig(
    gossip_interval=0.02,
    probe_interval=0.1,
    probe_timeout=0.05,
    push_pull_interval=1.0,
    gossip_to_dead_time=1.0,
    leave_timeout=0.1,
)


class Harness:
    config = FAST

    def __init__(self) -> None:
        self.nodes: dict[str, Gossip] = {}
        self.changed = asyncio.Event()
        # (observer, node, old, new)
        self.changes: list[tuple[str, str, Status | None, Status]] = []
        # observer -> [(kind, payload, hops, origin)]
        self.events: dict[str, list[tuple[str, dict[str, Any], int, str]]] = defaultdict(list)

    async def start(
        self,
        node_id: str,
        seeds: list[Any] | None = None,
        config: GossipConfig = FAST,
        meta: dict[str, Any] | None = None,
        secret: ClusterSecret | None = None,
    ) -> Gossip:
        g = Gossip(
            node_id,
            seeds=seeds or [],
            meta=meta or {"node": node_id},
            config=config,
            secret=secret,
        )

        def on_change(member: Any, old: Status | None, new: Status) -> None:
            self.changes.append((node_id, member.node_id, old, new))
            self.changed.set()

        def on_event(kind: str, payload: dict[str, Any], hops: int, origin: str) -> None:
            self.events[node_id].append((kind, payload, hops, origin))
            self.changed.set()

        g.on_member_change = on_change
        g.on_event = on_event
        self.nodes[node_id] = g
        await g.start()
        return g

    async def cluster(self, n: int, config: GossipConfig = FAST) -> list[Gossip]:
        first = await self.start("n0", config=config)
        rest = [
            await self.start(f"n{i}", seeds=[first.address], config=config) for i in range(1, n)
        ]
        nodes = [first, *rest]
        await self.wait(lambda: self.converged(nodes), 5)
        return nodes

    async def wait(self, predicate: Callable[[], bool], timeout: float) -> float:
        """Wait until predicate() holds: woken by callbacks, re-checked at least every 20 ms."""
        start = time.monotonic()
        deadline = start + timeout
        while not predicate():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"condition not met within {timeout} s")
            self.changed.clear()
            try:
                await asyncio.wait_for(self.changed.wait(), min(remaining, 0.02))
            except TimeoutError:
                pass
        return time.monotonic() - start

    @staticmethod
    def converged(nodes: list[Gossip]) -> bool:
        ids = {g.node_id for g in nodes}
        return all(
            {m.node_id for m in g.members() if m.status == Status.ALIVE} == ids for g in nodes
        )

    @staticmethod
    def status(observer: Gossip, node_id: str) -> Status | None:
        m = observer.member(node_id)
        return m.status if m else None

    async def stop_all(self) -> None:
        for g in self.nodes.values():
            await g.stop(leave=False)


@pytest.fixture
async def harness():
    h = Harness()
    yield h
    await h.stop_all()
