"""The clock of the object life cycle: intent leases, grace periods and GC deadlines are
wall-clock milliseconds since the epoch, because several brokers compare them through the
meta store.  Every function that reads the time takes a ``Clock`` so tests can move it
(expire a lease, pass a grace period) without sleeping; the default everywhere is
``flowmq_core.message.now_ms``, the one definition of "now" in the project (message
timestamps use it too, and ``flowmq_core`` depends on nothing of ours)."""

from __future__ import annotations

from collections.abc import Callable

Clock = Callable[[], int]
"""Wall-clock milliseconds since the epoch; ``flowmq_core.message.now_ms`` unless a test
injects another."""
