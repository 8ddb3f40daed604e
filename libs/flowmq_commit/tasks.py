"""Instrumentation of storage tasks: fault-injection points, the running-tasks gauge and the
options every maintenance pass (retention, compaction, object GC) is run with."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from flowmq_commit.clock import Clock
from flowmq_core.message import now_ms
from flowmq_metrics import kas3_online_running_tasks

# Time between an object losing its last reference and GC deleting it: a fetch that read the
# old index entry just before may still be about to GET it.
DEFAULT_DELETE_GRACE_MS = 30_000

FaultHook = Callable[[str], None]
"""Called with the name of each crash-relevant step (e.g. ``"flush.after_put"``) just after
that step; a test raises from it to simulate a crash there.  ``flush.after_put`` is called
from the batcher's flush thread where it has one (``flush_thread.py``)."""


def fault(hook: FaultHook | None, point: str) -> None:
    if hook is not None:
        hook(point)


@contextlib.contextmanager
def running_task() -> Iterator[None]:
    """Counts a flush, fetch or maintenance pass in ``kas3_online_running_tasks``."""
    kas3_online_running_tasks.inc()
    try:
        yield
    finally:
        kas3_online_running_tasks.dec()


@dataclass(frozen=True)
class MaintenanceOptions:
    """How a maintenance pass runs: the clock it reads, how long an object it unreferences
    stays listed before GC may delete it (retention and compaction), and the fault hook of a
    crash test.  Brokers use the defaults; tests move the clock and shorten the grace."""

    clock: Clock = now_ms
    grace_ms: int = DEFAULT_DELETE_GRACE_MS
    faults: FaultHook | None = None


DEFAULT_MAINTENANCE = MaintenanceOptions()
"""What a broker's maintenance job runs with."""
