"""Messages for offline persistent sessions, kept in a Queue per session (DESIGN.md §5).

While a persistent session (clean start 0 / session expiry > 0) has no connection, its QoS
1 and 2 messages are enqueued in the queue ``$session/<client id>`` of its namespace: bodies
in the object store, index in the meta store, through the same batcher as every Queue.  The
publisher is acknowledged once the message is durable, so a broker crash does not lose it,
and any broker the client reconnects to — or the survivor that adopts a dead broker's
sessions — finds it there.

A reconnect does not read that backlog before CONNACK: it marks the session *draining*
(``start_drain``) and CONNACK goes out at once.  Then the backlog is read a page at a time
(``feed``), oldest first, into the session's in-memory queue behind what the session held
already, each page once fewer than ``FEED_BELOW`` messages wait there and the client's
socket is taking what it is sent: the client's window (receive maximum,
``mqtt_max_inflight_bytes``) and its write buffer pace the reads, and the broker holds about
two pages of a backlog however long it is.  While draining, the session's new QoS 1/2
messages are stored behind the backlog instead of going out from memory, so they come after
it, in order; the drain ends when a read finds nothing more and no store for the session is
on its way.  Messages read stay stored until the client acknowledged them (PUBACK, PUBCOMP:
``acked``), and those are dropped from the store in batches, before the next page is read:
a broker that dies mid-drain takes nothing along, and what it had sent unacknowledged is
sent again where the session resumes.  If the client leaves again, what was read and not
sent is dropped from memory (``release``) and read again at its next connect: an offline
session holds no copy of its backlog.

A connected persistent session's QoS 1/2 messages go out from memory, and a copy goes into
the same queue (``keep``): the publisher's acknowledgement waits for it, so a message is
durable before it is acknowledged whether the session is online or not, and if this node
dies with it unacknowledged by the subscriber, the node where the session resumes (after a
restart, or a survivor that adopts it) takes it from the queue and sends it again.  Copies are
dropped (the queue purged) once the session is online with nothing in flight or queued: the
client acknowledged everything.  A copy made while a purge runs waits for it, so a purge never
takes a copy of a message still unacknowledged.  A message another node stored for a
connected session meanwhile (around a takeover) is found then, and drained as a backlog.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import functools
import logging
import weakref
from typing import Any

from flowmq_broker.mqtt.session import Session, SessionConnection
from flowmq_broker.queues import session_queue_name
from flowmq_core.message import Message
from flowmq_queue import QueueEngine, QueueOptions

log = logging.getLogger(__name__)

# The subscription identifiers a stored message goes out with (a list of ints).
SUBSCRIPTION_IDS = "mqtt.subscription_ids"
# In the delivery extras of a message taken from the store: its seq there (``release``).
STORED_SEQ = "stored_seq"
# A page of a session's stored backlog must come back within this (its GETs, a few at once).
PAGE_TIMEOUT_S = 5.0
# One page of the backlog: at most this many messages, from at most this many objects (a
# ranged GET each, ``PEEK_CONCURRENCY`` at a time).
PAGE_MESSAGES = 1000
PAGE_OBJECTS = 32
# A draining session reads its next page once fewer of its messages than this wait in its
# queue (the rest of the page goes out meanwhile): at most about two pages in memory.
FEED_BELOW = PAGE_MESSAGES // 2
# A page that could not be read (a store outage) is tried again this much later.
FEED_RETRY_S = 1.0
# How often the copies of connected sessions with nothing in flight are dropped.
TRIM_INTERVAL_S = 1.0
# How soon a session that was not idle is looked at again.
BUSY_RETRY_S = 0.1
# A session that is never idle keeps at most this many copies between purges; past it, its
# messages go out from memory only until the next purge (as they did before copies).
MAX_COPIES = 10_000
# The context the bookkeeping callbacks of a store run in (they read no context variable):
# without it every ``add_done_callback`` copies the current context, 64 bytes more per
# callback on each of the thousands of stores a fan-out to offline sessions can have
# waiting for a flush.  Callbacks run one at a time, so the one context is never re-entered.
_CALLBACK_CONTEXT = contextvars.Context()

QueuedItem = tuple[Message, int, bool, dict[str, Any]]


class OfflineStore:
    def __init__(self, engine: QueueEngine, options: QueueOptions) -> None:
        self.engine = engine
        self.options = options  # strict FIFO, at most mqtt_max_offline_bytes
        # Sessions with copies stored since their last purge, and how many.
        self._copies: weakref.WeakKeyDictionary[Session, int] = weakref.WeakKeyDictionary()
        self._purging: dict[Session, asyncio.Future[None]] = {}
        # The stored messages (seqs) each session holds in memory: copies and those read.
        self._held: weakref.WeakKeyDictionary[Session, set[int]] = weakref.WeakKeyDictionary()
        # Of those read from the backlog, the ones the client acknowledged: dropped from the
        # store before the next page is read (or by the purge once the session is idle).
        self._acked: weakref.WeakKeyDictionary[Session, set[int]] = weakref.WeakKeyDictionary()
        # The draining sessions a page is being read for, and that read.
        self._feeding: dict[Session, asyncio.Task[None]] = {}
        # What was stored behind a draining session's backlog and is durable: its drain ends
        # only once it read them.  A page read on the meta store's thread may have begun
        # before such a store's flush (on the flush thread) committed, and come back after
        # the store was done, without it: had the drain ended then, the message went out
        # after newer ones sent from memory.
        self._behind: weakref.WeakKeyDictionary[Session, set[int]] = weakref.WeakKeyDictionary()
        self._read_failing = False  # a page could not be read: logged until one is again
        self._trim_scheduled = False

    def store(
        self, session: Session, message: Message, qos: int, retain: bool, identifiers: list[int]
    ) -> asyncio.Future[Any]:
        """Enqueue ``message`` as it is to be delivered; done once durable."""
        session.stored = True
        future = self._enqueue(session, message, qos, retain, identifiers)
        if session.draining:  # stored behind its backlog: the drain reads it before it ends
            future.add_done_callback(
                functools.partial(_note_durable, self._behind, session), context=_CALLBACK_CONTEXT
            )
        return future

    def _enqueue(
        self, session: Session, message: Message, qos: int, retain: bool, identifiers: list[int]
    ) -> asyncio.Future[Any]:
        properties = dict(message.properties)
        if identifiers:
            properties[SUBSCRIPTION_IDS] = identifiers
        stored = dataclasses.replace(message, qos=qos, retain=retain, properties=properties)
        name = session.store_name
        if name is None:
            name = session.store_name = session_queue_name(session.client_id)
        future = self.engine.enqueue(session.namespace, name, stored, self.options)
        session.pending_stores.add(future)
        future.add_done_callback(session.pending_stores.discard, context=_CALLBACK_CONTEXT)
        return future

    def keep(
        self, session: Session, message: Message, qos: int, retain: bool, identifiers: list[int]
    ) -> asyncio.Future[Any] | None:
        """A copy of ``message``, just sent to the connected ``session`` from memory, until
        the client acknowledged it; done once durable (None: no copy, see ``MAX_COPIES``)."""
        copies = self._copies.get(session, 0)
        if copies >= MAX_COPIES:
            return None
        self._watch(session, copies + 1)
        purging = self._purging.get(session)
        if purging is None:
            return self._copy(session, message, qos, retain, identifiers)
        later: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

        def after_purge(_: Any) -> None:
            stored = self._copy(session, message, qos, retain, identifiers)
            stored.add_done_callback(functools.partial(_copy_outcome, later))

        purging.add_done_callback(after_purge)
        session.pending_stores.add(later)
        later.add_done_callback(session.pending_stores.discard, context=_CALLBACK_CONTEXT)
        return later

    def _copy(
        self, session: Session, message: Message, qos: int, retain: bool, identifiers: list[int]
    ) -> asyncio.Future[Any]:
        stored = self._enqueue(session, message, qos, retain, identifiers)
        stored.add_done_callback(
            functools.partial(_note_durable, self._held, session), context=_CALLBACK_CONTEXT
        )
        return stored

    def _watch(self, session: Session, copies: int) -> None:
        """``session`` has messages in its queue that its client holds: purge when idle."""
        self._copies[session] = copies
        if not self._trim_scheduled:
            self._trim_scheduled = True
            asyncio.get_running_loop().call_later(TRIM_INTERVAL_S, self._trim_soon)

    def _trim_soon(self) -> None:
        self._trim_scheduled = False
        asyncio.get_running_loop().create_task(self._trim())

    async def _trim(self) -> None:
        """Purge the queues of connected sessions whose client acknowledged everything."""
        busy = False
        for session in list(self._copies.keys()):
            if not session.online:
                continue  # its copies wait for its return (or another node's take)
            # ``stored`` (since its connect's drain) is sent by the purge's look.
            if session.inflight or session.queue or session.pending_stores or session.draining:
                busy = True
                continue
            if session in self._purging:
                continue
            try:
                if await self._purge_if_all_held(session):
                    self._copies.pop(session, None)
                else:
                    busy = True
            except Exception as exc:  # the copies stay: sent again if it moves, not lost
                log.warning(
                    "mqtt %s: could not drop acknowledged copies: %s", session.client_id, exc
                )
        if len(self._copies) and not self._trim_scheduled:
            # A session busy now is idle between two messages: look again soon.
            self._trim_scheduled = True
            delay = BUSY_RETRY_S if busy else TRIM_INTERVAL_S
            asyncio.get_running_loop().call_later(delay, self._trim_soon)

    async def _purge_if_all_held(self, session: Session) -> bool:
        """Purge the idle ``session``'s queue if it holds only what this session had (and
        its client acknowledged); True if purged.  Messages another node stored meanwhile (a
        session moving between nodes) are sent to the client first, purged next time."""
        namespace, name = session.namespace, session_queue_name(session.client_id)
        # Copies made from here on wait for the purge (two meta-store transactions).
        done = asyncio.get_running_loop().create_future()
        self._purging[session] = done
        try:
            # What it holds now, and only that: a reconnect's drain may add what it reads to
            # ``held`` while the purge runs (the same session resumed on this node), and
            # those messages are not sent yet.
            held = frozenset(self._held.get(session, ()))
            foreign = await self.engine.ready_count(namespace, name) > len(held)
            if not foreign:
                # Only what this session holds: a message another node stores for it after
                # the count (it holds the session too, for a moment, around a takeover or a
                # node declared dead while alive) stays, and is sent at the next look.
                await self.engine.purge_seqs(namespace, name, held)
                for kept in (self._held, self._acked):
                    seqs = kept.get(session)
                    if seqs is not None:
                        seqs.difference_update(held)
                        if not seqs:  # (an idle session keeps no empty set)
                            del kept[session]
                return True
        finally:
            del self._purging[session]
            done.set_result(None)
        # Also what was stored while its connect was not attached yet (``session.stored``,
        # after the connect's drain began): nothing else takes it while the client is here.
        # It is drained as a backlog, each page kept, the new messages stored behind it.
        session.stored = False
        if session.connection is not None:
            session.draining = True
            self.feed(session)
        return False

    async def _read_page(
        self, session: Session, held: set[int], timeout: float
    ) -> list[tuple[int, Message]]:
        """The next page of what is stored for ``session`` and not in ``held`` (its seqs are
        added to it), oldest first; empty once all is held."""
        rows = await asyncio.wait_for(
            self.engine.peek(
                session.namespace,
                session_queue_name(session.client_id),
                PAGE_MESSAGES,
                skip=held,
                max_objects=PAGE_OBJECTS,
            ),
            timeout,
        )
        fresh = [(seq, message) for seq, _, message in rows if seq not in held]
        held.update(seq for seq, _ in fresh)
        return fresh

    def start_drain(self, session: Session) -> None:
        """``session`` is resumed by a connection and may have messages stored: from its
        CONNACK on they go out, a page at a time (``feed``), before anything newer (stored
        behind them meanwhile: ``MqttDelivery.deliver``).  Nothing is read here: CONNACK
        does not wait for a backlog, however long or slow to read."""
        held = self._held.setdefault(session, set())
        # What it holds in memory already (from before it left, or handed over by the
        # node it came from) is not read again.
        for out in session.inflight.values():
            if isinstance(out, list):  # a run's item as it came: never a stored one
                continue
            seq = out.properties.get(STORED_SEQ)
            if seq is not None:
                held.add(seq)
        for item in session.queue:
            seq = item[3].get(STORED_SEQ)
            if seq is not None:
                held.add(seq)
        session.stored = False
        session.draining = True
        # Looked at again once idle: a store still on its way from the node the session
        # came from is found then (``_purge_if_all_held``).
        self._watch(session, self._copies.get(session, 0))

    def feed(self, session: Session) -> None:
        """Read the next page of the draining ``session``'s backlog if few of its messages
        wait to be sent and its client takes what it is sent; called as its window frees
        (acknowledgements, a socket writable again) and once it is resumed."""
        if not session.draining or session in self._feeding:
            return
        connection = session.connection
        if connection is None or connection.writing_paused or len(session.queue) >= FEED_BELOW:
            return
        task = asyncio.get_running_loop().create_task(self._feed(session, connection))
        self._feeding[session] = task

    async def _feed(self, session: Session, connection: SessionConnection) -> None:
        retry = False
        try:
            await self.purge_acked(session)
            held = self._held.setdefault(session, set())
            known = frozenset(self._behind.get(session, ()))  # durable before this read
            page = await self._read_page(session, held, PAGE_TIMEOUT_S)
            if self._read_failing:
                self._read_failing = False
                log.info("mqtt: stored messages of sessions read again")
            if session.connection is not connection or not session.draining:
                # Its client left (or was taken over) meanwhile: the page stays in the
                # store alone, read again at the next connect (``release``).
                held.difference_update(seq for seq, _ in page)
                return
            session.queue.extend(_queued_item(message, seq) for seq, message in page)
            # Fewer messages than a page has objects: neither bound was reached, this was the
            # end — unless a store for the session is on its way (stored behind the backlog
            # while it drains): read again once it is durable.
            end = len(page) < PAGE_OBJECTS
            behind = self._behind.get(session)
            if behind:
                # Left: what became durable while this read ran (the next one sees it).  What
                # was durable before it began is in this page, or in a later one (this one
                # is not the end), or gone (purged elsewhere): no reason to read again.
                behind.difference_update(known)
                behind.difference_update(held)
            if end and not session.pending_stores and not behind:
                session.draining = False  # from here on new messages go from memory
                session.stored = False
                self._behind.pop(session, None)
            connection.send_queued()
            if end and session.draining and session.pending_stores:
                await asyncio.wait(list(session.pending_stores), timeout=PAGE_TIMEOUT_S)
        except Exception as exc:  # a store outage: what was read is kept; tried again
            if not self._read_failing:  # once per outage, not once per session and try
                self._read_failing = True
                log.warning(
                    "mqtt %s: could not read stored messages (%s); trying again every %.0f s",
                    session.client_id,
                    str(exc) or type(exc).__name__,
                    FEED_RETRY_S,
                )
            asyncio.get_running_loop().call_later(FEED_RETRY_S, self.feed, session)
            retry = True
        finally:
            del self._feeding[session]
            if not retry:  # the next page, if there is room: or a new connection's first
                self.feed(session)  # (one that came while this read was on its way)

    def acked(self, session: Session, seq: int) -> None:
        """The client acknowledged the message read from the store as ``seq``: it may go."""
        self._acked.setdefault(session, set()).add(seq)

    def has_acked(self, session: Session) -> bool:
        """Whether ``session``'s client acknowledged messages still in the store."""
        return bool(self._acked.get(session))

    async def purge_acked(self, session: Session) -> None:
        """Drop from the store what the client acknowledged of its backlog (one purge for
        all of it, reading only the head of the queue: ``index.purge_seqs_page``)."""
        acked = self._acked.get(session)
        if not acked:
            return
        batch = frozenset(acked)
        await self.engine.purge_seqs(
            session.namespace, session_queue_name(session.client_id), batch
        )
        acked.difference_update(batch)
        held = self._held.get(session)
        if held is not None:
            held.difference_update(batch)

    def release(self, session: Session) -> int:
        """``session`` went offline: the messages it took from the store and has not sent
        yet stay there alone, not in memory too, until a connection takes them again (an
        offline session could otherwise pin its whole stored backlog for its expiry, days).
        Returns how many were let go."""
        if session.draining:  # the rest of its backlog is read at its next connect
            session.draining = False
            session.stored = True
            self._behind.pop(session, None)
        held = self._held.get(session)
        if not held or not session.queue:
            return 0
        kept: list[QueuedItem] = []
        for item in session.queue:
            seq = item[3].get(STORED_SEQ)
            if seq is None:
                kept.append(item)
            else:
                held.discard(seq)
        released = len(session.queue) - len(kept)
        if released:
            session.queue.clear()
            session.queue.extend(kept)
            session.stored = True  # the next connect drains them (``start_drain``)
        return released

    def forget(self, session: Session) -> None:
        """The session ended: drop what is stored for it."""
        if not (session.stored or session.pending_stores or session in self._copies):
            return
        name = session_queue_name(session.client_id)
        task = asyncio.get_running_loop().create_task(self.engine.delete(session.namespace, name))
        task.add_done_callback(_log_failure)


