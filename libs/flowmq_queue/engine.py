"""``QueueEngine``: this broker's side of every Queue — enqueue, consumers, claims, acks.

Per-message calls (``enqueue``, ``ack``, ``reject``) never await and never start a
transaction.  Acks, rejections, claims for every local consumer with credit, lease renewals
and finished dead letters are gathered and applied in *rounds*: one meta transaction each,
one at a time, group-commit style (while a round runs, new work waits for the next).  When
the batcher is about to flush anyway, the round rides in the flush's transaction (a
zero-byte chunk), so at steady state publishing, claiming and acknowledging cost one
transaction per flush between them — and a claim in that transaction sees the messages the
same flush enqueued.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import itertools
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import flowmq_metrics as metrics
from flowmq_commit.batcher import GroupCommit, GroupCommitBatcher
from flowmq_commit.clock import Clock
from flowmq_core.message import Message, now_ms
from flowmq_core.periodic import PeriodicTask
from flowmq_meta import MetaStore, Transaction
from flowmq_objstore import ObjectStore
from flowmq_queue import index
from flowmq_queue.bodies import BodyCache, load_run
from flowmq_queue.codec import encode_message
from flowmq_queue.enqueue import REFUSED, EnqueueCommit, EnqueueCtx, Enqueued
from flowmq_queue.entries import Run
from flowmq_queue.errors import QueueFull
from flowmq_queue.index import QueueOptions, Settle, Want

log = logging.getLogger("flowmq_queue")

DEFAULT_LEASE_MS = 10_000
# Claims per consumer per round when prefetch is 0 (unlimited) or for no-ack consumers.
DEFAULT_WINDOW = 1000
# Prefetch windows claimed per consumer (see ``Consumer.credit``), at first and at most: a
# consumer that drains its buffer while a claim is still on its way gets one more window
# ahead, so that one claim transaction covers the time it takes (benchmark, 4 publishers
# -> 1 consumer with prefetch 256: 26k msgs/s and a growing backlog with 2, 43k with 4).
AHEAD = 2
MAX_AHEAD = 4
# Queues whose consumers wait without a watch are re-checked this often (watches can be lost).
POLL_S = 1.0
_RETRY_S = 0.2

OptionsFn = Callable[[str, str], QueueOptions | None]
DeadLetterFn = Callable[[str, Message], list[Awaitable[Any]]]


class Consumer:
    """A consumer of one queue on this broker; ``deliver`` gets each batch of deliveries."""

    __slots__ = (
        "active",
        "ahead",
        "cid",
        "deliver",
        "get_future",
        "no_ack",
        "ns",
        "buffer",
        "paused",
        "prefetch",
        "pump_scheduled",
        "queue",
        "reserved",
        "tag",
        "unacked",
    )

    def __init__(
        self,
        ns: str,
        queue: str,
        tag: str,
        cid: str,
        deliver: Callable[[list[Delivery]], None] | None,
        prefetch: int,
        no_ack: bool,
    ) -> None:
        self.ns = ns
        self.queue = queue
        self.tag = tag
        self.cid = cid
        self.deliver = deliver
        self.prefetch = prefetch
        self.no_ack = no_ack
        self.unacked = 0
        self.reserved = 0
        self.active = True
        self.paused = False
        self.buffer: collections.deque[Delivery] = collections.deque()
        self.pump_scheduled = False
        self.ahead = AHEAD
        # Basic.Get: resolves to (the delivery or None, ready messages left).
        self.get_future: asyncio.Future[tuple[Delivery | None, int]] | None = None

    def credit(self) -> int:
        """How many more to claim.  Up to ``ahead`` prefetch windows are claimed, the part
        beyond the window waiting in ``buffer``: an ack then frees a delivery at once instead
        of after a claim transaction, which would cap a consumer at one window per round."""
        if not self.active or self.paused:
            return 0
        limit = (self.prefetch or DEFAULT_WINDOW) * self.ahead
        return max(0, limit - self.unacked - len(self.buffer) - self.reserved)

    def room(self) -> int:
        """How many buffered deliveries may go out now."""
        if not self.active or self.paused:
            return 0
        if self.no_ack:
            return len(self.buffer)
        return max(0, (self.prefetch or DEFAULT_WINDOW) - self.unacked)


class Delivery:
    __slots__ = ("consumer", "lease", "location", "message", "redelivered", "seq", "size")

    def __init__(
        self,
        consumer: Consumer,
        lease: _Lease | None,
        seq: int,
        message: Message,
        redelivered: bool,
        location: tuple[str, int],
        size: int,
    ) -> None:
        self.consumer = consumer
        self.lease = lease
        self.seq = seq
        self.message = message
        self.redelivered = redelivered
        self.location = location
        self.size = size


class _Lease:
    """This broker's mirror of one of its in-flight entries."""

    __slots__ = ("consumer", "gone", "key", "ns", "queue", "run", "shard")

    def __init__(
        self, ns: str, queue: str, shard: int, key: bytes, run: Run, consumer: Consumer
    ) -> None:
        self.ns = ns
        self.queue = queue
        self.shard = shard
        self.key = key
        self.run = run
        self.consumer = consumer
        self.gone = False


