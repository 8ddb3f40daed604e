"""Claim rounds: this broker's batched transactions for its queue consumers.

Per-message calls (``settle`` for acks and rejections) never await and never start a
transaction.  Acks, rejections, claims for every local consumer with credit, lease renewals
and finished dead letters are gathered and applied in *rounds*: one meta transaction each,
one at a time, group-commit style (while a round runs, new work waits for the next).  When
the batcher is about to flush anyway, the round rides in the flush's transaction (a
zero-byte chunk), so at steady state publishing, claiming and acknowledging cost one
transaction per flush between them — and a claim in that transaction sees the messages the
same flush enqueued.  With a prompt batcher (adaptive group commit on local disk) a local
enqueue wakes a round that joins the very flush carrying the message, so that publish to
delivery is one flush (``enqueue_submitted``), not a flush and then a claim transaction.

A round is four steps: ``_take`` the pending work as a ``Round`` (round_txn.py; its
``work`` is the transaction), ``_commit`` it, then ``_apply_settled`` and ``_apply_claims`` turn the outcome
into lease updates and deliveries; when the transaction fails, ``_restore`` puts the work
back for the next round.  Nothing is acknowledged to a consumer or forgotten before its
transaction has committed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import flowmq_metrics as metrics
from flowmq_commit.batcher import GroupCommitBatcher
from flowmq_commit.clock import Clock
from flowmq_core.message import Message
from flowmq_core.periodic import PeriodicTask
from flowmq_meta import MetaStore
from flowmq_objstore import ObjectStore, ObjectStoreError
from flowmq_queue import index
from flowmq_queue.bodies import BodyCache, load_run
from flowmq_queue.consumers import (
    DEFAULT_WINDOW,
    MAX_AHEAD,
    PENDING,
    Consumer,
    Delivery,
    Lease,
    LocalQueue,
)
from flowmq_queue.entries import Run
from flowmq_queue.index import QueueOptions, Settle, Want
from flowmq_queue.round_txn import ClaimPlan, Ops, Round, RoundCommit, RoundResult

log = logging.getLogger("flowmq_queue")

# Queues whose consumers wait without a watch are re-checked this often (watches can be lost).
POLL_S = 1.0
_RETRY_S = 0.2
# A watch on a queue fired while this broker enqueued messages claimed ahead into it (their
# commits change the watched key): the claim that looks for other brokers' messages waits
# this long, so it runs once per interval rather than once per flush.
OWN_WRITES_S = 0.05

OptionsFn = Callable[[str, str], QueueOptions | None]
PublishDeadFn = Callable[[str, str, bytes, Run], Awaitable[None]]
"""``publish_dead(ns, queue, key, run)``: publish the dead letters of a run; calls
``ClaimRounds.dead_letter_done`` once they are out."""


@dataclasses.dataclass(frozen=True, eq=False)
class QueueParts:
    """What a queue engine and its claim rounds share: the stores, the batcher, the body
    cache, each queue's options, the lease holder's name and lease length, the clock."""

    meta: MetaStore
    objects: ObjectStore
    batcher: GroupCommitBatcher
    cache: BodyCache
    options: OptionsFn
    holder: str
    lease_ms: int
    clock: Clock


class ClaimRounds:
    """This broker's local consumers of queues and the rounds that claim and settle for
    them (see the module docstring)."""

    def __init__(self, parts: QueueParts, *, publish_dead: PublishDeadFn, piggyback: bool) -> None:
        self.parts = parts
        self.publish_dead = publish_dead
        self.piggyback = piggyback
        self.rounds = 0
        self._queues: dict[tuple[str, str], LocalQueue] = {}
        self._consumers: dict[str, Consumer] = {}
        self._leases: dict[int, Lease] = {}
        self._ops: dict[Lease, Ops] = {}
        self._dead_done: list[tuple[str, str, bytes, Run]] = []
        self._gets: list[Consumer] = []
        # Consumers given deliveries claimed ahead since the last ``hand_out_ahead``.
        self._ahead_pump: list[Consumer] = []
        self._claim_base = 0
        self._round_commit = RoundCommit()
        self._riding: Round | None = None  # the round riding a flush now, if any
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._background: set[asyncio.Task[Any]] = set()
        self._poll = PeriodicTask("queue-poll", POLL_S, self._poll_once)
        self._renew = PeriodicTask("queue-renew", parts.lease_ms / 4000, self._renew_due)

    # --- life cycle ------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._wakeup = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._run(), name="queue-rounds")
            self._poll.start()
            self._renew.start()

    async def close(self) -> None:
        """Persist what is pending (acks, requeues of closed consumers), then stop."""
        if self._closing:
            return
        self._closing = True
        for consumer in list(self._consumers.values()):
            consumer.active = False
        await self._poll.stop()
        await self._renew.stop()
        self.kick()
        if self._task is not None:
            try:
                await asyncio.wait_for(self._task, 10)
            except (TimeoutError, asyncio.CancelledError):
                self._task.cancel()
        for task in list(self._background):
            task.cancel()

    def pending(self) -> bool:
        """Settles or finished dead letters are waiting for a round."""
        return bool(self._ops or self._dead_done)

    def kick(self) -> None:
        if self._wakeup is not None:
            self._wakeup.set()

    def spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.get_running_loop().create_task(coro)  # type: ignore[arg-type]
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # --- consumers -------------------------------------------------------------------------

    def add(self, consumer: Consumer) -> None:
        self._consumers[consumer.cid] = consumer
        lq = self._local(consumer.ns, consumer.queue)
        lq.consumers.append(consumer)
        lq.maybe_ready = True
        lq.backlog = True
        self.start()
        self.kick()

    def add_get(self, consumer: Consumer) -> None:
        """A Basic.Get: claimed for in the next round, answered through its future."""
        self._consumers[consumer.cid] = consumer
        self._gets.append(consumer)
        self.start()
        self.kick()

    def cancel(self, consumer: Consumer) -> None:
        consumer.active = False
        lq = self._queues.get((consumer.ns, consumer.queue))
        if lq is not None and consumer in lq.consumers:
            lq.consumers.remove(consumer)
        if consumer.buffer or consumer.held:
            self.give_back([*consumer.buffer, *consumer.held])
            consumer.buffer.clear()
            consumer.held.clear()
        self._forget_if_done(consumer)

    def _forget_if_done(self, consumer: Consumer) -> None:
        """A cancelled consumer is looked up by id only while a round claims for it (its
        ``reserved``); after that, keeping it would keep its callback and all that holds."""
        if not consumer.active and consumer.reserved <= 0 and consumer.get_future is None:
            self._consumers.pop(consumer.cid, None)

    def consumer_count(self, ns: str, queue: str) -> int:
        lq = self._queues.get((ns, queue))
        return 0 if lq is None else sum(1 for c in lq.consumers if c.active)

    def forget(self, ns: str, queue: str) -> None:
        """The queue is being deleted: stop its consumers, drop its leases and their ops."""
        lq = self._queues.pop((ns, queue), None)
        if lq is not None:
            for c in lq.consumers:
                c.active = False
        for lease in list(self._leases.values()):
            if (lease.ns, lease.queue) == (ns, queue):
                lease.gone = True
                self._leases.pop(id(lease), None)
                self._ops.pop(lease, None)

    def _local(self, ns: str, queue: str) -> LocalQueue:
        lq = self._queues.get((ns, queue))
        if lq is None:
            lq = self._queues[(ns, queue)] = LocalQueue(ns, queue)
        return lq

    def enqueue_submitted(self, ns: str, queue: str) -> int:
        """A local enqueue was handed to the batcher: wake a round to ride the same flush
        (it runs before the batcher takes the flush: see the batcher's one-iteration
        settle), whose claim then sees the message in the flush's own transaction.  Returns
        the stamp the enqueue's ``mark_ready`` passes back (0: no local consumer)."""
        lq = self._queues.get((ns, queue))
        if lq is None:
            return 0
        lq.backlog = True
        if not lq.consumers:
            return 0
        lq.submitted += 1
        lq.maybe_ready = True
        wakeup = self._wakeup
        if wakeup is not None and not wakeup.is_set() and self.parts.batcher.prompt:
            wakeup.set()
        return lq.submitted

    def mark_ready(self, ns: str, queue: str, stamp: int = 0, flush_key: str = "") -> None:
        """Messages were committed to the queue (or returned to it): claim soon, unless a
        round riding this flush or a later one claims after the enqueue ``stamp``.
        ``flush_key``: the object of the flush that committed them, if one did."""
        lq = self._queues.get((ns, queue))
        if lq is not None:
            if stamp > lq.committed:
                lq.committed = stamp
            if 0 < stamp <= lq.covered:
                return
            lq.backlog = True
            riding = self._riding
            if (
                stamp
                and riding is not None
                and riding.flush_key == flush_key
                and any(planned is lq for planned, _, _, _ in riding.claims)
            ):
                # The round riding this flush claimed for the queue after its enqueues
                # (even those submitted after the round was): it saw these messages.
                lq.covered = max(lq.covered, stamp)
                return
            lq.maybe_ready = True
            lq.dirty += 1
            lq.fresh = True
            if any(c.credit() for c in lq.consumers):
                self.kick()

    def claim_ahead(self, ns: str, queue: str, message: Message, size: int) -> Delivery | None:
        """Claim a message being published on this broker for a local consumer, before it is
        stored: its enqueue then writes it leased to that consumer (no ready entry, no claim
        round).  While the queue has no older ready messages of this broker's
        (``LocalQueue.backlog``), it goes out at the end of this loop iteration, within the
        consumer's credit: a waiting consumer gets it without waiting for the flush, as
        RabbitMQ delivers before its fsync.  Otherwise it is *held* (``Consumer.held``, up to
        ``MAX_AHEAD`` windows) until the older ones have gone out to that consumer, so that
        publishing goes on claiming ahead and the backlog drains instead of every new
        message joining it.  The publisher's confirm still waits for the commit; if the flush
        fails, the delivery's settles are dropped (nothing was stored to settle).  None when
        no consumer that takes claims ahead has room: the caller enqueues the usual way."""
        lq = self._queues.get((ns, queue))
        if lq is None or self._closing:
            return None
        consumers = lq.consumers
        n = len(consumers)
        backlog = lq.backlog
        for i in range(n):
            c = consumers[(lq.ahead_turn + i) % n]
            if not c.claim_ahead or c.no_ack or not c.active or c.paused:
                continue
            window = c.prefetch or DEFAULT_WINDOW
            if backlog:
                if len(c.held) >= window * MAX_AHEAD:
                    continue
            elif window * c.ahead <= c.unacked + len(c.buffer):
                continue
            lq.ahead_turn = (lq.ahead_turn + i + 1) % n
            lq.ahead_submitted += 1
            delivery = Delivery(c, None, PENDING, message, False, ("", 0), size)
            if backlog:
                c.held.append(delivery)
            else:
                c.buffer.append(delivery)
                if not c.pump_scheduled:
                    self._ahead_pump.append(c)
                    self.pump_soon(c)
            return delivery
        return None

    def hand_out_ahead(self) -> None:
        """Deliver what was claimed ahead so far, now (the caller's run of publishes is
        over) rather than in the next loop iteration: the consumer's connection then writes
        it at the start of that iteration, before the next reads are handled."""
        consumers, self._ahead_pump = self._ahead_pump, []
        for c in consumers:
            c.pump()

    def claimed_ahead(
        self, ns: str, queue: str, shard: int, key: bytes, run: Run, deliveries: list[Delivery]
    ) -> None:
        """The enqueue of ``deliveries`` (claimed ahead, in ``run``'s order) committed them
        leased under ``key``: give them the lease, and apply what was settled meanwhile."""
        lease = Lease(ns, queue, shard, key, run, deliveries[0].consumer)
        self._leases[id(lease)] = lease
        early = None
        for d, seq, start in zip(deliveries, run.seqs, run.starts, strict=True):
            d.lease = lease
            d.seq = seq
            d.stored = None
            d.location = (run.object_key, start)
            if d.early:
                if early is None:
                    early = self._ops.get(lease) or self._ops.setdefault(lease, Ops())
                getattr(early, d.early).add(seq)
        if early is not None:
            self.kick()

    def pump_soon(self, consumer: Consumer) -> None:
        """Deliver buffered messages once this loop iteration's acks are all counted."""
        if consumer.buffer and not consumer.pump_scheduled:
            consumer.pump_scheduled = True
            # The rounds task's loop: ``get_running_loop()`` costs a getpid() system call.
            loop = self._task.get_loop() if self._task is not None else asyncio.get_running_loop()
            loop.call_soon(consumer.pump)

    def settle(self, delivery: Delivery, what: str) -> None:
        """Record an ack (``what`` ``"ack"``), requeue or dead-lettering for the next round."""
        lease = delivery.lease
        consumer = delivery.consumer
        if consumer.get_future is None and consumer.unacked > 0:
            consumer.unacked -= 1
            if consumer.buffer:
                self.pump_soon(consumer)
            elif consumer.reserved and consumer.ahead < MAX_AHEAD:
                # Starved: acked everything it had while a claim is still on its way.
                consumer.ahead += 1
        if delivery.seq == PENDING:  # claimed ahead: settled once its enqueue commits
            delivery.early = what
            return
        if lease is None or lease.gone:
            return
        ops = self._ops.get(lease)
        if ops is None:
            ops = self._ops[lease] = Ops()
        getattr(ops, what).add(delivery.seq)
        self.kick()

    def give_back(self, deliveries: list[Delivery]) -> None:
        """Claimed for a consumer that went away before delivery: back, attempt unchanged."""
        for d in deliveries:
            if d.seq == PENDING:
                d.early = "release"
            elif d.lease is not None and not d.lease.gone:
                self._ops.setdefault(d.lease, Ops()).release.add(d.seq)
        self.kick()

    def dead_letter_done(self, ns: str, queue: str, key: bytes, run: Run) -> None:
        """The dead letters of ``run`` are published: the next round forgets them."""
        self._dead_done.append((ns, queue, key, run))
        self.kick()

    # --- rounds ----------------------------------------------------------------------------

    async def _run(self) -> None:
        assert self._wakeup is not None
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            try:
                while await self._round():
                    pass
            except Exception:
                log.exception("queue round failed")
                await asyncio.sleep(_RETRY_S)
                self._wakeup.set()
            if self._closing and not self._ops and not self._dead_done:
                return

    async def _round(self) -> bool:
        """One transaction of pending work; False when there was none."""
        round_ = self._take()
        if round_ is None:
            return False
        try:
            result = await self._commit(round_)
        except Exception:
            log.warning("queue round failed; retrying", exc_info=True)
            self._restore(round_)
            await asyncio.sleep(_RETRY_S)
            return True
        self.rounds += 1
        self._apply_settled(result)
        await self._apply_claims(result, round_.dirty)
        for lq, watch in result.watches:
            self._watch(lq, watch)
        return True

    def _take(self) -> Round | None:
        """The pending work as one round (None: nothing to do)."""
        now = self.parts.clock()
        lease_deadline = now + self.parts.lease_ms
        ops, self._ops = self._ops, {}
        dead_done, self._dead_done = self._dead_done, []
        settles = [
            self._settle_entry(lease, o, lease_deadline if self._renewal_due(lease, now) else None)
            for lease, o in ops.items()
            if not lease.gone
        ]
        settles += [
            self._settle_entry(lease, None, lease_deadline)
            for lease in self._leases.values()
            if lease not in ops and not lease.gone and self._renewal_due(lease, now)
        ]
        claims = [] if self._closing else self._collect_claims()
        if not settles and not claims and not dead_done:
            return None
        base = self._claim_base
        self._claim_base += 1_000_000
        dirty = {id(lq): (lq.dirty, lq.submitted, lq.committed) for lq, _, _, _ in claims}
        return Round(
            now, lease_deadline, self.parts.holder, base, ops, dead_done, settles, claims, dirty
        )

    async def _commit(self, round_: Round) -> RoundResult:
        # A round rides the next flush when one with bytes is coming anyway (transactions),
        # except claims of freshly committed messages (latency: the next flush may only
        # start after the one in flight); otherwise it is a transaction of its own, which
        # runs while a flush in flight writes its object.  (A round woken by a local enqueue
        # is taken before that enqueue commits, so it is not urgent and rides its flush.)
        batcher = self.parts.batcher
        urgent = any(lq.fresh for lq, _, _, _ in round_.claims)
        for lq, _, _, _ in round_.claims:
            lq.fresh = False
        rides = batcher.pending_bytes > 0 and not urgent
        # During an object-store outage the batcher refuses chunks; the meta store may work.
        if self.piggyback and rides and batcher.outage is None:
            for lq, _, _, _ in round_.claims:
                lq.covered = lq.submitted  # committed after every enqueue submitted so far
            self._riding = round_
            try:
                return await batcher.submit(("queue-round",), b"", self._round_commit, round_)
            finally:
                self._riding = None
        return await self.parts.meta.transact(round_.work)

    def _restore(self, round_: Round) -> None:
        """The round's transaction failed: its work waits for the next one."""
        for lease, o in round_.ops.items():
            self._ops.setdefault(lease, Ops()).merge(o)
        self._dead_done.extend(round_.dead_done)
        for lq, _, wants, _ in round_.claims:
            lq.covered = 0  # the enqueues it covered may have committed: claim again
            lq.maybe_ready = True
            for w in wants:
                c = self._consumers.get(w.consumer)
                if c is not None:
                    c.reserved -= w.n
                    if c.get_future is not None and not c.get_future.done():
                        self._gets.append(c)
                    self._forget_if_done(c)

    def _settle_entry(
        self, lease: Lease, o: Ops | None, new_deadline: int | None
    ) -> tuple[Lease, Settle, QueueOptions]:
        """What a round does with ``lease``: apply ``o`` and/or move its deadline."""
        sets = (
            ()
            if o is None
            else (frozenset(o.ack), frozenset(o.requeue), frozenset(o.release), frozenset(o.dead))
        )
        settle = Settle(
            lease.ns,
            lease.queue,
            lease.shard,
            lease.key,
            lease.run,
            *sets,
            new_deadline=new_deadline,
        )
        return lease, settle, self.parts.options(lease.ns, lease.queue) or QueueOptions()

    def _renewal_due(self, lease: Lease, now: int) -> bool:
        return lease.run.deadline_ms - now < self.parts.lease_ms // 2

    def _collect_claims(self) -> list[ClaimPlan]:
        out = []
        gets, self._gets = self._gets, []
        by_queue: dict[tuple[str, str], list[Consumer]] = {}
        for g in gets:
            by_queue.setdefault((g.ns, g.queue), []).append(g)
        for key in {*by_queue, *self._queues}:
            lq = self._local(*key)
            wants: list[Want] = []
            queue_gets = by_queue.get(key, [])
            for g in queue_gets:
                wants.append(Want(g.cid, 1, g.no_ack))
                g.reserved = 1
            if lq.maybe_ready and lq.consumers:
                n = len(lq.consumers)
                lq.turn = (lq.turn + 1) % n
                for c in lq.consumers[lq.turn :] + lq.consumers[: lq.turn]:
                    credit = c.credit()
                    if credit > 0:
                        wants.append(Want(c.cid, credit, c.no_ack))
                        c.reserved += credit
            if not wants:
                continue
            opts = self.parts.options(*key)
            if opts is None:  # the queue is gone
                for g in queue_gets:
                    g.finish_get(None)
                for w in wants:
                    c = self._consumers.get(w.consumer)
                    if c is not None:
                        c.reserved -= w.n
                        self._forget_if_done(c)
                continue
            out.append((lq, opts, wants, len(queue_gets) == len(wants)))
        return out

    # --- applying a round's outcome --------------------------------------------------------

    def _apply_settled(self, result: RoundResult) -> None:
        for lease, out in result.settled:
            labels = (lease.ns, lease.queue)
            if out.stale:
                lease.gone = True
                self._leases.pop(id(lease), None)
                continue
            if out.acked:
                metrics.queue_messages_acked_count.labels(*labels).inc(out.acked)
            if out.redelivered:
                metrics.queue_messages_redelivered_count.labels(*labels).inc(out.redelivered)
                self.mark_ready(*labels)
            if out.dead_dropped:
                metrics.queue_messages_dead_lettered_count.labels(*labels).inc(out.dead_dropped)
            if out.key is None:
                lease.gone = True
                self._leases.pop(id(lease), None)
            else:
                lease.key, lease.run = out.key, out.run  # type: ignore[assignment]
            for key, run in out.dead:
                self.spawn(self.publish_dead(lease.ns, lease.queue, key, run))

    async def _apply_claims(
        self, result: RoundResult, dirty: dict[int, tuple[int, int, int]]
    ) -> None:
        handouts: list[tuple[Consumer, list[Delivery]]] = []
        for lq, wants, claimed, expired in result.claims:
            self._account_claim(lq, wants, claimed, expired, dirty)
            by_consumer: dict[str, list[index.Claimed]] = {}
            for c in claimed:
                by_consumer.setdefault(c.consumer, []).append(c)
            for w in wants:
                consumer = self._consumers.get(w.consumer)
                parts = by_consumer.get(w.consumer, [])
                if consumer is None:
                    continue
                if consumer.get_future is not None:
                    self._consumers.pop(consumer.cid, None)
                handouts.append((consumer, await self._deliveries(lq, consumer, parts)))
        for consumer, deliveries in handouts:
            self._hand_out(consumer, deliveries, result)
            self._forget_if_done(consumer)
        for lq, _, _, _ in result.claims:
            if not lq.backlog:
                for consumer in lq.consumers:
                    if consumer.held:  # nothing older is left to go out before them
                        consumer.buffer.extend(consumer.held)
                        consumer.held.clear()
                        consumer.pump()

    def _account_claim(
        self,
        lq: LocalQueue,
        wants: list[Want],
        claimed: list[index.Claimed],
        expired: int,
        dirty: dict[int, tuple[int, int, int]],
    ) -> None:
        """Release the wants' reservations; a queue that gave less than asked (and had no
        local enqueue committed or submitted since) is not claimed from again until
        something marks it ready.  (An enqueue submitted meanwhile is in a later flush: the
        next round rides that flush and claims it in the same transaction, rather than in a
        transaction of its own once it committed.)"""
        for w in wants:
            c = self._consumers.get(w.consumer)
            if c is not None:
                c.reserved = max(0, c.reserved - w.n)
        got = sum(len(c.run) for c in claimed)
        taken = dirty.get(id(lq))
        if got < sum(w.n for w in wants if not w.consumer.startswith("get#")):
            if _nothing_new(lq, taken):
                lq.maybe_ready = False
            if _no_backlog(lq, taken):
                lq.backlog = False
        elif got:
            lq.backlog = True  # (other brokers' enqueues: more may be left)
        if expired:
            log.debug("dropped %d expired messages of %s/%s", expired, lq.ns, lq.name)

    async def _deliveries(
        self, lq: LocalQueue, consumer: Consumer, parts: list[index.Claimed]
    ) -> list[Delivery]:
        """The claimed runs as deliveries, with leases (unless no-ack) and their bodies."""
        deliveries: list[Delivery] = []
        for part in parts:
            lease = None
            if not part.auto_ack:
                key = index.inflight_key(lq.ns, lq.name, part.shard, part.run.first)
                lease = Lease(lq.ns, lq.name, part.shard, key, part.run, consumer)
                self._leases[id(lease)] = lease
            try:
                messages = await load_run(self.parts.objects, self.parts.cache, part.run)
            except Exception as exc:
                if isinstance(exc, ObjectStoreError):  # an outage: one line, not a traceback
                    log.warning("could not read bodies of %s/%s: %s", lq.ns, lq.name, exc)
                else:
                    log.exception("could not read bodies of %s/%s", lq.ns, lq.name)
                if lease is not None:
                    self._ops.setdefault(lease, Ops()).release.update(part.run.seqs)
                continue
            run = part.run
            for i, message in enumerate(messages):
                deliveries.append(
                    Delivery(
                        consumer,
                        lease,
                        run.seqs[i],
                        message,
                        run.attempts[i] > 0,
                        (run.object_key, run.starts[i]),
                        run.sizes[i],
                    )
                )
                if lease is None:
                    self.parts.cache.discard((run.object_key, run.starts[i]))
        return deliveries

    def _hand_out(
        self, consumer: Consumer, deliveries: list[Delivery], result: RoundResult
    ) -> None:
        if consumer.get_future is not None:
            ready = result.ready_left.get((consumer.ns, consumer.queue), 0)
            consumer.finish_get(deliveries[0] if deliveries else None, ready)
            return
        if not deliveries:
            return
        if not consumer.active or consumer.deliver is None:
            self.give_back(deliveries)
            return
        if consumer.held:
            _merge_held(consumer, deliveries)
        else:
            consumer.buffer.extend(deliveries)
        consumer.pump()

    def _watch(self, lq: LocalQueue, watch: Any) -> None:
        lq.watching = True
        armed_at = lq.ahead_submitted

        async def wait() -> None:
            try:
                await watch
                if lq.ahead_submitted != armed_at:
                    # This broker's own enqueues claimed ahead change the watched seq too
                    # (and need no claim): look for other brokers' messages a little later,
                    # once for all of them, not after every flush.
                    await asyncio.sleep(OWN_WRITES_S)
            except Exception:
                pass
            finally:
                lq.watching = False
            lq.maybe_ready = True
            self.kick()

        self.spawn(wait())

    async def _poll_once(self) -> None:
        for lq in self._queues.values():
            if not lq.maybe_ready and not lq.watching and any(c.credit() for c in lq.consumers):
                lq.maybe_ready = True
                self.kick()

    async def _renew_due(self) -> None:
        now = self.parts.clock()
        if any(self._renewal_due(lease, now) for lease in self._leases.values()):
            self.kick()