def _queued_item(message: Message, seq: int | None = None) -> QueuedItem:
    identifiers = message.properties.get(SUBSCRIPTION_IDS)
    if identifiers is not None:
        properties = dict(message.properties)  # the engine's cached copy stays as it is
        del properties[SUBSCRIPTION_IDS]
        message = dataclasses.replace(message, properties=properties)
    # Without identifiers (most messages) the message read is the one queued: a copy of
    # each (the message and its properties, ~300 bytes) doubled what a page costs.
    extra: dict[str, Any] = {"subscription_identifier": identifiers or []}
    if seq is not None:
        extra[STORED_SEQ] = seq
    return message, message.qos, message.retain, extra


def _note_durable(
    seqs: weakref.WeakKeyDictionary[Session, set[int]],
    session: Session,
    stored: asyncio.Future[Any],
) -> None:
    """A store's done callback: its seq, once durable, into ``seqs`` of ``session``."""
    if not stored.cancelled() and stored.exception() is None:
        seqs.setdefault(session, set()).add(stored.result().seq)


def _copy_outcome(into: asyncio.Future[Any], source: asyncio.Future[Any]) -> None:
    if into.done():
        return
    if source.exception() is not None:
        into.set_exception(source.exception())  # type: ignore[arg-type]
    else:
        into.set_result(source.result())


def _log_failure(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("could not drop a session's stored messages", exc_info=task.exception())
