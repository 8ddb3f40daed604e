"""Destination wiring: the per-namespace routing tries and the destination-type registry.

The trie holds ``Binding`` values (type, namespace, name); what a binding does with a message
is up to its ``DestinationType``, looked up by type name, so neither this module nor the
adapters branch on the type (DESIGN.md §5).
"""

from __future__ import annotations

import abc
import asyncio
import dataclasses
import functools
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol

import flowmq_metrics as metrics
from flowmq_core.errors import FlowMQError
from flowmq_core.message import Message
from flowmq_core.periodic import PeriodicTask
from flowmq_core.trie import RouteTrie
from flowmq_meta.catalog import Catalog, Destination

log = logging.getLogger(__name__)


class DestinationUnavailable(FlowMQError):
    """A message matched a destination whose storage this broker cannot serve."""

    code = "destination_unavailable"


@dataclasses.dataclass(frozen=True, slots=True)
class Binding:
    """What the trie stores: a reference to a destination, cheap to hash and compare."""

    type: str
    namespace: str
    name: str


class DestinationType(abc.ABC):
    """One kind of destination (Stream, Queue, Subscription …) behind one small interface."""

    name: str
    durable: bool
    # Delivered to one member cluster-wide (shared subscriptions), not on every node.
    one_member: bool = False

    @abc.abstractmethod
    def accept(self, binding: Binding, message: Message) -> Awaitable[None] | None:
        """Take a routed message.  Returns None when done, or an awaitable that completes
        when the message is durable (publishers acknowledge only then)."""

    def accept_from(
        self, binding: Binding, message: Message, source: object
    ) -> Awaitable[None] | None:
        """``accept``, told where the message comes from (the publishing connection, the
        peer link it was forwarded on, or None): a type with flow control slows that source
        down when the destination cannot keep up; the others need not know."""
        return self.accept(binding, message)

    def loaded(self, count: int) -> None:  # noqa: B027 - optional hook
        """After every load of the durable routes: how many destinations of this type there
        are now (a type may get ready for writes before the first one arrives)."""


class Forwarder(Protocol):
    """Cross-node forwarding of Subscription messages (``flowmq_broker.cluster``)."""

    # Per namespace, the routes other nodes announced; empty while this node is alone.
    remote: dict[str, Any]

    def forward(
        self, namespace: str, message: Message, bindings: frozenset[Binding]
    ) -> tuple[frozenset[Binding], Awaitable[None] | None]:
        """Send ``message`` to the nodes with matching routes; returns the bindings left to
        deliver here and what completes when the receivers confirmed a QoS > 0 message."""
        ...

    def remote_nodes(self, namespace: str, topic: str) -> tuple[list[str], bool]:
        """The nodes with a plain route matching ``topic``, and whether its messages must go
        one at a time (``forward``): a shared group elsewhere matches it, or a matching node
        does not take ``forward_runs``."""
        ...

    def forward_runs(self, node: str, namespace: str, origin: str, level: int, runs: list) -> bool:
        """Send ``node`` runs of plain QoS 0 MQTT PUBLISH packets in one frame; False if it
        cannot take them (dead, unknown, backlog full)."""
        ...


# A topic's route resolved for a run of messages (``Router.dispatch_plan``): its bindings and the
# (destination type, binding) pairs to hand each message to.
DispatchPlan = tuple[frozenset[Binding], list[tuple[DestinationType, Binding]]]


