"""This broker's entry in the meta store's node table, kept fresh by a heartbeat.

Gossip says which nodes are alive; the table adds what a node tells about itself (roles,
ports, start time), and for nodes gossip does not know — and for a broker starting up, before
gossip has converged — a heartbeat older than ``STALE_AFTER_S`` means ``down``.

A broker killed (SIGKILL, OOM, power) leaves its entry behind, fresh for up to
``STALE_AFTER_S``.  Restarted on the same data dir under another node id (one derived from an
HTTP port of 0), it would count its former self as a live peer for that long: Kafka clients
were told that ghost led some partitions and coordinated some groups, and timed out on its
closed port.  So the first heartbeat of a process removes the entry of the data dir's
previous process (``former_id``, from its ``ports.json``) in the same transaction.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from flowmq_core.periodic import PeriodicTask
from flowmq_meta import keys
from flowmq_meta.api import MetaStore, Transaction

log = logging.getLogger(__name__)

HEARTBEAT_S = 5.0
STALE_AFTER_S = 3 * HEARTBEAT_S


class NodeRegistry:
    def __init__(
        self, store: MetaStore, node_id: str, info: dict[str, Any], former_id: str | None = None
    ) -> None:
        self.store = store
        self.node_id = node_id
        self.info = info
        # The node id of the previous process on this data dir: it cannot be running (it
        # would share our data dir), so ``start`` removes whatever entry it left.
        self.former_id = former_id if former_id != node_id else None
        self.started_at_ms = int(time.time() * 1000)
        self._heartbeat = PeriodicTask("node-heartbeat", HEARTBEAT_S, self.beat)

    def _write_record(self, tr: Transaction) -> None:
        record = {
            **self.info,
            "node_id": self.node_id,
            "started_at_ms": self.started_at_ms,
            "heartbeat_ms": int(time.time() * 1000),
        }
        tr.set(keys.NODES.pack(self.node_id), json.dumps(record).encode())

    async def beat(self) -> None:
        await self.store.transact(self._write_record)

    async def start(self) -> None:
        former = self.former_id

        def first_beat(tr: Transaction) -> bool:
            self._write_record(tr)
            if former is None:
                return False
            key = keys.NODES.pack(former)
            left = tr.get(key) is not None
            tr.clear(key)
            return left

        if await self.store.transact(first_beat):
            log.info(
                "node table: removed the entry of %s, this data dir's previous process "
                "(it did not stop cleanly)",
                former,
            )
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
