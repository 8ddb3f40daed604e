"""Queue index operations; each function runs inside one meta transaction (DESIGN.md §5).

Ready entries ``QUEUE_READY(ns, queue, shard, seq)``, leases ``QUEUE_INFLIGHT(ns, queue,
shard, seq)`` and dead letters being published ``QUEUE_DEAD(ns, queue, seq)`` all hold a
``Run`` (entries.py) keyed by its first sequence number, and each holds one reference on the
object its bodies are in.  Functions record their reference and counter changes in a
``Delta`` that the caller applies once at the end of the transaction, so a round that
touches many entries of one object adjusts its count once.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from flowmq_commit import refs
from flowmq_meta import Transaction, decode_int
from flowmq_meta.catalog import DEFAULT_QUEUE_MAX_RETRIES, DEFAULT_QUEUE_SHARDS, Destination
from flowmq_meta.keys import QUEUE_DEAD, QUEUE_INFLIGHT, QUEUE_READY, QUEUE_STATS
from flowmq_queue.entries import MAX_RUN, Run, decode_run, lease_of

# Unreferenced objects are deleted this long after their last entry went, so a body GET that
# read an entry just before it was acknowledged still finds the object.
REF_GRACE_MS = 30_000
# Entries read per shard when looking for the oldest ready messages.
HEADS_PER_SHARD = 4

SEQ, COUNT, BYTES, INFLIGHT = "seq", "count", "bytes", "inflight"


def ready_key(ns: str, queue: str, shard: int, seq: int) -> bytes:
    return QUEUE_READY.pack(ns, queue, shard, seq)


def inflight_key(ns: str, queue: str, shard: int, seq: int) -> bytes:
    return QUEUE_INFLIGHT.pack(ns, queue, shard, seq)


def dead_key(ns: str, queue: str, seq: int) -> bytes:
    return QUEUE_DEAD.pack(ns, queue, seq)


def stat_key(ns: str, queue: str, name: str) -> bytes:
    return QUEUE_STATS.pack(ns, queue, name)


@dataclass(frozen=True, slots=True)
class QueueOptions:
    shards: int = DEFAULT_QUEUE_SHARDS
    max_retries: int = DEFAULT_QUEUE_MAX_RETRIES
    max_bytes: int | None = None
    ttl_ms: int | None = None
    dead_letter_topic: str | None = None
    # Whether an enqueued message's body goes into the body cache (so a local consumer reads
    # it without a GET).  Off for queues that are rarely read back, an MQTT session's: its
    # messages would fill the cache's whole budget while no consumer reads them.
    cache_bodies: bool = True
    # The ``queue`` label of its metrics (None: its name).  MQTT session queues share one: a
    # label per client id would be a series per client for the life of the process.
    metrics_label: str | None = None

    @classmethod
    def of(cls, dest: Destination | None) -> QueueOptions:
        if dest is None:
            return cls()
        o = dest.options
        size = o.get("max_size_mb")
        ttl = o.get("message_ttl_seconds")
        retries = o.get("max_retries")
        return cls(
            shards=max(1, int(o.get("shards") or DEFAULT_QUEUE_SHARDS)),
            max_retries=DEFAULT_QUEUE_MAX_RETRIES if retries is None else int(retries),
            max_bytes=None if size is None else int(size) * 1024 * 1024,
            ttl_ms=None if ttl is None else int(ttl) * 1000,
            dead_letter_topic=o.get("dead_letter_topic") or None,
        )


@dataclass(slots=True)
class Delta:
    """Reference and counter changes accumulated over one transaction."""

    refs: dict[str, int] = field(default_factory=dict)
    counters: dict[tuple[str, str, str], int] = field(default_factory=dict)

    def ref(self, object_key: str, n: int) -> None:
        self.refs[object_key] = self.refs.get(object_key, 0) + n

    def count(self, ns: str, queue: str, name: str, n: int) -> None:
        if n:
            key = (ns, queue, name)
            self.counters[key] = self.counters.get(key, 0) + n

    def removed(self, ns: str, queue: str, run: Run, *, inflight: bool) -> None:
        """``run``'s messages left the queue for good."""
        self.count(ns, queue, COUNT, -len(run))
        self.count(ns, queue, BYTES, -run.total_size)
        if inflight:
            self.count(ns, queue, INFLIGHT, -len(run))

    def apply(self, tr: Transaction, now_ms: int, protect: str | None = None) -> None:
        """``protect``: the object of the flush this transaction belongs to, whose reference
        count the batcher adds only after us; its decrements are plain adds."""
        drops = {}
        for object_key, n in self.refs.items():
            if n > 0:
                refs.add_refs(tr, object_key, n)
            elif n < 0:
                if object_key == protect:
                    tr.add(refs.refs_key(object_key), n)
                else:
                    drops[object_key] = -n
        if drops:
            refs.unref(tr, drops, now_ms, REF_GRACE_MS)
        for (ns, queue, name), n in self.counters.items():
            tr.add(stat_key(ns, queue, name), n)
        self.refs.clear()
        self.counters.clear()


