"""The live brokers Kafka clients see, and which of them "leads" a partition or coordinates
a group (DESIGN.md §6).

Any broker can append to any partition, so a leader is only a client-side hint: partitions
and groups are spread over the live brokers by rendezvous hashing — every broker computes
the same owner from the same node table, and a node joining or leaving moves only the keys
it gains or held.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from flowmq_core.config import is_loopback
from flowmq_core.periodic import PeriodicTask

log = logging.getLogger(__name__)

REFRESH_S = 2.0


def kafka_node_id(node_id: str) -> int:
    """Kafka node ids are int32; FlowMQ's are names.  A stable non-negative hash of the
    name lets every broker number every other one the same way without coordination."""
    return zlib.crc32(node_id.encode()) & 0x7FFFFFFF


@dataclass(frozen=True)
class KafkaNode:
    name: str
    id: int
    host: str | None  # None: the address this client reached us on
    port: int
    tls_port: int = 0  # its SSL/SASL_SSL listener (kafka_tls); 0: none

    def port_for(self, tls: bool) -> int:
        """The port a client reaches this node on with its own security protocol: clients
        connect to advertised brokers the way they reached the bootstrap one.  A node
        without a TLS listener is advertised with its plain port (a TLS client then fails
        to reach it: give every broker of a cluster the same TLS settings)."""
        return self.tls_port if tls and self.tls_port else self.port


def _advertised(node: dict[str, Any]) -> str | None:
    """The host clients are told for another broker: the one its cluster plane is reached at,
    except a loopback one.  A peer reached over loopback runs on this host (host mode's
    processes, ``flowmq cluster``), so a client reaches it where it reached us (None), which
    works from other hosts too; 127.0.0.1 would send them to themselves.  A broker's own
    ``advertised_host`` wins over both."""
    if node.get("advertised_host"):
        return str(node["advertised_host"])
    host = node.get("host")
    return None if host is None or is_loopback(host) else host


def _score(key: bytes, node: KafkaNode) -> bytes:
    return hashlib.blake2b(key + b"\0" + node.name.encode(), digest_size=8).digest()


class ClusterView:
    def __init__(
        self,
        node_id: str,
        node_table: Callable[[], Awaitable[list[dict[str, Any]]]],
        *,
        advertised_host: str = "",
        refresh_s: float = REFRESH_S,
    ) -> None:
        self.node_id = node_id
        self.advertised_host = advertised_host or None
        # The cluster nodes API's rows: live brokers and their ports.
        self.node_table = node_table
        self.local = KafkaNode(node_id, kafka_node_id(node_id), None, 0)
        self.nodes: list[KafkaNode] = [self.local]
        self._owners: dict[bytes, KafkaNode] = {}
        self._refresh = PeriodicTask("kafka-cluster-view", refresh_s, self.refresh)

    def start(self, port: int) -> None:
        self.local = KafkaNode(
            self.node_id, kafka_node_id(self.node_id), self.advertised_host, port
        )
        self._set([self.local])
        self._refresh.start()

    def set_tls_port(self, port: int) -> None:
        """This broker's TLS listener is up on ``port`` (after ``start``)."""
        self.local = dataclasses.replace(self.local, tls_port=port)
        self._set([self.local if n.name == self.local.name else n for n in self.nodes])

    async def stop(self) -> None:
        await self._refresh.stop()

    def _set(self, nodes: list[KafkaNode]) -> None:
        nodes.sort(key=lambda n: n.id)
        if nodes != self.nodes:
            self.nodes = nodes
            self._owners.clear()

    async def refresh(self) -> None:
        found = [self.local]
        for node in await self.node_table():
            port = node.get("ports", {}).get("kafka")
            if node.get("self") or node.get("status") != "up" or not port:
                continue
            name = node["node_id"]
            tls_port = int(node["ports"].get("kafka_tls") or 0)
            found.append(
                KafkaNode(name, kafka_node_id(name), _advertised(node), int(port), tls_port)
            )
        self._set(found)

    def owner(self, key: str) -> KafkaNode:
        """The live broker that ``key`` (a partition, a group) maps to."""
        raw = key.encode()
        node = self._owners.get(raw)
        if node is None:
            if len(self.nodes) == 1:
                node = self.nodes[0]
            else:
                node = max(self.nodes, key=lambda n: _score(raw, n))
            if len(self._owners) > 100_000:
                self._owners.clear()
            self._owners[raw] = node
        return node

    def partition_leader(self, topic: str, partition: int) -> KafkaNode:
        return self.owner(f"p\0{topic}\0{partition}")

    def coordinator(self, group: str) -> KafkaNode:
        return self.owner(f"g\0{group}")

    def is_local(self, node: KafkaNode) -> bool:
        return node.name == self.local.name


__all__ = ["ClusterView", "KafkaNode", "kafka_node_id"]
