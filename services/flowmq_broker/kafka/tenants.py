"""Kafka tenants (DESIGN.md §12 "namespaces are tenants"): what a Kafka connection sees is
one namespace's — its topics (the namespace's Streams), its consumer groups and their
committed offsets, its idempotent producers.

A connection starts in ``default`` (anonymous clients stay there) and moves, once, to its
user's namespace when it authenticates (SASL or a certificate CN).  Handlers read the
connection's ``KafkaTenant`` from the request context: the namespace is resolved once per
connection, never per request or per record.

Invariants:
- one ``KafkaTenant`` per namespace at a time, so topic auto-creation is shared by all the
  connections of a namespace and a group (namespace, group id) has exactly one in-memory
  state on its coordinating broker;
- tenants are made lazily and dropped when idle (no connection, no group in their
  coordinator), ``default`` excepted: their number is bounded by the namespaces in use;
- a group is (namespace, group id): two namespaces may use the same group id, each with its
  own members and committed offsets.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable

from flowmq_broker.kafka.coordinator import GroupCoordinator
from flowmq_broker.kafka.topics import TopicManager
from flowmq_broker.services import BrokerServices
from flowmq_meta.catalog import DEFAULT_NAMESPACE
from flowmq_meta.group_offsets import GroupOffsetStore

# Called with (namespace, topic name) after a topic was deleted: forget per-topic state.
TopicDeleted = Callable[[str, str], Awaitable[None]]


@dataclasses.dataclass(eq=False)
class KafkaTenant:
    """One namespace as the Kafka listener serves it."""

    namespace: str
    topics: TopicManager
    coordinator: GroupCoordinator
    connections: int = 0  # live connections in this namespace (for dropping idle tenants)


class Tenants:
    """The listener's tenants by namespace, made on first use."""

    def __init__(
        self,
        services: BrokerServices,
        on_topic_deleted: TopicDeleted,
        offsets: GroupOffsetStore | None = None,
    ) -> None:
        self._services = services
        self._on_topic_deleted = on_topic_deleted
        # Where the group coordinators store generations (None: in memory only).
        self._offsets = offsets
        self._by_namespace: dict[str, KafkaTenant] = {}
        self.default = self.get(DEFAULT_NAMESPACE)

    def get(self, namespace: str) -> KafkaTenant:
        """The tenant of ``namespace``, made if this broker serves it for the first time."""
        tenant = self._by_namespace.get(namespace)
        if tenant is None:
            topics = TopicManager(self._services, namespace)

            async def forget(name: str) -> None:
                await self._on_topic_deleted(namespace, name)

            topics.on_deleted.append(forget)
            store = None
            if self._offsets is not None:
                offsets = self._offsets

                def store(group: str, current: int) -> Awaitable[int]:
                    return offsets.next_generation(namespace, group, current)

            tenant = KafkaTenant(namespace, topics, GroupCoordinator(store_generation=store))
            self._by_namespace[namespace] = tenant
        return tenant

    def find(self, namespace: str) -> KafkaTenant | None:
        """The tenant of ``namespace`` if this broker serves it now (no tenant is made)."""
        return self._by_namespace.get(namespace)

    def all(self) -> list[KafkaTenant]:
        return list(self._by_namespace.values())

    def attach(self, tenant: KafkaTenant) -> None:
        tenant.connections += 1

    def detach(self, tenant: KafkaTenant) -> None:
        """A connection left ``tenant``: drop it if nothing else keeps it."""
        tenant.connections -= 1
        if (
            tenant.connections <= 0
            and tenant is not self.default
            and not tenant.coordinator.groups
            and self._by_namespace.get(tenant.namespace) is tenant
        ):
            del self._by_namespace[tenant.namespace]

    def shutdown(self) -> None:
        for tenant in self._by_namespace.values():
            tenant.coordinator.shutdown()


__all__ = ["KafkaTenant", "Tenants", "TopicDeleted"]