# --- enqueue ------------------------------------------------------------------------------------


def append_runs(
    tr: Transaction,
    ns: str,
    queue: str,
    shard: int,
    run: Run,
    delta: Delta,
) -> int:
    """Write ``run`` (already given its seqs) as ready entries; returns how many entries
    (= references) were written."""
    written = 0
    for start in range(0, len(run), MAX_RUN):
        part = run.slice(start, min(start + MAX_RUN, len(run)))
        tr.set(ready_key(ns, queue, shard, part.first), part.encode())
        written += 1
    delta.count(ns, queue, COUNT, len(run))
    delta.count(ns, queue, BYTES, run.total_size)
    return written


def lease_runs(
    tr: Transaction, ns: str, queue: str, shard: int, run: Run, delta: Delta
) -> list[tuple[bytes, Run]]:
    """Write ``run`` (given its seqs and its lease) as in-flight entries of messages that
    never were ready (claimed ahead at enqueue); returns each entry's key and run (one
    reference each, counted by the caller)."""
    entries = []
    for start in range(0, len(run), MAX_RUN):
        part = run.slice(start, min(start + MAX_RUN, len(run)))
        key = inflight_key(ns, queue, shard, part.first)
        tr.set(key, part.encode())
        entries.append((key, part))
    delta.count(ns, queue, COUNT, len(run))
    delta.count(ns, queue, BYTES, run.total_size)
    delta.count(ns, queue, INFLIGHT, len(run))
    return entries


def next_seq(tr: Transaction, ns: str, queue: str) -> int:
    return decode_int(tr.get(stat_key(ns, queue, SEQ)))


# --- claim ------------------------------------------------------------------------------------


@dataclass(slots=True)
class Want:
    """One consumer's demand in a claim: ``n`` messages, leased unless ``auto_ack``."""

    consumer: str
    n: int
    auto_ack: bool


@dataclass(slots=True)
class Claimed:
    consumer: str
    shard: int
    run: Run
    auto_ack: bool


