"""Instrumentation of storage tasks: fault-injection points and the running-tasks gauge."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from flowmq_metrics import kas3_online_running_tasks

FaultHook = Callable[[str], None]
"""Called with the name of each crash-relevant step (e.g. ``"flush.after_put"``) just after
that step; a test raises from it to simulate a crash there."""


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
