"""A background coroutine run every N seconds: heartbeats, catalog refresh, jobs."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)


class PeriodicTask:
    """Runs ``action`` every ``interval`` seconds until stopped.

    A failing run is logged and the next one still happens: a background duty must not die
    silently because one meta-store call failed.  ``faults``: the exceptions by which the
    stores the action works on say they are unavailable (``flowmq_commit.STORE_FAILURES``);
    while they last it is an outage, not a bug: one WARNING line when it starts and one INFO
    line when a run succeeds again, not a traceback per run (every 30 s for as long as an
    object store is down).  Any other failure is logged with its traceback each time.
    """

    def __init__(
        self,
        name: str,
        interval: float,
        action: Callable[[], Awaitable[None]],
        *,
        faults: tuple[type[BaseException], ...] = (),
    ) -> None:
        self.name = name
        self.interval = interval
        self.action = action
        self.faults = faults
        self._task: asyncio.Task[None] | None = None
        self._outage_since: float | None = None  # loop time of the outage's first failure

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.action()
            except self.faults as exc:
                if self._outage_since is None:
                    self._outage_since = loop.time()
                    log.warning(
                        "%s: storage unavailable (%s); retrying every %.1f s",
                        self.name,
                        exc,
                        self.interval,
                    )
            except Exception:
                log.exception("%s failed; retrying in %.1f s", self.name, self.interval)
            else:
                if self._outage_since is not None:
                    down = loop.time() - self._outage_since
                    self._outage_since = None
                    log.info("%s: storage available again after %.1f s", self.name, down)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