def claim(
    tr: Transaction,
    ns: str,
    queue: str,
    opts: QueueOptions,
    wants: list[Want],
    *,
    holder: str,
    claim_ids: Iterable[str],
    now_ms: int,
    deadline_ms: int,
    delta: Delta,
    protect: str | None = None,
) -> tuple[list[Claimed], int]:
    """Move up to the wanted number of the oldest ready messages to in-flight leases (or out
    of the queue for auto-ack consumers), shared fairly among ``wants``.  Expired messages
    met on the way are dropped.  Returns the claims and the number of messages dropped."""
    total = sum(w.n for w in wants)
    if total <= 0:
        return [], 0
    taken: list[tuple[int, Run]] = []
    remaining = total
    expired = 0
    for shard, key, run in _oldest_ready(tr, ns, queue, opts.shards):
        if remaining <= 0:
            break
        tr.clear(key)
        delta.ref(run.object_key, -1)
        if run.object_key != protect and any(e and e <= now_ms for e in run.expires):
            keep = [i for i, e in enumerate(run.expires) if not e or e > now_ms]
            dropped = run.pick([i for i, e in enumerate(run.expires) if e and e <= now_ms])
            delta.removed(ns, queue, dropped, inflight=False)
            expired += len(dropped)
            run = run.pick(keep)
            if not len(run):
                continue
        n = min(remaining, len(run))
        if n < len(run):
            rest = run.slice(n)
            tr.set(ready_key(ns, queue, shard, rest.first), rest.encode())
            delta.ref(run.object_key, 1)
            run = run.slice(0, n)
        taken.append((shard, run))
        remaining -= n
    shares = _fair_shares([w.n for w in wants], total - remaining)
    claims: list[Claimed] = []
    ids = iter(claim_ids)
    pieces = iter(taken)
    current: tuple[int, Run] | None = None
    offset = 0
    for want, share in zip(wants, shares, strict=True):
        while share > 0:
            if current is None or offset >= len(current[1]):
                current = next(pieces)
                offset = 0
            shard, run = current
            n = min(share, len(run) - offset)
            part = run.slice(offset, offset + n)
            offset += n
            share -= n
            if want.auto_ack:
                delta.removed(ns, queue, part, inflight=False)
            else:
                part = part.leased(holder, want.consumer, next(ids), deadline_ms)
                tr.set(inflight_key(ns, queue, shard, part.first), part.encode())
                delta.ref(part.object_key, 1)
                delta.count(ns, queue, INFLIGHT, len(part))
            claims.append(Claimed(want.consumer, shard, part, want.auto_ack))
    return claims, expired


def _oldest_ready(
    tr: Transaction, ns: str, queue: str, shards: int
) -> Iterator[tuple[int, bytes, Run]]:
    """Ready entries of every shard merged by first seq (oldest first), read a few entries
    per shard at a time: FIFO across shards without reading the whole queue."""
    cursors: dict[int, bytes] = {}
    ends: dict[int, bytes] = {}
    for shard in range(shards):
        cursors[shard], ends[shard] = QUEUE_READY.range(ns, queue, shard)
    buffered: list[tuple[int, int, bytes, Run]] = []

    def refill(shard: int) -> None:
        rows = tr.get_range(cursors[shard], ends[shard], limit=HEADS_PER_SHARD)
        for key, value in rows:
            run = decode_run(value)
            heapq.heappush(buffered, (run.first, shard, key, run))
        if len(rows) == HEADS_PER_SHARD:
            cursors[shard] = rows[-1][0] + b"\x00"
        else:
            del cursors[shard]

    for shard in range(shards):
        refill(shard)
    while buffered:
        _, shard, key, run = heapq.heappop(buffered)
        yield shard, key, run
        # Keep every live shard represented, so the next pop is the true oldest.
        if shard in cursors and not any(b[1] == shard for b in buffered):
            refill(shard)


