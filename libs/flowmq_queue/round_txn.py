"""The transaction of one claim round (see claims.py): the work taken from the pending
state, run inside one meta transaction — its own, or the batcher's next flush's — and what
it found, for ``ClaimRounds`` to apply once it has committed.  Everything here is
synchronous and acts only through the transaction, which may run more than once.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

from flowmq_commit.batcher import GroupCommit
from flowmq_meta import Transaction
from flowmq_queue import index
from flowmq_queue.consumers import Lease, LocalQueue
from flowmq_queue.entries import Run
from flowmq_queue.index import QueueOptions, Settle, Want

ClaimPlan = tuple[LocalQueue, QueueOptions, list[Want], bool]
"""One queue's claim in a round: its options, the wants, and whether all are Basic.Gets."""


class Ops:
    """Settle operations of one lease gathered since the last round, seqs per kind."""

    __slots__ = ("ack", "dead", "release", "requeue")

    def __init__(self) -> None:
        self.ack: set[int] = set()
        self.requeue: set[int] = set()
        self.release: set[int] = set()
        self.dead: set[int] = set()

    def merge(self, other: Ops) -> None:
        self.ack |= other.ack
        self.requeue |= other.requeue
        self.release |= other.release
        self.dead |= other.dead


@dataclasses.dataclass
class RoundResult:
    settled: list[tuple[Lease, index.Settled]] = dataclasses.field(default_factory=list)
    claims: list[tuple[LocalQueue, list[Want], list[index.Claimed], int]] = dataclasses.field(
        default_factory=list
    )
    watches: list[tuple[LocalQueue, Any]] = dataclasses.field(default_factory=list)
    ready_left: dict[tuple[str, str], int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(eq=False)
class Round:
    """One round's work, taken out of the pending state; ``work`` is its transaction."""

    now: int
    lease_deadline: int
    holder: str
    claim_base: int
    ops: dict[Lease, Ops]
    dead_done: list[tuple[str, str, bytes, Run]]
    settles: list[tuple[Lease, Settle, QueueOptions]]
    claims: list[ClaimPlan]
    # id(local queue) -> its ``dirty`` and ``submitted`` when the round was taken
    dirty: dict[int, tuple[int, int]]
    # The object of the flush this round rode in, once its transaction ran ("": none).
    flush_key: str = ""

    def work(self, tr: Transaction, protect: str | None = None) -> RoundResult:
        """Settles, claims and finished dead letters in one transaction.  ``protect``: the
        object of the flush this round rides in (see ``index.Delta.apply``)."""
        delta = index.Delta()
        result = RoundResult()
        self._settle(tr, delta, result)
        self._claim(tr, delta, result, protect)
        for ns, q, key, run in self.dead_done:
            index.finish_dead(tr, ns, q, key, run, delta)
        delta.apply(tr, self.now, protect)
        return result

    def _settle(self, tr: Transaction, delta: index.Delta, result: RoundResult) -> None:
        for lease, s, opts in self.settles:
            out = index.settle(
                tr,
                s,
                opts,
                holder=self.holder,
                now_ms=self.now,
                dead_deadline_ms=self.lease_deadline,
                delta=delta,
            )
            result.settled.append((lease, out))

    def _claim(
        self, tr: Transaction, delta: index.Delta, result: RoundResult, protect: str | None
    ) -> None:
        ids = (str(self.claim_base + i) for i in itertools.count())
        for lq, opts, wants, gets_only in self.claims:
            claimed, expired = index.claim(
                tr,
                lq.ns,
                lq.name,
                opts,
                wants,
                holder=self.holder,
                claim_ids=ids,
                now_ms=self.now,
                deadline_ms=self.lease_deadline,
                delta=delta,
                protect=protect,
            )
            result.claims.append((lq, wants, claimed, expired))
            got = sum(len(c.run) for c in claimed)
            if got < sum(w.n for w in wants) and not lq.watching and not gets_only:
                result.watches.append((lq, tr.watch(index.stat_key(lq.ns, lq.name, index.SEQ))))
            if any(w.consumer.startswith("get#") for w in wants):
                result.ready_left[(lq.ns, lq.name)] = _ready_left(tr, lq, delta)


def _ready_left(tr: Transaction, lq: LocalQueue, delta: index.Delta) -> int:
    """Ready messages of the queue once this transaction's changes are counted."""
    st = index.stats(tr, lq.ns, lq.name)
    c = delta.counters
    count = st[index.COUNT] + c.get((lq.ns, lq.name, index.COUNT), 0)
    leased = st[index.INFLIGHT] + c.get((lq.ns, lq.name, index.INFLIGHT), 0)
    return max(0, count - leased)


class RoundCommit(GroupCommit):
    """A round riding in a flush: a zero-byte chunk whose ``ctx`` is the ``Round``, run with
    the flush's object key to protect, after the flush's enqueues (the batcher commits
    zero-byte chunks last).  It writes no entry pointing into the object."""

    def commit(
        self, tr: Transaction, group: Any, object_key: str, chunks: list[tuple[int, int, Any]]
    ) -> tuple[list[RoundResult], int]:
        results = []
        for _, _, round_ in chunks:
            round_.flush_key = object_key
            results.append(round_.work(tr, object_key))
        return results, 0
