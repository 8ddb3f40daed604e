"""The Queue destination type and this broker's queue service (DESIGN.md §5 Queue).

``QueueService`` creates the broker's ``QueueEngine`` on its batcher and registers the
``queue`` destination type with the router (so MQTT, Kafka, HTTP and AMQP publishes reach
queues); ``start`` starts the engine and the lease reaper.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from flowmq_broker.routing import Binding, DestinationType, Router
from flowmq_commit.batcher import GroupCommitBatcher
from flowmq_core.errors import NotFound
from flowmq_core.message import Message
from flowmq_core.periodic import PeriodicTask
from flowmq_meta import keys
from flowmq_meta.api import MetaStore
from flowmq_meta.catalog import QUEUE, Catalog, Destination
from flowmq_objstore.api import ObjectStore
from flowmq_queue import QueueEngine, QueueOptions

log = logging.getLogger(__name__)

REAPER_INTERVAL_S = 2.0
# Offline MQTT persistent sessions keep their messages in a queue of this name (not a
# catalog queue: "$" is not allowed in destination names).  One shard: strict FIFO.
SESSION_QUEUE_PREFIX = "$session/"


def session_queue_name(client_id: str) -> str:
    return SESSION_QUEUE_PREFIX + client_id


class QueueSettings:
    """Each queue's options, read from the router's catalog copy (no meta-store read); an
    MQTT session's queue is strictly FIFO and holds at most ``session_max_bytes``."""

    def __init__(self, router: Router, session_max_bytes: int | None = None) -> None:
        self.router = router
        self.session_options = QueueOptions(
            shards=1,
            max_bytes=session_max_bytes,
            cache_bodies=False,  # read back only at a reconnect (or never: purged once acked)
            metrics_label="$session",
        )
        self._options: dict[int, tuple[Destination, QueueOptions]] = {}

    def options(self, ns: str, queue: str) -> QueueOptions | None:
        return self.options_of(Binding(QUEUE, ns, queue))

    def options_of(self, binding: Binding) -> QueueOptions | None:
        """``options`` for the queue ``binding`` names (no Binding built per message)."""
        dest = self.router.destination(binding)
        if dest is None:
            name = binding.name
            return self.session_options if name.startswith(SESSION_QUEUE_PREFIX) else None
        # Destination objects are replaced when the catalog changes: cache by identity.
        hit = self._options.get(id(dest))
        if hit is None or hit[0] is not dest:
            if len(self._options) > 10_000:
                self._options.clear()
            hit = self._options[id(dest)] = (dest, QueueOptions.of(dest))
        return hit[1]


class QueueDestinationType(DestinationType):
    name = QUEUE
    durable = True

    def __init__(self, engine: QueueEngine, settings: QueueSettings) -> None:
        self.engine = engine
        self.options_of = settings.options_of

    def accept(self, binding: Binding, message: Message) -> asyncio.Future[int]:
        opts = self.options_of(binding) or QueueOptions()
        return self.engine.enqueue(binding.namespace, binding.name, message, opts)


class QueueService:
    def __init__(
        self,
        router: Router,
        catalog: Catalog,
        meta: MetaStore,
        objects: ObjectStore,
        batcher: GroupCommitBatcher,
        *,
        session_max_bytes: int | None = None,
    ) -> None:
        self.router = router
        self.catalog = catalog
        self.meta = meta
        settings = QueueSettings(router, session_max_bytes)
        self.engine = QueueEngine(
            meta,
            objects,
            batcher,
            options=settings.options,
            dead_letter=self._dead_letter,
            holder=batcher.node_id,
        )
        self.type = QueueDestinationType(self.engine, settings)
        self.session_options = settings.session_options
        self.router.register_type(self.type)
        self._reaper = PeriodicTask("queue-reaper", REAPER_INTERVAL_S, self.reap_once)

    def start(self) -> None:
        self.engine.start()
        self._reaper.start()

    async def stop(self) -> None:
        await self._reaper.stop()
        await self.engine.close()

    def _dead_letter(self, ns: str, message: Message) -> list[Any]:
        # DestinationUnavailable propagates: the engine keeps the dead letters and retries.
        return list(self.router.dispatch(ns, message)[1])

    async def reap_once(self) -> int:
        queues = [(d.namespace, d.name) for d in self.router.destinations() if d.type == QUEUE]
        return await self.engine.reap_once(queues, self._is_deleted)

    async def _is_deleted(self, ns: str, queue: str) -> bool:
        if queue.startswith(SESSION_QUEUE_PREFIX):  # an MQTT session's: gone with it
            key = keys.SESSIONS.pack(ns, queue.removeprefix(SESSION_QUEUE_PREFIX))
            return await self.meta.transact(lambda tr: tr.get(key)) is None
        try:
            await self.catalog.get_destination(ns, queue, QUEUE)
        except NotFound:
            return True
        return False