class Router:
    """Routes a canonical topic to the bindings whose filters match it."""

    def __init__(self, forwarder: Forwarder | None = None) -> None:
        self._tries: dict[str, RouteTrie[Binding]] = {}
        self._types: dict[str, DestinationType] = {}
        self.version = 0
        # Bumped on every bind and unbind: a cache of what a topic reaches is valid while
        # this stays the same (flowmq_broker.mqtt.delivery's route plans).
        self.generation = 0
        self._destinations: dict[Binding, Destination] = {}
        self.forwarder = forwarder

    def register_type(self, dest_type: DestinationType) -> None:
        self._types[dest_type.name] = dest_type

    def bind(self, binding: Binding, topic_filter: str) -> bool:
        self.generation += 1
        trie = self._tries.get(binding.namespace)
        if trie is None:
            trie = self._tries[binding.namespace] = RouteTrie()
        return trie.add(topic_filter, binding)

    def remote_routes_changed(self) -> None:
        """Another node's routes changed (the forwarder says so): what a topic reaches moved,
        so the caches keyed by ``generation`` must go."""
        self.generation += 1

    def unbind(self, binding: Binding, topic_filter: str) -> bool:
        self.generation += 1
        trie = self._tries.get(binding.namespace)
        return trie is not None and trie.remove(topic_filter, binding)

    def match(self, namespace: str, topic: str) -> frozenset[Binding]:
        trie = self._tries.get(namespace)
        return frozenset() if trie is None else trie.match(topic)

    def load(self, version: int, destinations: Iterable[Destination]) -> None:
        """Make the durable bindings exactly ``destinations`` (as of metadata ``version``)."""
        wanted = {Binding(dest.type, dest.namespace, dest.name): dest for dest in destinations}
        for binding, old in list(self._destinations.items()):
            new = wanted.get(binding)
            if new is None or new.topic_filters != old.topic_filters:
                for topic_filter in old.topic_filters:
                    self.unbind(binding, topic_filter)
                del self._destinations[binding]
        for binding, dest in wanted.items():
            if binding not in self._destinations:
                for topic_filter in dest.topic_filters:
                    self.bind(binding, topic_filter)
            # Always the latest record: options (a Stream's partitions) change in place.
            self._destinations[binding] = dest
        self.version = version
        counts: dict[str, int] = {}
        for binding in self._destinations:
            counts[binding.type] = counts.get(binding.type, 0) + 1
        for type_name in {*counts, "stream", "queue"}:
            metrics.broker_destinations.labels(type_name).set(counts.get(type_name, 0))
        for type_name, dest_type in self._types.items():
            dest_type.loaded(counts.get(type_name, 0))

    def destinations(self) -> list[Destination]:
        return list(self._destinations.values())

    def destination(self, binding: Binding) -> Destination | None:
        return self._destinations.get(binding)

    def dispatch(
        self,
        namespace: str,
        message: Message,
        *,
        exclude: Binding | None = None,
        source: object = None,
    ) -> tuple[frozenset[Binding], list[Awaitable[None]]]:
        """Hand ``message`` to every matching destination but ``exclude`` (the Stream a
        Kafka producer already appended it to), telling them its ``source`` (see
        ``DestinationType.accept_from``); return the bindings and the awaitables that
        complete when the durable ones have it."""
        bindings = self.match(namespace, message.topic)
        if exclude is not None and exclude in bindings:
            bindings = bindings - {exclude}
        pending: list[Awaitable[None]] = []
        for binding in bindings:
            dest_type = self._types.get(binding.type)
            if dest_type is None:
                raise DestinationUnavailable(
                    f"topic {message.topic!r} matches {binding.type} {binding.name!r}, "
                    f"but this broker does not serve {binding.type}s yet"
                )
        forwarder = self.forwarder
        if forwarder is not None and forwarder.remote:
            bindings, confirmed = forwarder.forward(namespace, message, bindings)
            if confirmed is not None:
                pending.append(confirmed)
        for binding in bindings:
            result = self._types[binding.type].accept_from(binding, message, source)
            if result is not None:
                pending.append(result)
        self.count_published(namespace, 1, len(bindings))
        return bindings, pending

    def count_published(self, namespace: str, messages: int, dispatched: int) -> None:
        """Count ``messages`` routed in ``namespace`` and the ``dispatched`` deliveries to
        bindings they made (a caller routing a run of messages itself counts them once)."""
        published, dispatched_count = _routing_metrics(namespace)
        published.inc(messages)
        if dispatched:
            dispatched_count.inc(dispatched)

    def dispatch_plan(self, namespace: str, topic: str) -> DispatchPlan | None:
        """What ``dispatch`` does with a message on ``topic``, resolved once for a run of
        them: the bindings and their destination types, each message then handed to each
        type's ``accept_from``.  None when every message must go through ``dispatch``:
        other nodes may want it, or a destination type this broker does not serve (whose
        refusal ``dispatch`` raises)."""
        forwarder = self.forwarder
        if forwarder is not None and forwarder.remote:
            return None
        bindings = self.match(namespace, topic)
        targets = []
        for binding in bindings:
            dest_type = self._types.get(binding.type)
            if dest_type is None:
                return None
            targets.append((dest_type, binding))
        return bindings, targets

    def destination_type(self, binding: Binding) -> DestinationType | None:
        """What serves ``binding`` here (None: a type this broker does not serve)."""
        return self._types.get(binding.type)

    def is_durable(self, binding: Binding) -> bool:
        dest_type = self._types.get(binding.type)
        return dest_type is not None and dest_type.durable

    def is_one_member(self, binding: Binding) -> bool:
        dest_type = self._types.get(binding.type)
        return dest_type is not None and dest_type.one_member

    def deliver_forwarded(
        self,
        namespace: str,
        message: Message,
        plain: bool,
        groups: list[str],
        source: object = None,
    ) -> list[Awaitable[None]]:
        """Deliver a message another broker forwarded (on link ``source``): only to memory
        destinations (it stored the durable ones), all of them if ``plain``, and the shared
        ``groups`` it picked us for.  Returns what completes once stored (offline persistent
        sessions)."""
        stored: list[Awaitable[None]] = []
        for binding in self.match(namespace, message.topic):
            dest_type = self._types.get(binding.type)
            if dest_type is None or dest_type.durable:
                continue
            if plain if not dest_type.one_member else binding.name in groups:
                result = dest_type.accept_from(binding, message, source)
                if result is not None:
                    stored.append(result)
        return stored


