"""This broker's consumers of queues and what they hold.

``Consumer``: credit (how many more to claim) and the buffer of claimed deliveries not yet
handed out; ``Delivery``: one claimed message; ``Lease``: this broker's mirror of one of its
in-flight index entries, which deliveries point at until settled; ``LocalQueue``: the local
consumers of one queue and whether it may have ready messages.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from flowmq_core.message import Message
from flowmq_queue.entries import Run

log = logging.getLogger("flowmq_queue")

# Claims per consumer per round when prefetch is 0 (unlimited) or for no-ack consumers.
DEFAULT_WINDOW = 1000
# Prefetch windows claimed per consumer (see ``Consumer.credit``), at first and at most: a
# consumer that drains its buffer while a claim is still on its way gets one more window
# ahead, so that one claim transaction covers the time it takes (benchmark, 4 publishers
# -> 1 consumer with prefetch 256: 26k msgs/s and a growing backlog with 2, 43k with 4).
AHEAD = 2
MAX_AHEAD = 4


@dataclasses.dataclass(slots=True, eq=False)
class Consumer:
    """A consumer of one queue on this broker; ``deliver`` gets each batch of deliveries."""

    ns: str
    queue: str
    tag: str
    cid: str
    deliver: Callable[[list[Delivery]], None] | None
    prefetch: int
    no_ack: bool
    unacked: int = 0
    reserved: int = 0
    active: bool = True
    paused: bool = False
    buffer: collections.deque[Delivery] = dataclasses.field(default_factory=collections.deque)
    pump_scheduled: bool = False
    ahead: int = AHEAD
    # Basic.Get: resolves to (the delivery or None, ready messages left).
    get_future: asyncio.Future[tuple[Delivery | None, int]] | None = None
    # Whether a message published on this broker may be handed to it before it is stored
    # (``ClaimRounds.claim_ahead``): the adapter settles deliveries whose lease comes later.
    claim_ahead: bool = False
    # Claimed ahead while older messages of the queue may still come through claims: they
    # go into ``buffer`` behind those (claims.py ``_merge_held``).
    held: collections.deque[Delivery] = dataclasses.field(default_factory=collections.deque)

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

    def pump(self) -> None:
        """Hand out as many buffered deliveries as there is room for."""
        self.pump_scheduled = False
        n = min(self.room(), len(self.buffer))
        if n <= 0 or self.deliver is None:
            return
        buffer = self.buffer
        batch = [buffer.popleft() for _ in range(n)]
        if not self.no_ack:
            self.unacked += n
        try:
            self.deliver(batch)
        except Exception:
            log.exception("delivery to consumer %s failed", self.tag)

    def finish_get(self, delivery: Delivery | None, ready: int = 0) -> None:
        """Basic.Get: answer with ``delivery`` (None: the queue was empty)."""
        future = self.get_future
        if future is not None and not future.done():
            future.set_result((delivery, ready))


@dataclass(slots=True, eq=False)
class Lease:
    """This broker's mirror of one of its in-flight entries."""

    ns: str
    queue: str
    shard: int
    key: bytes
    run: Run
    consumer: Consumer
    gone: bool = False


@dataclass(slots=True, eq=False)
class Delivery:
    consumer: Consumer
    lease: Lease | None
    seq: int  # PENDING: claimed ahead, its enqueue not committed yet (no seq, no lease)
    message: Message
    redelivered: bool
    location: tuple[str, int]
    size: int
    # A settle (``ClaimRounds.settle``'s ``what``) that came before the enqueue committed,
    # applied once it has.
    early: str = ""
    # Claimed ahead: the enqueue's future until it has committed (done and still PENDING:
    # the flush failed).
    stored: Any = None


# The seq of a delivery claimed ahead of its enqueue's commit.
PENDING = -1


class LocalQueue:
    __slots__ = (
        "ahead_submitted",
        "ahead_turn",
        "backlog",
        "committed",
        "consumers",
        "covered",
        "dirty",
        "fresh",
        "maybe_ready",
        "name",
        "ns",
        "submitted",
        "turn",
        "watching",
    )

    def __init__(self, ns: str, name: str) -> None:
        self.ns = ns
        self.name = name
        self.consumers: list[Consumer] = []
        self.maybe_ready = True
        # Whether ready messages may be stored that a claim has not taken (set by every
        # enqueue or return to ready this broker knows of, cleared with ``maybe_ready`` by a
        # claim that found fewer than it wanted): while it is, nothing is claimed ahead, so a
        # message never overtakes an older one of this broker's.
        self.backlog = True
        self.ahead_turn = 0
        self.ahead_submitted = 0  # enqueues claimed ahead (claims.py: the watch)
        self.committed = 0  # the last ``submitted`` stamp whose enqueue has committed
        self.watching = False
        self.dirty = 0  # bumped by every local enqueue commit / requeue
        self.fresh = False  # messages committed since the last claim: claim without delay
        # Local enqueues handed to the batcher (a stamp each), and the last stamp a claim
        # round riding a flush no earlier than theirs has covered (claims.py).
        self.submitted = 0
        self.covered = 0
        self.turn = 0
