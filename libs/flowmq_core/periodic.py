"""A background coroutine run every N seconds: heartbeats, catalog refresh, jobs."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)


class PeriodicTask:
    """Runs ``action`` every ``interval`` seconds until stopped.

    A failing run is logged and the next one still happens: a background duty must not die
    silently because one meta-store call failed.
    """

    def __init__(self, name: str, interval: float, action: Callable[[], Awaitable[None]]) -> None:
        self.name = name
        self.interval = interval
        self.action = action
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.action()
            except Exception:
                log.exception("%s failed; retrying in %.1f s", self.name, self.interval)

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