class _Ops:
    __slots__ = ("ack", "dead", "release", "requeue")

    def __init__(self) -> None:
        self.ack: set[int] = set()
        self.requeue: set[int] = set()
        self.release: set[int] = set()
        self.dead: set[int] = set()

    def merge(self, other: _Ops) -> None:
        self.ack |= other.ack
        self.requeue |= other.requeue
        self.release |= other.release
        self.dead |= other.dead


class _LocalQueue:
    __slots__ = ("consumers", "dirty", "fresh", "maybe_ready", "name", "ns", "turn", "watching")

    def __init__(self, ns: str, name: str) -> None:
        self.ns = ns
        self.name = name
        self.consumers: list[Consumer] = []
        self.maybe_ready = True
        self.watching = False
        self.dirty = 0  # bumped by every local enqueue commit / requeue
        self.fresh = False  # messages committed since the last claim: claim without delay
        self.turn = 0


class _RoundCommit(GroupCommit):
    """A round riding in a flush: a zero-byte chunk whose ``ctx`` is the round's transaction
    function, called with the flush's object key to protect (``index.Delta.apply``).  It
    writes no entry pointing into the object."""

    def commit(
        self, tr: Transaction, group: Any, object_key: str, chunks: list[tuple[int, int, Any]]
    ) -> tuple[list[Any], int]:
        return [work(tr, object_key) for _, _, work in chunks], 0


