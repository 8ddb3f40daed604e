"""``QueueEngine``: this broker's side of every Queue — enqueue, consumers, acks, dead
letters, whole-queue operations and the reaper.

Enqueue goes through the shared group-commit batcher (``EnqueueCommit``: one ready entry per
queue per flush).  Claims, acks, rejections, lease renewals and finished dead letters are
batched into rounds, one transaction each, by ``ClaimRounds`` (claims.py), which also keeps
this broker's consumers; per-message calls never await and never start a transaction.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import itertools
import logging
import secrets
from collections.abc import Awaitable, Callable, Collection
from typing import Any

import flowmq_metrics as metrics
from flowmq_commit.batcher import GroupCommitBatcher
from flowmq_commit.clock import Clock
from flowmq_core.message import Message, now_ms
from flowmq_meta import MetaStore, Transaction
from flowmq_objstore import ObjectNotFound, ObjectStore
from flowmq_queue import index
from flowmq_queue.bodies import BodyCache, load_run
from flowmq_queue.claims import ClaimRounds, OptionsFn, QueueParts
from flowmq_queue.codec import encode_message
from flowmq_queue.consumers import Consumer, Delivery
from flowmq_queue.enqueue import REFUSED, EnqueueCommit, EnqueueCtx, Enqueued
from flowmq_queue.entries import Run
from flowmq_queue.errors import QueueFull
from flowmq_queue.index import QueueOptions

log = logging.getLogger("flowmq_queue")

DEFAULT_LEASE_MS = 10_000
# Object GETs a ``peek`` has in flight at once.
PEEK_CONCURRENCY = 16

DeadLetterFn = Callable[[str, Message], list[Awaitable[Any]]]


class QueueEngine:
    def __init__(
        self,
        meta: MetaStore,
        objects: ObjectStore,
        batcher: GroupCommitBatcher,
        *,
        options: OptionsFn,
        dead_letter: DeadLetterFn | None = None,
        holder: str = "",
        lease_ms: int = DEFAULT_LEASE_MS,
        cache: BodyCache | None = None,
        clock: Clock = now_ms,
        piggyback: bool = True,
    ) -> None:
        # What the engine works with, shared as one record with its claim rounds.
        self.parts = QueueParts(
            meta,
            objects,
            batcher,
            cache if cache is not None else BodyCache(),
            options,
            holder or f"q-{secrets.token_hex(6)}",
            lease_ms,
            clock,
        )
        self.dead_letter = dead_letter
        self._commit = EnqueueCommit(
            self._enqueued, holder=self.parts.holder, lease_ms=lease_ms, clock=clock
        )
        self._cids = itertools.count(1)
        self.claims = ClaimRounds(
            self.parts,
            publish_dead=self._publish_dead,
            piggyback=piggyback,
        )

    # --- life cycle ------------------------------------------------------------------------

    def start(self) -> None:
        self.claims.start()

    async def close(self) -> None:
        """Persist what is pending (acks, requeues of closed consumers), then stop."""
        await self.claims.close()

    # --- enqueue ---------------------------------------------------------------------------

    def enqueue(
        self, ns: str, queue: str, message: Message, opts: QueueOptions
    ) -> asyncio.Future[Any]:
        """Store ``message``; the future resolves once it is durable, or fails with
        ``QueueFull``.  (No future of our own: one per message is all the batcher's.)"""
        body = encode_message(message)
        expires = message.expiry_ms or 0
        if opts.ttl_ms is not None:
            ttl_end = message.timestamp_ms + opts.ttl_ms
            expires = min(expires, ttl_end) if expires else ttl_end
        # A queue with a size limit may refuse the message at commit: not claimed ahead.
        delivery = None
        if opts.max_bytes is None:
            delivery = self.claims.claim_ahead(ns, queue, message, len(body))
        # Held until committed only to be cached (the body is encoded already); one claimed
        # ahead is in its consumer's hands already.
        cached = message if opts.cache_bodies and delivery is None else None
        ctx = EnqueueCtx(cached, expires, opts)
        future = self.parts.batcher.submit(("q", ns, queue), body, self._commit, ctx)
        ctx.future = future
        if delivery is None:
            ctx.stamp = self.claims.enqueue_submitted(ns, queue)
        else:
            ctx.delivery = delivery
            delivery.stored = future
        return future

    def hand_out_ahead(self) -> None:
        """Deliver the messages claimed ahead by the enqueues so far (``enqueue``'s callers
        call it at the end of a run of publishes; otherwise they go out in the next loop
        iteration)."""
        self.claims.hand_out_ahead()

    def _enqueued(
        self, group: Any, results: list[Enqueued], object_key: str, sizes: list[int]
    ) -> None:
        _, ns, queue = group
        accepted = 0
        cache = self.parts.cache
        opts: QueueOptions = results[-1].ctx.opts
        stamp = 0
        # In-flight entry key -> (shard, run, the deliveries claimed ahead into it)
        leased: dict[bytes, tuple[int, Run, list[Delivery]]] = {}
        for r, size in zip(results, sizes, strict=True):
            ctx = r.ctx
            if r.seq != REFUSED:
                if ctx.message is not None:
                    cache.put((object_key, r.start), ctx.message, size)
                accepted += 1
                if r.leased is not None:
                    shard, key, run = r.leased
                    leased.setdefault(key, (shard, run, []))[2].append(ctx.delivery)
                    ctx.delivery = None
                else:
                    stamp = ctx.stamp or stamp
            elif not ctx.future.done():
                ctx.future.set_exception(_queue_full(ns, queue, r))
            # The future resolves to ``r``, which holds ``ctx``: without this, every enqueue
            # would be a reference cycle, freed only by a full collection (under load they
            # piled up by the 100,000 and raised the heap's high-water mark for good).
            ctx.future = None
        for key, (shard, run, deliveries) in leased.items():
            self.claims.claimed_ahead(ns, queue, shard, key, run, deliveries)
        if accepted:
            label = opts.metrics_label or queue
            metrics.queue_messages_enqueued_count.labels(ns, label).inc(accepted)
            if accepted > sum(len(run) for _, run, _ in leased.values()):
                self.claims.mark_ready(ns, queue, stamp, object_key)

    # --- consumers -------------------------------------------------------------------------

    def subscribe(
        self,
        ns: str,
        queue: str,
        tag: str,
        deliver: Callable[[list[Delivery]], None],
        *,
        prefetch: int = 0,
        no_ack: bool = False,
        claim_ahead: bool = False,
    ) -> Consumer:
        """``claim_ahead``: messages published on this broker may be handed to the consumer
        before they are stored (``ClaimRounds.claim_ahead``); its settles of them are applied
        once they are, and dropped if they never are."""
        consumer = Consumer(ns, queue, tag, f"{tag}#{next(self._cids)}", deliver, prefetch, no_ack)
        consumer.claim_ahead = claim_ahead
        self.claims.add(consumer)
        return consumer

    def cancel(self, consumer: Consumer) -> None:
        """Stop delivering to ``consumer``; its unacknowledged messages stay leased to it
        until acked or rejected (AMQP Basic.Cancel semantics)."""
        self.claims.cancel(consumer)

    def set_paused(self, consumer: Consumer, paused: bool) -> None:
        consumer.paused = paused
        if not paused:
            self.claims.pump_soon(consumer)
            self.claims.kick()

    def get(
        self, ns: str, queue: str, *, no_ack: bool = False
    ) -> asyncio.Future[tuple[Delivery | None, int]]:
        """Basic.Get: (one message or None, ready messages left), without waiting for a
        message to arrive."""
        consumer = Consumer(ns, queue, "", f"get#{next(self._cids)}", None, 1, no_ack)
        consumer.get_future = asyncio.get_running_loop().create_future()
        self.claims.add_get(consumer)
        return consumer.get_future

    def ack(self, delivery: Delivery) -> None:
        self.claims.settle(delivery, "ack")
        self.parts.cache.discard(delivery.location)

    def reject(self, delivery: Delivery, *, requeue: bool) -> None:
        """Nack/reject: back to ready with attempt + 1 (``requeue``) or to dead letters."""
        self.claims.settle(delivery, "requeue" if requeue else "dead")

    # --- dead letters -------------------------------------------------------------------------

    async def _publish_dead(self, ns: str, queue: str, key: bytes, run: Run) -> None:
        opts = self.parts.options(ns, queue)
        topic = opts.dead_letter_topic if opts is not None else None
        try:
            if topic is not None and self.dead_letter is not None:
                messages = await load_run(self.parts.objects, self.parts.cache, run)
                pending: list[Awaitable[Any]] = []
                for m in messages:
                    dead = dataclasses.replace(
                        m,
                        topic=topic,
                        headers=[
                            *m.headers,
                            ("x-death-queue", queue.encode()),
                            ("x-death-reason", run.reason.encode()),
                        ],
                        expiry_ms=None,
                        # Tells adapters that kept the publisher's encoded headers (AMQP) to
                        # rebuild them from ``headers``.
                        properties={**m.properties, "headers_changed": True},
                    )
                    pending.extend(self.dead_letter(ns, dead))
                if pending:
                    await asyncio.gather(*pending)
                metrics.queue_messages_dead_lettered_count.labels(ns, queue).inc(len(run))
        except Exception:
            # The entry stays under QUEUE_DEAD; a reaper takes it over after its deadline.
            log.warning(
                "could not dead-letter %d messages of %s/%s", len(run), ns, queue, exc_info=True
            )
            return
        for start in run.starts:
            self.parts.cache.discard((run.object_key, start))
        self.claims.dead_letter_done(ns, queue, key, run)

    # --- whole-queue operations ------------------------------------------------------------

    async def purge(self, ns: str, queue: str) -> int:
        """Drop every ready message; returns how many."""
        total = 0
        while True:
            dropped, more = await self.parts.meta.transact(
                functools.partial(_purge_txn, ns, queue, self.parts.clock())
            )
            total += dropped
            if not more:
                return total

    async def purge_seqs(self, ns: str, queue: str, seqs: set[int]) -> int:
        """Drop the ready messages whose seq is in ``seqs`` (and no other: what was enqueued
        meanwhile stays); returns how many."""
        total = 0
        begin: bytes | None = None
        while True:
            dropped, begin = await self.parts.meta.transact(
                functools.partial(_purge_seqs_txn, ns, queue, seqs, begin, self.parts.clock())
            )
            total += dropped
            if begin is None:
                return total

    async def delete(self, ns: str, queue: str) -> None:
        """Forget the queue's messages (its catalog entry is the caller's business)."""
        self.claims.forget(ns, queue)
        while await self.parts.meta.transact(
            functools.partial(_delete_txn, ns, queue, self.parts.clock())
        ):
            pass

    async def peek(
        self,
        ns: str,
        queue: str,
        limit: int,
        *,
        skip: Collection[int] = (),
        max_objects: int | None = None,
    ) -> list[tuple[int, int, Message]]:
        """Read only: ``(seq, attempt, message)`` of up to ``limit`` of the oldest ready
        messages, left where they are (an operator's look; consumers are not disturbed).
        ``skip``: seqs the reader has already (their bodies are not read); ``max_objects``:
        a bound on the objects read (one ranged GET each), for a backlog read a page at a time."""
        opts = self.parts.options(ns, queue) or QueueOptions()
        runs = await self.parts.meta.transact(
            lambda tr: index.peek_ready(tr, ns, queue, opts.shards, limit, skip, max_objects)
        )
        # A queue's messages are spread over many objects (one per flush that had some):
        # their GETs go out a few at a time, not one after another (a session's backlog
        # read at reconnect must come back before CONNACK).
        gets = asyncio.Semaphore(PEEK_CONCURRENCY)

        async def load(run: Run) -> list[Message]:
            async with gets:
                try:
                    return await load_run(
                        self.parts.objects, self.parts.cache, run, fill=opts.cache_bodies
                    )
                except ObjectNotFound:  # consumed and collected meanwhile
                    return []

        loaded = await asyncio.gather(*(load(run) for run in runs))
        out: list[tuple[int, int, Message]] = []
        for run, messages in zip(runs, loaded, strict=True):
            if messages:
                out.extend(zip(run.seqs, run.attempts, messages, strict=True))
        return out

    async def stats(self, ns: str, queue: str) -> dict[str, int]:
        return await self.parts.meta.transact(lambda tr: index.stats(tr, ns, queue))

    async def ready_count(self, ns: str, queue: str) -> int:
        st = await self.stats(ns, queue)
        return max(0, st[index.COUNT] - st[index.INFLIGHT])

    def consumer_count(self, ns: str, queue: str) -> int:
        return self.claims.consumer_count(ns, queue)

    # --- the reaper ------------------------------------------------------------------------

    async def reap_once(
        self,
        queues: list[tuple[str, str]],
        is_deleted: Callable[[str, str], Awaitable[bool]] | None = None,
    ) -> int:
        """Return expired leases of ``queues`` (any broker's), take over stalled dead letters
        and refresh the depth gauges; with ``is_deleted`` (asked of the catalog, not of a
        routing table that may lag), also drop the data of queues that no longer exist."""
        moved = 0
        listed = set(queues)
        for ns, queue in queues:
            opts = self.parts.options(ns, queue) or QueueOptions()
            now = self.parts.clock()
            n, dead, st = await self.parts.meta.transact(
                functools.partial(
                    _reap_txn, ns, queue, opts, self.parts.holder, now, now + self.parts.lease_ms
                )
            )
            if n:
                log.info("returned %d messages of expired leases in %s/%s", n, ns, queue)
                metrics.queue_messages_redelivered_count.labels(ns, queue).inc(n)
                self.claims.mark_ready(ns, queue)
                moved += n
            for key, run in dead:
                self.claims.spawn(self._publish_dead(ns, queue, key, run))
            inflight = st[index.INFLIGHT]
            metrics.queue_depth.labels(ns, queue).set(max(0, st[index.COUNT] - inflight))
            metrics.queue_messages_in_flight.labels(ns, queue).set(inflight)
        if is_deleted is None:
            return moved
        stored = await self.parts.meta.transact(index.stored_queues)
        for ns, queue in stored:
            if (ns, queue) not in listed and await is_deleted(ns, queue):
                log.info("removing the data of deleted queue %s/%s", ns, queue)
                await self.delete(ns, queue)
                try:
                    metrics.queue_depth.remove(ns, queue)
                    metrics.queue_messages_in_flight.remove(ns, queue)
                except KeyError:
                    pass
        return moved


def _purge_txn(ns: str, queue: str, now: int, tr: Transaction) -> tuple[int, bool]:
    delta = index.Delta()
    out = index.purge_page(tr, ns, queue, delta)
    delta.apply(tr, now)
    return out


def _purge_seqs_txn(
    ns: str, queue: str, seqs: set[int], begin: bytes | None, now: int, tr: Transaction
) -> tuple[int, bytes | None]:
    delta = index.Delta()
    out = index.purge_seqs_page(tr, ns, queue, seqs, delta, begin)
    delta.apply(tr, now)
    return out


def _delete_txn(ns: str, queue: str, now: int, tr: Transaction) -> bool:
    delta = index.Delta()
    more = index.delete_page(tr, ns, queue, delta)
    delta.apply(tr, now)
    return more


def _reap_txn(
    ns: str,
    queue: str,
    opts: QueueOptions,
    holder: str,
    now: int,
    deadline: int,
    tr: Transaction,
) -> tuple[int, list[tuple[bytes, Run]], dict[str, int]]:
    delta = index.Delta()
    n, dead = index.reap(
        tr, ns, queue, opts, holder=holder, now_ms=now, dead_deadline_ms=deadline, delta=delta
    )
    delta.apply(tr, now)
    return n, dead, index.stats(tr, ns, queue)


def _queue_full(ns: str, queue: str, result: Enqueued) -> QueueFull:
    limit = (result.ctx.opts.max_bytes or 0) // (1024 * 1024)
    return QueueFull(
        f"queue {queue!r} is full: {result.queue_bytes} bytes stored, max_size_mb is {limit}",
        details={"namespace": ns, "queue": queue},
    )
