"""Enqueue: message bodies go through the shared group-commit batcher; the flush transaction
assigns sequence numbers and writes one ready entry per queue per flush (DESIGN.md §5)."""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Callable
from typing import Any, NamedTuple

from flowmq_commit.batcher import GroupCommit
from flowmq_commit.clock import Clock
from flowmq_core.message import Message
from flowmq_meta import Transaction, check_key, decode_int, encode_int
from flowmq_queue.consumers import Delivery
from flowmq_queue.entries import Run
from flowmq_queue.index import (
    BYTES,
    SEQ,
    Delta,
    QueueOptions,
    append_runs,
    lease_runs,
    next_seq,
    ready_key,
    stat_key,
)

REFUSED = -1


class EnqueueCtx:
    """What a submitted body carries into the commit; ``future`` is the batcher's, so a
    refused chunk can be failed with ``QueueFull`` before the batcher resolves it."""

    __slots__ = ("delivery", "expires_ms", "future", "message", "opts", "stamp")

    def __init__(self, message: Message | None, expires_ms: int, opts: QueueOptions) -> None:
        self.message = message  # to cache once committed (None: not cached)
        self.expires_ms = expires_ms  # 0: never
        self.opts = opts
        self.future: Any = None
        self.stamp = 0  # ClaimRounds.enqueue_submitted's, handed back to mark_ready
        # Claimed ahead for a local consumer (ClaimRounds.claim_ahead): stored leased to it.
        self.delivery: Delivery | None = None


class Enqueued(NamedTuple):
    """A chunk's result: its seq (REFUSED: the queue was full), where its body is, the
    queue's stored bytes as the commit saw them and, for a message claimed ahead, the
    in-flight entry it was stored in: (shard, key, run)."""

    seq: int
    start: int
    ctx: EnqueueCtx
    queue_bytes: int
    leased: tuple[int, bytes, Run] | None = None


class EnqueueCommit(GroupCommit):
    """All chunks a flush carries for one queue become one ready entry (up to MAX_RUN), and
    those claimed ahead one in-flight entry per consumer, leased to ``holder``."""

    def __init__(
        self,
        on_committed: Callable[[Any, list[Enqueued], str, list[int]], None],
        *,
        holder: str = "",
        lease_ms: int = 0,
        clock: Clock | None = None,
    ):
        self._on_committed = on_committed
        self._holder = holder
        self._lease_ms = lease_ms
        self._clock = clock
        # Claim ids of the leases written here; the rounds' are numbers, these start with "a".
        self._claim_ids = itertools.count(1)

    def check(self, group: Any) -> None:
        # The longest keys of a queue: its ready and in-flight entries at the largest numbers.
        _, ns, queue = group
        check_key(ready_key(ns, queue, 2**31 - 1, 2**63 - 1))

    def commit(
        self, tr: Transaction, group: Any, object_key: str, chunks: list[tuple[int, int, Any]]
    ) -> tuple[list[Enqueued], int]:
        _, ns, queue = group
        opts: QueueOptions = chunks[-1][2].opts
        seq = next_seq(tr, ns, queue)
        limit = opts.max_bytes
        used = decode_int(tr.get(stat_key(ns, queue, BYTES))) if limit is not None else 0
        results: list[Enqueued] = []
        seqs: list[int] = []
        starts: list[int] = []
        sizes: list[int] = []
        expires: list[int] = []
        # Indices (into ``seqs``) of the messages claimed ahead, per consumer; and theirs
        # (into ``results``).
        claimed: dict[str, list[int]] = {}
        claimed_results: dict[str, list[int]] = {}
        for start, end, ctx in chunks:
            size = end - start
            if limit is not None and used + size > limit:
                results.append(Enqueued(REFUSED, start, ctx, used))
                continue
            used += size
            if ctx.delivery is not None:
                cid = ctx.delivery.consumer.cid
                claimed.setdefault(cid, []).append(len(seqs))
                claimed_results.setdefault(cid, []).append(len(results))
            results.append(Enqueued(seq, start, ctx, used))
            seqs.append(seq)
            starts.append(start)
            sizes.append(size)
            expires.append(ctx.expires_ms)
            seq += 1
        if not seqs:
            return results, 0
        run = Run(object_key, seqs, starts, sizes, [0] * len(seqs), expires)
        # Consecutive flushes land on different shards; claims merge shards by seq.
        shard = zlib.crc32(object_key.encode()) % opts.shards
        delta = Delta()
        written = 0
        if claimed:
            taken = {i for indices in claimed.values() for i in indices}
            if len(taken) < len(seqs):
                ready = run.pick([i for i in range(len(seqs)) if i not in taken])
                written += append_runs(tr, ns, queue, shard, ready, delta)
            written += self._lease(
                tr, ns, queue, shard, run, claimed, claimed_results, results, delta
            )
        else:
            written = append_runs(tr, ns, queue, shard, run, delta)
        tr.set(stat_key(ns, queue, SEQ), encode_int(seq))
        for (q_ns, q_name, name), n in delta.counters.items():
            tr.add(stat_key(q_ns, q_name, name), n)
        return results, written

    def _lease(
        self,
        tr: Transaction,
        ns: str,
        queue: str,
        shard: int,
        run: Run,
        claimed: dict[str, list[int]],
        claimed_results: dict[str, list[int]],
        results: list[Enqueued],
        delta: Delta,
    ) -> int:
        """Write the messages claimed ahead as in-flight entries, one per consumer (up to
        MAX_RUN each), and tell their results which entry; returns the entries written."""
        assert self._clock is not None
        deadline = self._clock() + self._lease_ms
        written = 0
        for cid, indices in claimed.items():
            part = run.pick(indices).leased(
                self._holder, cid, f"a{next(self._claim_ids)}", deadline
            )
            entries = lease_runs(tr, ns, queue, shard, part, delta)
            written += len(entries)
            at = 0
            for key, entry in entries:
                leased = (shard, key, entry)
                for r in claimed_results[cid][at : at + len(entry)]:
                    seq, start, ctx, used, _ = results[r]
                    results[r] = Enqueued(seq, start, ctx, used, leased)  # (_replace: 4× slower)
                at += len(entry)
        return written

    def after_commit(
        self, group: Any, results: list[Any], object_key: str, start: int, end: int, data: bytes
    ) -> None:
        sizes = []
        for i, r in enumerate(results):
            stop = results[i + 1].start if i + 1 < len(results) else end
            sizes.append(stop - r.start)
        self._on_committed(group, results, object_key, sizes)