@dataclasses.dataclass
class _RoundResult:
    settled: list[tuple[_Lease, index.Settled]] = dataclasses.field(default_factory=list)
    claims: list[tuple[_LocalQueue, list[Want], list[index.Claimed], int]] = dataclasses.field(
        default_factory=list
    )
    watches: list[tuple[_LocalQueue, Any]] = dataclasses.field(default_factory=list)
    ready_left: dict[tuple[str, str], int] = dataclasses.field(default_factory=dict)


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
        self.meta = meta
        self.objects = objects
        self.batcher = batcher
        self.options = options
        self.dead_letter = dead_letter
        self.holder = holder or f"q-{secrets.token_hex(6)}"
        self.lease_ms = lease_ms
        self.cache = cache if cache is not None else BodyCache()
        self.clock = clock
        self.piggyback = piggyback
        self.rounds = 0
        self._commit = EnqueueCommit(self._enqueued)
        self._round_commit = _RoundCommit()
        self._queues: dict[tuple[str, str], _LocalQueue] = {}
        self._consumers: dict[str, Consumer] = {}
        self._leases: dict[int, _Lease] = {}
        self._ops: dict[_Lease, _Ops] = {}
        self._dead_done: list[tuple[str, str, bytes, Run]] = []
        self._gets: list[Consumer] = []
        self._cids = itertools.count(1)
        self._claim_base = 0
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._background: set[asyncio.Task[Any]] = set()
        self._poll = PeriodicTask("queue-poll", POLL_S, self._poll_once)
        self._renew = PeriodicTask("queue-renew", lease_ms / 4000, self._renew_due)
        self.ready_hint: dict[tuple[str, str], int] = {}

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
        self._kick()
        if self._task is not None:
            try:
                await asyncio.wait_for(self._task, 10)
            except (TimeoutError, asyncio.CancelledError):
                self._task.cancel()
        for task in list(self._background):
            task.cancel()

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
        ctx = EnqueueCtx(message, expires, opts)
        future = self.batcher.submit(("q", ns, queue), body, self._commit, ctx)
        ctx.future = future
        return future

    def _enqueued(
        self, group: Any, results: list[Enqueued], object_key: str, sizes: list[int]
    ) -> None:
        _, ns, queue = group
        accepted = 0
        cache = self.cache
        for r, size in zip(results, sizes, strict=True):
            if r.seq != REFUSED:
                cache.put((object_key, r.start), r.ctx.message, size)
                accepted += 1
            elif not r.ctx.future.done():
                r.ctx.future.set_exception(_queue_full(ns, queue, r))
        if accepted:
            metrics.queue_messages_enqueued_count.labels(ns, queue).inc(accepted)
            self._mark_ready(ns, queue)

    def _mark_ready(self, ns: str, queue: str) -> None:
        lq = self._queues.get((ns, queue))
        if lq is not None:
            lq.maybe_ready = True
            lq.dirty += 1
            lq.fresh = True
            if any(c.credit() for c in lq.consumers):
                self._kick()

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
    ) -> Consumer:
        consumer = Consumer(ns, queue, tag, f"{tag}#{next(self._cids)}", deliver, prefetch, no_ack)
        self._consumers[consumer.cid] = consumer
        lq = self._local(ns, queue)
        lq.consumers.append(consumer)
        lq.maybe_ready = True
        self.start()
        self._kick()
        return consumer

    def _local(self, ns: str, queue: str) -> _LocalQueue:
        lq = self._queues.get((ns, queue))
        if lq is None:
            lq = self._queues[(ns, queue)] = _LocalQueue(ns, queue)
        return lq

    def cancel(self, consumer: Consumer) -> None:
        """Stop delivering to ``consumer``; its unacknowledged messages stay leased to it
        until acked or rejected (AMQP Basic.Cancel semantics)."""
        consumer.active = False
        lq = self._queues.get((consumer.ns, consumer.queue))
        if lq is not None and consumer in lq.consumers:
            lq.consumers.remove(consumer)
        if consumer.buffer:
            self._return(list(consumer.buffer))
            consumer.buffer.clear()

    def set_paused(self, consumer: Consumer, paused: bool) -> None:
        consumer.paused = paused
        if not paused:
            self._pump_soon(consumer)
            self._kick()

    def _pump_soon(self, consumer: Consumer) -> None:
        """Deliver buffered messages once this loop iteration's acks are all counted."""
        if consumer.buffer and not consumer.pump_scheduled:
            consumer.pump_scheduled = True
            # The rounds task's loop: ``get_running_loop()`` costs a getpid() system call.
            loop = self._task.get_loop() if self._task is not None else asyncio.get_running_loop()
            loop.call_soon(self._pump, consumer)

    def _pump(self, consumer: Consumer) -> None:
        consumer.pump_scheduled = False
        n = min(consumer.room(), len(consumer.buffer))
        if n <= 0 or consumer.deliver is None:
            return
        buffer = consumer.buffer
        batch = [buffer.popleft() for _ in range(n)]
        if not consumer.no_ack:
            consumer.unacked += n
        try:
            consumer.deliver(batch)
        except Exception:
            log.exception("delivery to consumer %s failed", consumer.tag)

    def get(
        self, ns: str, queue: str, *, no_ack: bool = False
    ) -> asyncio.Future[tuple[Delivery | None, int]]:
        """Basic.Get: (one message or None, ready messages left), without waiting for a
        message to arrive."""
        consumer = Consumer(ns, queue, "", f"get#{next(self._cids)}", None, 1, no_ack)
        consumer.get_future = asyncio.get_running_loop().create_future()
        self._consumers[consumer.cid] = consumer
        self._gets.append(consumer)
        self.start()
        self._kick()
        return consumer.get_future

    def ack(self, delivery: Delivery) -> None:
        self._settle(delivery, "ack")
        self.cache.discard(delivery.location)

    def reject(self, delivery: Delivery, *, requeue: bool) -> None:
        """Nack/reject: back to ready with attempt + 1 (``requeue``) or to dead letters."""
        self._settle(delivery, "requeue" if requeue else "dead")

    def _settle(self, delivery: Delivery, what: str) -> None:
        lease = delivery.lease
        consumer = delivery.consumer
        if consumer.get_future is None and consumer.unacked > 0:
            consumer.unacked -= 1
            if consumer.buffer:
                self._pump_soon(consumer)
            elif consumer.reserved and consumer.ahead < MAX_AHEAD:
                # Starved: acked everything it had while a claim is still on its way.
                consumer.ahead += 1
        if lease is None or lease.gone:
            return
        ops = self._ops.get(lease)
        if ops is None:
            ops = self._ops[lease] = _Ops()
        getattr(ops, what).add(delivery.seq)
        self._kick()

    # --- rounds ---------------------------------------------------------------------------

    def _kick(self) -> None:
        if self._wakeup is not None:
            self._wakeup.set()

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
        now = self.clock()
        lease_deadline = now + self.lease_ms
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
            return False
        base = self._claim_base
        self._claim_base += 1_000_000
        holder = self.holder

        def work(tr: Transaction, protect: str | None = None) -> _RoundResult:
            delta = index.Delta()
            result = _RoundResult()
            for lease, s, opts in settles:
                out = index.settle(
                    tr,
                    s,
                    opts,
                    holder=holder,
                    now_ms=now,
                    dead_deadline_ms=lease_deadline,
                    delta=delta,
                )
                result.settled.append((lease, out))
            ids = (str(base + i) for i in itertools.count())
            for lq, opts, wants, gets_only in claims:
                claimed, expired = index.claim(
                    tr,
                    lq.ns,
                    lq.name,
                    opts,
                    wants,
                    holder=holder,
                    claim_ids=ids,
                    now_ms=now,
                    deadline_ms=lease_deadline,
                    delta=delta,
                    protect=protect,
                )
                result.claims.append((lq, wants, claimed, expired))
                got = sum(len(c.run) for c in claimed)
                if got < sum(w.n for w in wants) and not lq.watching and not gets_only:
                    result.watches.append((lq, tr.watch(index.stat_key(lq.ns, lq.name, index.SEQ))))
                if any(w.consumer.startswith("get#") for w in wants):
                    st = index.stats(tr, lq.ns, lq.name)
                    c = delta.counters
                    count = st[index.COUNT] + c.get((lq.ns, lq.name, index.COUNT), 0)
                    leased = st[index.INFLIGHT] + c.get((lq.ns, lq.name, index.INFLIGHT), 0)
                    result.ready_left[(lq.ns, lq.name)] = max(0, count - leased)
            for ns, q, key, run in dead_done:
                index.finish_dead(tr, ns, q, key, run, delta)
            delta.apply(tr, now, protect)
            return result

        dirty = {id(lq): lq.dirty for lq, _, _, _ in claims}
        try:
            # Claims of freshly committed messages go at once (latency); everything else
            # rides the next flush when one is coming anyway (transactions).
            urgent = any(lq.fresh for lq, _, _, _ in claims)
            for lq, _, _, _ in claims:
                lq.fresh = False
            if self.piggyback and not urgent and self.batcher.pending_bytes > 0:
                result = await self.batcher.submit(("queue-round",), b"", self._round_commit, work)
            else:
                result = await self.meta.transact(work)
        except Exception:
            log.warning("queue round failed; retrying", exc_info=True)
            for lease, o in ops.items():
                self._ops.setdefault(lease, _Ops()).merge(o)
            self._dead_done.extend(dead_done)
            for _, _, wants, _ in claims:
                for w in wants:
                    c = self._consumers.get(w.consumer)
                    if c is not None:
                        c.reserved -= w.n
                        if c.get_future is not None and not c.get_future.done():
                            self._gets.append(c)
            await asyncio.sleep(_RETRY_S)
            return True
        self.rounds += 1
        self._apply_settled(result)
        await self._apply_claims(result, dirty)
        for lq, watch in result.watches:
            self._watch(lq, watch)
        return True

    def _settle_entry(
        self, lease: _Lease, o: _Ops | None, new_deadline: int | None
    ) -> tuple[_Lease, Settle, QueueOptions]:
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
        return lease, settle, self.options(lease.ns, lease.queue) or QueueOptions()

    def _renewal_due(self, lease: _Lease, now: int) -> bool:
        return lease.run.deadline_ms - now < self.lease_ms // 2

    def _collect_claims(self) -> list[tuple[_LocalQueue, QueueOptions, list[Want], bool]]:
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
            opts = self.options(*key)
            if opts is None:  # the queue is gone
                for g in queue_gets:
                    _finish_get(g, None)
                for w in wants:
                    c = self._consumers.get(w.consumer)
                    if c is not None:
                        c.reserved -= w.n
                continue
            out.append((lq, opts, wants, len(queue_gets) == len(wants)))
        return out

    def _apply_settled(self, result: _RoundResult) -> None:
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
                self._mark_ready(*labels)
            if out.dead_dropped:
                metrics.queue_messages_dead_lettered_count.labels(*labels).inc(out.dead_dropped)
            if out.key is None:
                lease.gone = True
                self._leases.pop(id(lease), None)
            else:
                lease.key, lease.run = out.key, out.run  # type: ignore[assignment]
            for key, run in out.dead:
                self._spawn(self._publish_dead(lease.ns, lease.queue, key, run))

    async def _apply_claims(self, result: _RoundResult, dirty: dict[int, int]) -> None:
        batches: list[tuple[Consumer, list[Delivery]]] = []
        for lq, wants, claimed, expired in result.claims:
            for w in wants:
                c = self._consumers.get(w.consumer)
                if c is not None:
                    c.reserved = max(0, c.reserved - w.n)
            got = sum(len(c.run) for c in claimed)
            if got < sum(w.n for w in wants if not w.consumer.startswith("get#")) and (
                lq.dirty == dirty.get(id(lq))
            ):
                lq.maybe_ready = False
            if expired:
                log.debug("dropped %d expired messages of %s/%s", expired, lq.ns, lq.name)
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
                deliveries: list[Delivery] = []
                for part in parts:
                    lease = None
                    if not part.auto_ack:
                        key = index.inflight_key(lq.ns, lq.name, part.shard, part.run.first)
                        lease = _Lease(lq.ns, lq.name, part.shard, key, part.run, consumer)
                        self._leases[id(lease)] = lease
                    try:
                        messages = await load_run(self.objects, self.cache, part.run)
                    except Exception:
                        log.exception("could not read bodies of %s/%s", lq.ns, lq.name)
                        if lease is not None:
                            self._ops.setdefault(lease, _Ops()).release.update(part.run.seqs)
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
                            self.cache.discard((run.object_key, run.starts[i]))
                batches.append((consumer, deliveries))
        for consumer, deliveries in batches:
            if consumer.get_future is not None:
                ready = result.ready_left.get((consumer.ns, consumer.queue), 0)
                _finish_get(consumer, deliveries[0] if deliveries else None, ready)
                continue
            if not deliveries:
                continue
            if not consumer.active or consumer.deliver is None:
                self._return(deliveries)
                continue
            consumer.buffer.extend(deliveries)
            self._pump(consumer)

    def _return(self, deliveries: list[Delivery]) -> None:
        """Claimed for a consumer that went away before delivery: back, attempt unchanged."""
        for d in deliveries:
            if d.lease is not None and not d.lease.gone:
                self._ops.setdefault(d.lease, _Ops()).release.add(d.seq)
        self._kick()

    def _watch(self, lq: _LocalQueue, watch: Any) -> None:
        lq.watching = True

        async def wait() -> None:
            try:
                await watch
            except Exception:
                pass
            finally:
                lq.watching = False
            lq.maybe_ready = True
            self._kick()

        self._spawn(wait())

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.get_running_loop().create_task(coro)  # type: ignore[arg-type]
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _poll_once(self) -> None:
        for lq in self._queues.values():
            if not lq.maybe_ready and not lq.watching and any(c.credit() for c in lq.consumers):
                lq.maybe_ready = True
                self._kick()

    async def _renew_due(self) -> None:
        now = self.clock()
        if any(self._renewal_due(lease, now) for lease in self._leases.values()):
            self._kick()

    # --- dead letters -------------------------------------------------------------------------

    async def _publish_dead(self, ns: str, queue: str, key: bytes, run: Run) -> None:
        opts = self.options(ns, queue)
        topic = opts.dead_letter_topic if opts is not None else None
        try:
            if topic is not None and self.dead_letter is not None:
                messages = await load_run(self.objects, self.cache, run)
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
            self.cache.discard((run.object_key, start))
        self._dead_done.append((ns, queue, key, run))
        self._kick()

    # --- whole-queue operations ------------------------------------------------------------

    async def purge(self, ns: str, queue: str) -> int:
        """Drop every ready message; returns how many."""
        total = 0
        while True:
            dropped, more = await self.meta.transact(
                functools.partial(_purge_txn, ns, queue, self.clock())
            )
            total += dropped
            if not more:
                return total

    async def delete(self, ns: str, queue: str) -> None:
        """Forget the queue's messages (its catalog entry is the caller's business)."""
        lq = self._queues.pop((ns, queue), None)
        if lq is not None:
            for c in lq.consumers:
                c.active = False
        for lease in list(self._leases.values()):
            if (lease.ns, lease.queue) == (ns, queue):
                lease.gone = True
                self._leases.pop(id(lease), None)
                self._ops.pop(lease, None)
        while await self.meta.transact(functools.partial(_delete_txn, ns, queue, self.clock())):
            pass

    async def stats(self, ns: str, queue: str) -> dict[str, int]:
        return await self.meta.transact(lambda tr: index.stats(tr, ns, queue))

    async def ready_count(self, ns: str, queue: str) -> int:
        st = await self.stats(ns, queue)
        return max(0, st[index.COUNT] - st[index.INFLIGHT])

    def consumer_count(self, ns: str, queue: str) -> int:
        lq = self._queues.get((ns, queue))
        return 0 if lq is None else sum(1 for c in lq.consumers if c.active)

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
            opts = self.options(ns, queue) or QueueOptions()
            now = self.clock()
            n, dead, st = await self.meta.transact(
                functools.partial(_reap_txn, ns, queue, opts, self.holder, now, now + self.lease_ms)
            )
            if n:
                log.info("returned %d messages of expired leases in %s/%s", n, ns, queue)
                metrics.queue_messages_redelivered_count.labels(ns, queue).inc(n)
                self._mark_ready(ns, queue)
                moved += n
            for key, run in dead:
                self._spawn(self._publish_dead(ns, queue, key, run))
            inflight = st[index.INFLIGHT]
            metrics.queue_depth.labels(ns, queue).set(max(0, st[index.COUNT] - inflight))
            metrics.queue_messages_in_flight.labels(ns, queue).set(inflight)
        if is_deleted is None:
            return moved
        stored = await self.meta.transact(index.stored_queues)
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


def _finish_get(consumer: Consumer, delivery: Delivery | None, ready: int = 0) -> None:
    future = consumer.get_future
    if future is not None and not future.done():
        future.set_result((delivery, ready))


def _queue_full(ns: str, queue: str, result: Enqueued) -> QueueFull:
    limit = (result.ctx.opts.max_bytes or 0) // (1024 * 1024)
    return QueueFull(
        f"queue {queue!r} is full: {result.queue_bytes} bytes stored, max_size_mb is {limit}",
        details={"namespace": ns, "queue": queue},
    )
