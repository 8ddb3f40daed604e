"""At most one log line per key per interval, for refusals a client can repeat in a loop
(DESIGN.md §13: every refusal is counted, but a flood must not flood the log)."""

from __future__ import annotations

import time
from collections.abc import Hashable


class LogThrottle:
    """``due(key)`` is True at most once per ``interval_s`` per key; at most ``max_keys`` keys
    are remembered (past it, those whose interval ran out are forgotten)."""

    def __init__(self, interval_s: float, max_keys: int = 10_000) -> None:
        self.interval_s = interval_s
        self.max_keys = max_keys
        self._last: dict[Hashable, float] = {}

    def due(self, key: Hashable) -> bool:
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last < self.interval_s:
            return False
        if len(self._last) >= self.max_keys:
            self._last = {k: t for k, t in self._last.items() if now - t < self.interval_s}
        self._last[key] = now
        return True


__all__ = ["LogThrottle"]
