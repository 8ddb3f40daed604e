"""Small shared pieces: wall clock, fault injection points, the running-tasks gauge."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator

from flowmq_core.message import now_ms
from flowmq_metrics import kas3_online_running_tasks

Clock = Callable[[], int]
"""Wall-clock milliseconds since the epoch; injectable so tests can expire leases."""

wall_ms: Clock = now_ms
"""The default ``Clock``."""

FaultHook = Callable[[str], None]
"""Called with the name of each crash-relevant step (e.g. ``"flush.after_put"``) just after
that step; a test raises from it to simulate a crash there."""


def fault(hook: FaultHook | None, point: str) -> None:
    if hook is not None:
        hook(point)


@contextlib.contextmanager
def running_task() -> Iterator[None]:
    kas3_online_running_tasks.inc()
    try:
        yield
    finally:
        kas3_online_running_tasks.dec()


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def key_component(name: str) -> str:
    """``name`` made safe as one object-key path component on every backend."""
    cleaned = _UNSAFE.sub("_", name).strip(".") or "node"
    return cleaned[:100]
