"""Backpressure instead of growth (DESIGN.md §13): publishers held while durable writes lag.

The broker's group-commit batcher calls ``on_pressure(True)`` when the bytes waiting for a
flush pass its high-water mark (``pending_writes_high_water``) and ``on_pressure(False)``
once they are below its low-water mark.  Meanwhile every protocol adapter, on its durable
publish path, asks ``active`` and, when it is set, pauses reading from the publishing
connection (TCP then pushes back to the client) and ``hold``s it here with the callback that
resumes it; the end of the pressure calls every such callback.  A connection that only
subscribes never publishes, so it is never held: Subscriptions keep flowing.

``memory_limit`` (``MemoryBudget``, off by default) is a second reason for the same pause:
the process's resident memory past that many bytes.  Publishers resume when no reason is
left.

A connection may be paused for other reasons too (a slow subscriber, a blocked cluster
link, a full write buffer); each adapter's resume callback reads again only when no other
reason holds it (``holds`` tells whether this one still does).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

log = logging.getLogger(__name__)

# What Kafka Produce answers carry in ``throttle_time_ms`` while under pressure: how long
# the client should back off (KIP-219).  A hint of the order of a few flushes: the broker
# also stops reading the connection until the pressure ends, which is what bounds memory.
KAFKA_THROTTLE_MS = 100
# Reasons for the pressure.
PENDING_WRITES = "pending_writes_high_water"
MEMORY_LIMIT = "memory_limit"
# ``memory_limit``: resident memory is checked this often, and publishers resume below this
# share of the limit.
MEMORY_CHECK_INTERVAL_S = 1.0
MEMORY_RESUME_RATIO = 0.9


class Backpressure:
    __slots__ = ("_held", "_reasons", "active")

    def __init__(self) -> None:
        self.active = False
        self._reasons: set[str] = set()
        self._held: dict[object, Callable[[], None]] = {}

    def hold(self, connection: object, resume: Callable[[], None]) -> bool:
        """Remember ``connection``, which its caller pauses now if this returns True (False:
        already held); ``resume()`` is called when the pressure ends."""
        if connection in self._held:
            return False
        self._held[connection] = resume
        return True

    def holds(self, connection: object) -> bool:
        return connection in self._held

    def forget(self, connection: object) -> None:
        """``connection`` closed: nothing to resume."""
        self._held.pop(connection, None)

    def on_pressure(self, active: bool) -> None:
        """The batcher's listener."""
        self.set_reason(PENDING_WRITES, active)

    def set_reason(self, reason: str, active: bool) -> None:
        """``reason`` for the pressure starts or ends; publishers resume when none is left."""
        if active:
            self._reasons.add(reason)
        else:
            self._reasons.discard(reason)
        was, self.active = self.active, bool(self._reasons)
        if was and not self.active:
            held, self._held = self._held, {}
            for resume in held.values():
                try:
                    resume()
                except Exception:  # one connection's failure must not strand the others
                    log.exception("resuming a publisher failed")

    @property
    def held(self) -> list[object]:
        """The connections paused now (operations and tests)."""
        return list(self._held)


def resident_bytes() -> int | None:
    """The process's resident memory (Linux ``/proc``; None where it cannot be read)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class MemoryBudget:
    """``memory_limit``: while the process's resident memory is over ``limit`` bytes the
    publishers are paused as for a long backlog, until it is below 90 % of it.  Resident
    memory is what the operator's limit (a container's) counts; the interpreter may keep
    freed memory, so set the limit well above the broker's working size."""

    def __init__(self, limit: int, pressure: Backpressure) -> None:
        self.limit = limit
        self.pressure = pressure
        self.over = False

    async def check(self) -> None:
        """One check (``PeriodicTask`` runs it every ``MEMORY_CHECK_INTERVAL_S``)."""
        rss = resident_bytes()
        if rss is None:
            return
        over = rss > (self.limit * MEMORY_RESUME_RATIO if self.over else self.limit)
        if over == self.over:
            return
        self.over = over
        log.info(
            "resident memory %d bytes %s memory_limit %d: publishers %s",
            rss,
            "over" if over else "back under",
            self.limit,
            "paused" if over else "may resume",
        )
        self.pressure.set_reason(MEMORY_LIMIT, over)