@functools.cache
def _routing_metrics(namespace: str) -> tuple[Any, Any]:
    return (
        metrics.broker_messages_published_count.labels(namespace),
        metrics.broker_messages_dispatched_count.labels(namespace),
    )


class CatalogSync:
    """Keeps a Router's durable bindings equal to the catalog (DESIGN.md §6 metadata sync).

    Changes made here call ``refresh`` at once; other brokers' changes arrive as gossip
    events (``refresh`` too); and anti-entropy — every ``interval`` one small read of the global
    metadata version — catches what gossip missed, counting each missed change-log entry.
    """

    def __init__(self, catalog: Catalog, router: Router, interval: float = 1.0) -> None:
        self.catalog = catalog
        self.router = router
        self._poll = PeriodicTask("anti-entropy", interval, self.anti_entropy)
        self.on_change: list[Callable[[], Awaitable[None]]] = []
        # One refresh at a time: one that finds the version already loaded must still wait
        # for the callbacks (ACL reload…) of the refresh that loaded it, or an admin change
        # could be answered before it applies.
        self._refreshing = asyncio.Lock()

    async def refresh(self) -> int:
        """Load the catalog if its version moved; returns how many versions it moved.  When
        it returns, what the catalog held as it was called is applied, callbacks included."""
        async with self._refreshing:
            version, destinations = await self.catalog.snapshot()
            if version == self.router.version and self.router.version:
                return 0
            missed = max(0, version - self.router.version)
            self.router.load(version, destinations)
            for callback in self.on_change:
                await callback()
            return missed

    async def anti_entropy(self) -> None:
        missed = await self.refresh()
        if missed:
            metrics.anti_entropy_missing_events_detected_count.inc(missed)
        metrics.anti_entropy_syncs_completed_count.inc()

    def start(self) -> None:
        self._poll.start()

    async def stop(self) -> None:
        await self._poll.stop()
