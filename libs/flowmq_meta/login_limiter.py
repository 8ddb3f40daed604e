"""Failed-login rate limit per client address (DESIGN.md §12).

Invariants:
- An address with ``max_failures`` failed logins within ``window`` seconds is *blocked* for
  ``backoff`` seconds from the last of them: its attempts are refused before any password
  check runs, and do not extend the block.  When the block ends, the address starts afresh.
- Memory is bounded: at most ``max_addresses`` addresses are tracked, each with at most
  ``max_failures`` timestamps; past the cap the least recently seen address is forgotten
  (LRU), which may lift its block early — the price of the bound.
- A success does not clear an address's failures, so one valid account cannot be used to
  reset the count while guessing another's password.

Time comes from ``clock`` (``time.monotonic`` by default), so tests move it by hand.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable

MAX_FAILURES = 5
WINDOW_S = 60.0
BACKOFF_S = 60.0
MAX_ADDRESSES = 10_000


class _Entry:
    __slots__ = ("blocked_until", "failures")

    def __init__(self, max_failures: int) -> None:
        self.failures: deque[float] = deque(maxlen=max_failures)
        self.blocked_until = 0.0


class LoginLimiter:
    def __init__(
        self,
        *,
        max_failures: int = MAX_FAILURES,
        window: float = WINDOW_S,
        backoff: float = BACKOFF_S,
        max_addresses: int = MAX_ADDRESSES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_failures < 1 or max_addresses < 1:
            raise ValueError("max_failures and max_addresses must be at least 1")
        self.max_failures = max_failures
        self.window = window
        self.backoff = backoff
        self.max_addresses = max_addresses
        self.clock = clock
        self._entries: OrderedDict[str, _Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def retry_after(self, address: str) -> float:
        """Seconds until ``address`` may try again; 0.0 when it may try now."""
        entry = self._entries.get(address)
        if entry is None:
            return 0.0
        left = entry.blocked_until - self.clock()
        if left > 0:
            return left
        if entry.blocked_until:  # the block is over: start afresh
            del self._entries[address]
        return 0.0

    def blocked(self, address: str) -> bool:
        return self.retry_after(address) > 0

    def record_failure(self, address: str) -> None:
        now = self.clock()
        entry = self._entries.get(address)
        if entry is None:
            entry = self._entries[address] = _Entry(self.max_failures)
            if len(self._entries) > self.max_addresses:
                self._entries.popitem(last=False)
        else:
            self._entries.move_to_end(address)
            if entry.blocked_until > now:
                return
        failures = entry.failures
        while failures and failures[0] <= now - self.window:
            failures.popleft()
        failures.append(now)
        if len(failures) >= self.max_failures:
            entry.blocked_until = now + self.backoff
            failures.clear()
