"""Interpreter settings for a broker process, applied once by ``flowmq serve``."""

from __future__ import annotations

import gc
import sys

_GC_GEN2_THRESHOLD = 1000
_SWITCH_INTERVAL_S = 0.001


def tune_interpreter() -> None:
    """Process-wide interpreter settings for a message broker (measured with
    ``benchmarks/amqp_bench.py``, 1 publisher / 1 consumer: 22k -> ~39k msgs/s, p99 83 ->
    ~16 ms).

    Every AMQP message allocates a few dozen tracked objects (``Message``, futures,
    deliveries) that live a flush or two: long enough to be promoted, so full collections
    ran every few thousand messages and each walked the whole broker heap (a third of the
    event loop at 30k msgs/s, and most of the p99).  Almost all of them are freed by
    reference counting; cycles are still collected, just less often.

    The meta store and object store threads need the GIL back after every fsync, and with
    the default 5 ms switch interval they waited up to that long behind a busy event loop
    before committing a flush, which the publishers' confirms (and so their windows) wait
    for."""
    g0, g1, g2 = gc.get_threshold()
    if g2 < _GC_GEN2_THRESHOLD:
        gc.set_threshold(g0, g1, _GC_GEN2_THRESHOLD)
    if sys.getswitchinterval() > _SWITCH_INTERVAL_S:
        sys.setswitchinterval(_SWITCH_INTERVAL_S)
