"""Messages for offline persistent sessions, kept in a Queue per session (DESIGN.md §5).

While a persistent session (clean start 0 / session expiry > 0) has no connection, its QoS
1 and 2 messages are enqueued in the queue ``$session/<client id>`` of its namespace: bodies
in the object store, index in the meta store, through the same batcher as every Queue.  The
publisher is acknowledged once the message is durable, so a broker crash does not lose it,
and any broker the client reconnects to — or the survivor that adopts a dead broker's
sessions — finds it there.  On reconnect, the stored messages are taken (claimed and
acknowledged in the queue) into the session's in-memory queue before CONNACK, behind what
the session already held, so they go out first and in order.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any

from flowmq_broker.mqtt.session import Session
from flowmq_broker.queues import session_queue_name
from flowmq_core.message import Message
from flowmq_queue import QueueEngine, QueueOptions

log = logging.getLogger(__name__)

# The subscription identifiers a stored message goes out with (a list of ints).
SUBSCRIPTION_IDS = "mqtt.subscription_ids"
TAKE_TIMEOUT_S = 5.0
CHECK_EMPTY_S = 0.05

QueuedItem = tuple[Message, int, bool, dict[str, Any]]


class OfflineStore:
    def __init__(self, engine: QueueEngine, options: QueueOptions) -> None:
        self.engine = engine
        self.options = options  # strict FIFO, at most mqtt_max_offline_bytes

    def store(
        self, session: Session, message: Message, qos: int, retain: bool, identifiers: list[int]
    ) -> asyncio.Future[Any]:
        """Enqueue ``message`` as it is to be delivered; done once durable."""
        properties = dict(message.properties)
        if identifiers:
            properties[SUBSCRIPTION_IDS] = identifiers
        stored = dataclasses.replace(message, qos=qos, retain=retain, properties=properties)
        future = self.engine.enqueue(
            session.namespace,
            session_queue_name(session.client_id),
            stored,
            self.options,
        )
        session.stored = True
        session.pending_stores.add(future)
        future.add_done_callback(session.pending_stores.discard)
        return future

    async def take(self, session: Session) -> list[QueuedItem]:
        """Everything stored for ``session``, oldest first, removed from the store."""
        if session.pending_stores:
            await asyncio.wait(list(session.pending_stores), timeout=TAKE_TIMEOUT_S)
        name = session_queue_name(session.client_id)
        expected = await self.engine.ready_count(session.namespace, name)
        session.stored = False
        if not expected:
            return []
        taken: list[Any] = []
        all_in = asyncio.get_running_loop().create_future()

        def deliver(batch: list[Any]) -> None:
            taken.extend(batch)
            if len(taken) >= expected and not all_in.done():
                all_in.set_result(None)

        # no_ack: claimed and acknowledged in one go — from here the session holds them, as
        # it holds every message of a connected client.
        consumer = self.engine.subscribe(
            session.namespace, name, f"mqtt:{session.client_id}", deliver, no_ack=True
        )
        deadline = asyncio.get_running_loop().time() + TAKE_TIMEOUT_S
        try:
            while not all_in.done():
                try:
                    await asyncio.wait_for(asyncio.shield(all_in), CHECK_EMPTY_S)
                except TimeoutError:
                    # Fewer than counted: some expired in the store (not delivered).
                    if not await self.engine.ready_count(session.namespace, name):
                        await asyncio.sleep(0)  # deliveries of the last claim go out first
                        break
                    if asyncio.get_running_loop().time() > deadline:
                        log.warning(
                            "mqtt %s: took %d stored messages, more left for its next connect",
                            session.client_id,
                            len(taken),
                        )
                        session.stored = True
                        break
        finally:
            self.engine.cancel(consumer)
        return [_queued_item(delivery.message) for delivery in taken]

    def forget(self, session: Session) -> None:
        """The session ended: drop what is stored for it."""
        if not session.stored and not session.pending_stores:
            return
        name = session_queue_name(session.client_id)
        task = asyncio.get_running_loop().create_task(self.engine.delete(session.namespace, name))
        task.add_done_callback(_log_failure)


def _queued_item(message: Message) -> QueuedItem:
    identifiers = message.properties.pop(SUBSCRIPTION_IDS, None) or []
    return message, message.qos, message.retain, {"subscription_identifier": identifiers}


def _log_failure(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("could not drop a session's stored messages", exc_info=task.exception())