def _nothing_new(lq: LocalQueue, taken: tuple[int, int, int] | None) -> bool:
    """Nothing was committed to the queue since the round was ``taken`` (its ``dirty`` and
    ``submitted`` then), and nothing submitted that the round did not see."""
    if taken is None:
        return False
    dirty, submitted, _ = taken
    return lq.dirty == dirty and (lq.submitted == submitted or lq.submitted <= lq.covered)


def _no_backlog(lq: LocalQueue, taken: tuple[int, int, int] | None) -> bool:
    """A round ``taken`` then claimed fewer than it wanted: were this broker's ready messages
    all among them?  Yes if nothing was committed or returned to the queue since that the
    round did not see, and every local enqueue submitted so far (not claimed ahead) had
    committed before the round was taken or was covered by it (committed in its flush)."""
    if taken is None:
        return False
    dirty, _, committed = taken
    return lq.dirty == dirty and lq.submitted <= max(lq.covered, committed)


def _merge_held(consumer: Consumer, deliveries: list[Delivery]) -> None:
    """Buffer claimed ``deliveries`` (stored, in seq order) with the consumer's held ones in
    seq order: a held delivery older than a claimed one goes out before it.  One whose flush
    is still in flight is newer than anything stored, and one whose flush failed (its seq
    never came) is dropped: it was never stored, its publisher was refused."""
    held = consumer.held
    buffer = consumer.buffer
    for d in deliveries:
        while held:
            h = held[0]
            if h.seq == PENDING:
                if h.stored is None or not h.stored.done():
                    break
                held.popleft()  # failed
                continue
            if h.seq > d.seq:
                break
            buffer.append(held.popleft())
        buffer.append(d)
