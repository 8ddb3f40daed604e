"""Enqueue: message bodies go through the shared group-commit batcher; the flush transaction
assigns sequence numbers and writes one ready entry per queue per flush (DESIGN.md §5)."""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any, NamedTuple

from flowmq_commit.batcher import GroupCommit
from flowmq_core.message import Message
from flowmq_meta import Transaction, check_key, decode_int, encode_int
from flowmq_queue.entries import Run
from flowmq_queue.index import (
    BYTES,
    SEQ,
    Delta,
    QueueOptions,
    append_runs,
    next_seq,
    ready_key,
    stat_key,
)

REFUSED = -1


class EnqueueCtx:
    """What a submitted body carries into the commit; ``future`` is the batcher's, so a
    refused chunk can be failed with ``QueueFull`` before the batcher resolves it."""

    __slots__ = ("expires_ms", "future", "message", "opts", "stamp")

    def __init__(self, message: Message | None, expires_ms: int, opts: QueueOptions) -> None:
        self.message = message  # to cache once committed (None: not cached)
        self.expires_ms = expires_ms  # 0: never
        self.opts = opts
        self.future: Any = None
        self.stamp = 0  # ClaimRounds.enqueue_submitted's, handed back to mark_ready


class Enqueued(NamedTuple):
    """A chunk's result: its seq (REFUSED: the queue was full), where its body is, and the
    queue's stored bytes as the commit saw them."""

    seq: int
    start: int
    ctx: EnqueueCtx
    queue_bytes: int


class EnqueueCommit(GroupCommit):
    """All chunks a flush carries for one queue become one ready entry (up to MAX_RUN)."""

    def __init__(self, on_committed: Callable[[Any, list[Enqueued], str, list[int]], None]):
        self._on_committed = on_committed

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
        for start, end, ctx in chunks:
            size = end - start
            if limit is not None and used + size > limit:
                results.append(Enqueued(REFUSED, start, ctx, used))
                continue
            used += size
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
        written = append_runs(tr, ns, queue, shard, run, delta)
        tr.set(stat_key(ns, queue, SEQ), encode_int(seq))
        for (q_ns, q_name, name), n in delta.counters.items():
            tr.add(stat_key(q_ns, q_name, name), n)
        return results, written

    def after_commit(
        self, group: Any, results: list[Any], object_key: str, start: int, end: int, data: bytes
    ) -> None:
        sizes = []
        for i, r in enumerate(results):
            stop = results[i + 1].start if i + 1 < len(results) else end
            sizes.append(stop - r.start)
        self._on_committed(group, results, object_key, sizes)