def _fair_shares(demands: list[int], supply: int) -> list[int]:
    """Split ``supply`` (<= sum of demands) evenly, no one above their demand: competing
    consumers of a short queue each get some rather than the first getting all."""
    shares = [0] * len(demands)
    while supply > 0:
        open_ = [i for i, d in enumerate(demands) if shares[i] < d]
        each = max(1, supply // len(open_))
        for i in open_:
            give = min(each, demands[i] - shares[i], supply)
            shares[i] += give
            supply -= give
            if not supply:
                break
    return shares


# --- settle (ack / requeue / dead-letter / renew) ---------------------------------------------


@dataclass(slots=True)
class Settle:
    """What to do with some messages of one lease this broker holds."""

    ns: str
    queue: str
    shard: int
    key: bytes
    run: Run
    ack: frozenset[int] = frozenset()
    requeue: frozenset[int] = frozenset()  # delivered, failed: attempt + 1
    release: frozenset[int] = frozenset()  # never delivered: attempt unchanged
    dead: frozenset[int] = frozenset()  # rejected without requeue
    new_deadline: int | None = None


@dataclass(slots=True)
class Settled:
    stale: bool = False  # the lease is no longer ours (expired and reaped): nothing done
    key: bytes | None = None  # the lease's key afterwards (None: the lease is gone)
    run: Run | None = None
    dead: list[tuple[bytes, Run]] = field(default_factory=list)
    dead_dropped: int = 0
    redelivered: int = 0
    acked: int = 0


def settle(
    tr: Transaction,
    s: Settle,
    opts: QueueOptions,
    *,
    holder: str,
    now_ms: int,
    dead_deadline_ms: int,
    delta: Delta,
) -> Settled:
    raw = tr.get(s.key)
    if raw is None or lease_of(raw) != (s.run.holder, s.run.claim_id):
        return Settled(stale=True)
    run = s.run
    out = Settled()
    keep: list[int] = []
    back: list[int] = []
    attempts_up: set[int] = set()
    dead: list[int] = []
    acked: list[int] = []
    for i, seq in enumerate(run.seqs):
        if seq in s.ack:
            acked.append(i)
        elif seq in s.requeue:
            back.append(i)
            attempts_up.add(i)
        elif seq in s.release:
            back.append(i)
        elif seq in s.dead:
            dead.append(i)
        else:
            keep.append(i)
    if acked:
        delta.removed(s.ns, s.queue, run.pick(acked), inflight=True)
        out.acked = len(acked)
    if back:
        returned = run.pick(back).as_ready()
        returned.attempts = [
            a + 1 if i in attempts_up else a for i, a in zip(back, returned.attempts, strict=True)
        ]
        over = [j for j, a in enumerate(returned.attempts) if a > opts.max_retries]
        if over:
            dead_run = returned.pick(over)
            dead_run.reason = "maximum retries exceeded"
            returned = returned.pick([j for j in range(len(returned)) if j not in set(over)])
            _to_dead(tr, s.ns, s.queue, dead_run, opts, holder, dead_deadline_ms, delta, out)
        if len(returned):
            tr.set(ready_key(s.ns, s.queue, s.shard, returned.first), returned.encode())
            delta.ref(run.object_key, 1)
            delta.count(s.ns, s.queue, SEQ, 1)  # wakes consumers watching the queue
            out.redelivered = sum(1 for a in returned.attempts if a > 0)
        delta.count(s.ns, s.queue, INFLIGHT, -len(returned) - len(over))
    if dead:
        dead_run = run.pick(dead).as_ready()
        dead_run.reason = "rejected"
        delta.count(s.ns, s.queue, INFLIGHT, -len(dead_run))
        _to_dead(tr, s.ns, s.queue, dead_run, opts, holder, dead_deadline_ms, delta, out)
    if not keep:
        tr.clear(s.key)
        delta.ref(run.object_key, -1)
        return out
    rest = run.pick(keep) if len(keep) < len(run) else run
    if s.new_deadline is not None:
        rest = rest.leased(rest.holder, rest.consumer, rest.claim_id, s.new_deadline)
    new_key = inflight_key(s.ns, s.queue, s.shard, rest.first)
    if new_key != s.key:
        tr.clear(s.key)
    if new_key != s.key or len(keep) < len(run) or s.new_deadline is not None:
        tr.set(new_key, rest.encode())
    out.key, out.run = new_key, rest
    return out


def _to_dead(
    tr: Transaction,
    ns: str,
    queue: str,
    run: Run,
    opts: QueueOptions,
    holder: str,
    deadline_ms: int,
    delta: Delta,
    out: Settled,
) -> None:
    """Dead-letter ``run``: kept under QUEUE_DEAD until published to the dead-letter topic,
    or dropped when the queue has none."""
    if opts.dead_letter_topic is None:
        delta.removed(ns, queue, run, inflight=False)
        out.dead_dropped += len(run)
        return
    run = Run(
        run.object_key,
        run.seqs,
        run.starts,
        run.sizes,
        run.attempts,
        run.expires,
        holder,
        "",
        "dead",
        deadline_ms,
        run.reason,
    )
    key = dead_key(ns, queue, run.first)
    tr.set(key, run.encode())
    delta.ref(run.object_key, 1)
    out.dead.append((key, run))


def finish_dead(tr: Transaction, ns: str, queue: str, key: bytes, run: Run, delta: Delta) -> bool:
    """The dead letters of ``run`` are published: forget them (if still ours)."""
    raw = tr.get(key)
    if raw is None or lease_of(raw) != (run.holder, run.claim_id):
        return False
    current = decode_run(raw)
    if current.deadline_ms != run.deadline_ms:
        return False
    tr.clear(key)
    delta.ref(run.object_key, -1)
    delta.removed(ns, queue, run, inflight=False)
    return True


# --- reaping ------------------------------------------------------------------------------------


def reap(
    tr: Transaction,
    ns: str,
    queue: str,
    opts: QueueOptions,
    *,
    holder: str,
    now_ms: int,
    dead_deadline_ms: int,
    delta: Delta,
    limit: int = 200,
) -> tuple[int, list[tuple[bytes, Run]]]:
    """Return the messages of expired leases to ready (attempt + 1), and take over dead
    letters whose publisher died.  Returns (messages returned or dead-lettered, dead runs
    this caller must now publish)."""
    moved = 0
    to_publish: list[tuple[bytes, Run]] = []
    begin, end = QUEUE_INFLIGHT.range(ns, queue)
    for key, value in tr.get_range(begin, end, limit=limit):
        run = decode_run(value)
        if run.deadline_ms > now_ms:
            continue
        shard = QUEUE_INFLIGHT.unpack(key)[2]
        out = settle(
            tr,
            Settle(ns, queue, shard, key, run, requeue=frozenset(run.seqs)),
            opts,
            holder=holder,
            now_ms=now_ms,
            dead_deadline_ms=dead_deadline_ms,
            delta=delta,
        )
        moved += len(run)
        to_publish.extend(out.dead)
    begin, end = QUEUE_DEAD.range(ns, queue)
    for key, value in tr.get_range(begin, end, limit=limit):
        run = decode_run(value)
        if run.deadline_ms > now_ms:
            continue
        if opts.dead_letter_topic is None:
            tr.clear(key)
            delta.ref(run.object_key, -1)
            delta.removed(ns, queue, run, inflight=False)
            continue
        run.holder, run.deadline_ms = holder, dead_deadline_ms
        tr.set(key, run.encode())
        to_publish.append((key, run))
    return moved, to_publish


def peek_ready(
    tr: Transaction,
    ns: str,
    queue: str,
    shards: int,
    limit: int,
    skip: Collection[int] = (),
    max_runs: int | None = None,
) -> list[Run]:
    """Read only: the oldest ready messages (up to ``limit``, as runs in seq order, at most
    ``max_runs`` of them), leaving out the seqs in ``skip`` (what the reader has already), for
    an operator's look at a queue; nothing is claimed, leased or counted."""
    out: list[Run] = []
    left = limit
    for _, _, run in _oldest_ready(tr, ns, queue, shards):
        if left <= 0 or (max_runs is not None and len(out) >= max_runs):
            break
        if skip:
            wanted = [i for i, seq in enumerate(run.seqs) if seq not in skip]
            if not wanted:
                continue
            if len(wanted) < len(run):
                run = run.pick(wanted)
        part = run.slice(0, min(left, len(run)))
        out.append(part)
        left -= len(part)
    return out


# --- whole-queue operations ---------------------------------------------------------------------


def purge_page(
    tr: Transaction, ns: str, queue: str, delta: Delta, limit: int = 500
) -> tuple[int, bool]:
    """Drop up to ``limit`` ready entries; returns (messages dropped, more left)."""
    begin, end = QUEUE_READY.range(ns, queue)
    rows = tr.get_range(begin, end, limit=limit)
    dropped = 0
    for key, value in rows:
        run = decode_run(value)
        tr.clear(key)
        delta.ref(run.object_key, -1)
        delta.removed(ns, queue, run, inflight=False)
        dropped += len(run)
    return dropped, len(rows) == limit


def purge_seqs_page(
    tr: Transaction,
    ns: str,
    queue: str,
    seqs: Collection[int],
    delta: Delta,
    begin: bytes | None,
    limit: int = 500,
) -> tuple[int, bytes | None]:
    """Drop the ready messages whose seq is in ``seqs`` from up to ``limit`` entries from key
    ``begin`` on; the others stay (an entry holding both is cut down to the others).  Each
    shard is read only up to the highest seq named (an entry is keyed by its first seq, so
    later ones hold none): a session dropping what its client acknowledged of a long
    backlog, a page at a time from its head, reads the head, not the whole queue each time.
    Returns (messages dropped, the key to go on from, or None once the queue was read)."""
    top = max(seqs, default=-1)
    start, end = QUEUE_READY.range(ns, queue)
    begin = start if begin is None else begin
    dropped = read = 0
    while read < limit:
        head = tr.get_range(begin, end, limit=1)
        if not head:
            return dropped, None
        shard = QUEUE_READY.unpack(head[0][0])[2]
        want = limit - read
        rows = tr.get_range(head[0][0], ready_key(ns, queue, shard, top + 1), limit=want)
        read += len(rows)
        for key, value in rows:
            run = decode_run(value)
            gone = [i for i, seq in enumerate(run.seqs) if seq in seqs]
            if not gone:
                continue
            tr.clear(key)
            if len(gone) == len(run):
                delta.ref(run.object_key, -1)
                delta.removed(ns, queue, run, inflight=False)
            else:
                kept = run.pick([i for i, seq in enumerate(run.seqs) if seq not in seqs])
                tr.set(ready_key(ns, queue, shard, kept.first), kept.encode())
                delta.removed(ns, queue, run.pick(gone), inflight=False)
            dropped += len(gone)
        if len(rows) == want:  # more of this shard, maybe: the next page goes on from here
            return dropped, rows[-1][0] + b"\x00"
        begin = QUEUE_READY.range(ns, queue, shard + 1)[0]  # the next shard
    return dropped, begin


def delete_page(tr: Transaction, ns: str, queue: str, delta: Delta, limit: int = 500) -> bool:
    """Drop up to ``limit`` entries of any kind; when none are left, the counters too.
    Returns whether entries are left."""
    left = limit
    for space in (QUEUE_READY, QUEUE_INFLIGHT, QUEUE_DEAD):
        begin, end = space.range(ns, queue)
        rows = tr.get_range(begin, end, limit=left)
        for key, value in rows:
            tr.clear(key)
            delta.ref(decode_run(value).object_key, -1)
        left -= len(rows)
        if left <= 0:
            return True
    delta.counters = {k: v for k, v in delta.counters.items() if k[:2] != (ns, queue)}
    begin, end = QUEUE_STATS.range(ns, queue)
    tr.clear_range(begin, end)
    return False


def stats(tr: Transaction, ns: str, queue: str) -> dict[str, int]:
    begin, end = QUEUE_STATS.range(ns, queue)
    out = {SEQ: 0, COUNT: 0, BYTES: 0, INFLIGHT: 0}
    for key, value in tr.get_range(begin, end):
        out[QUEUE_STATS.unpack(key)[2]] = decode_int(value)
    return out


def stored_queues(tr: Transaction) -> list[tuple[str, str]]:
    """Every (ns, queue) with counters, deleted queues' leftovers included."""
    begin, end = QUEUE_STATS.range()
    seen: dict[tuple[str, str], Any] = {}
    for key, _ in tr.get_range(begin, end):
        ns, queue, _name = QUEUE_STATS.unpack(key)
        seen[(ns, queue)] = None
    return list(seen)
