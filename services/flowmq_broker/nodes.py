"""This broker's entry in the meta store's node table, kept fresh by a heartbeat.

Gossip says which nodes are alive; the table adds what a node tells about itself (roles,
ports, start time), and for nodes gossip does not know — and for a broker starting up, before
gossip has converged — a heartbeat older than ``STALE_AFTER_S`` means ``down``.

A broker killed (SIGKILL, OOM, power) leaves its entry behind, fresh for up to
``STALE_AFTER_S``.  Restarted on the same data dir under another node id (one derived from an
HTTP port of 0), it would count its former self as a live peer for that long: Kafka clients
were told that ghost led some partitions and coordinated some groups, and timed out on its
closed port.  So the first heartbeat of a process removes the entry of the data dir's
previous process (``former_id``) in the same transaction.

That process is known from ``DataDirLock``: the broker running on a data dir holds a lock
on a file in it and writes its node id there; the kernel releases the lock when the process
dies, however it dies.  A broker that gets the lock therefore knows the id written there
belongs to a process that is gone.  One that does not get it shares the data dir with a
running broker (tests start two so, on one meta store) and removes nothing.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from flowmq_core.periodic import PeriodicTask
from flowmq_meta import keys
from flowmq_meta.api import MetaStore, Transaction

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

HEARTBEAT_S = 5.0
STALE_AFTER_S = 3 * HEARTBEAT_S
LOCK_FILE = "node.lock"
_MAX_NODE_ID_BYTES = 4096


class DataDirLock:
    """The running broker's claim on its data dir (``flock`` on ``LOCK_FILE``, held for
    the life of the process), with the node id of its holder in the file."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / LOCK_FILE
        self._fd: int | None = None
        # The node id the previous holder wrote, once we hold the lock: that process is gone.
        self.former_id: str | None = None

    def acquire(self) -> bool:
        """Take the lock if no running process holds it (never waits); True if taken."""
        if fcntl is None:  # no flock (not POSIX): the former process is never known
            return False
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # a running broker shares this data dir
            os.close(fd)
            return False
        self._fd = fd
        former = os.read(fd, _MAX_NODE_ID_BYTES).decode(errors="replace").strip()
        self.former_id = former or None
        return True

    def write(self, node_id: str) -> None:
        """Name the holder (this process's node id), for the next holder to find."""
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, node_id.encode(), 0)

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the last descriptor releases the flock


class NodeRegistry:
    def __init__(
        self, store: MetaStore, node_id: str, info: dict[str, Any], former_id: str | None = None
    ) -> None:
        self.store = store
        self.node_id = node_id
        self.info = info
        # The node id of the previous process on this data dir, known to be gone
        # (``DataDirLock``): ``start`` removes whatever entry it left.
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
