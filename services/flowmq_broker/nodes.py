"""This broker's entry in the meta store's node table, kept fresh by a heartbeat.

Gossip says which nodes are alive; the table adds what a node tells about itself (roles,
ports, start time), and for nodes gossip does not know — and for a broker starting up, before
gossip has converged — a heartbeat older than ``STALE_AFTER_S`` means ``down``.
"""

from __future__ import annotations

import json
import time
from typing import Any

from flowmq_core.periodic import PeriodicTask
from flowmq_meta import keys
from flowmq_meta.api import MetaStore

HEARTBEAT_S = 5.0
STALE_AFTER_S = 3 * HEARTBEAT_S


class NodeRegistry:
    def __init__(self, store: MetaStore, node_id: str, info: dict[str, Any]) -> None:
        self.store = store
        self.node_id = node_id
        self.info = info
        self.started_at_ms = int(time.time() * 1000)
        self._heartbeat = PeriodicTask("node-heartbeat", HEARTBEAT_S, self.beat)

    async def beat(self) -> None:
        record = {
            **self.info,
            "node_id": self.node_id,
            "started_at_ms": self.started_at_ms,
            "heartbeat_ms": int(time.time() * 1000),
        }
        key = keys.NODES.pack(self.node_id)
        await self.store.transact(lambda tr: tr.set(key, json.dumps(record).encode()))

    async def start(self) -> None:
        await self.beat()
        self._heartbeat.start()

    async def stop(self) -> None:
        await self._heartbeat.stop()
        key = keys.NODES.pack(self.node_id)
        await self.store.transact(lambda tr: tr.clear(key))

    async def list(self) -> list[dict[str, Any]]:
        nodes = await read_node_table(self.store)
        for node in nodes:
            node["self"] = node["node_id"] == self.node_id
        return nodes


async def read_node_table(store: MetaStore) -> list[dict[str, Any]]:
    """Every node entry, with ``status`` up or down by the age of its heartbeat."""
    begin, end = keys.NODES.range()
    rows = await store.transact(lambda tr: tr.get_range(begin, end))
    now_ms = time.time() * 1000
    nodes = []
    for _, raw in rows:
        node = json.loads(raw)
        alive = now_ms - node["heartbeat_ms"] <= STALE_AFTER_S * 1000
        node["status"] = "up" if alive else "down"
        nodes.append(node)
    return nodes
