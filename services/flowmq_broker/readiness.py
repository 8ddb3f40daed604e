"""Readiness of a broker (``GET /api/v1/ready``): can it serve durable work right now?

Three checks, each with a short timeout, run together:

- ``meta``: a write transaction on the meta store (a probe key set and cleared again, so
  nothing stays), since a read alone passes while another process holds SQLite's write lock
  and every durable write is failing;
- ``objects``: a small probe object put and deleted again, so a ``file://`` directory that
  became unwritable (or was replaced by a file) and a stopped S3 server are both noticed —
  a read alone would pass on a read-only disk;
- ``cluster``: this broker's cluster plane (gossip, inter-broker links) is up and it is not
  stopping.  Other nodes being down does not make this one unready: a survivor must keep
  taking traffic when a peer dies.

Concurrent requests share one run of the checks, so a load balancer polling hard costs one
probe object at a time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

from flowmq_commit.batcher import key_component
from flowmq_meta import keys
from flowmq_meta.api import MetaStore, Transaction
from flowmq_objstore.api import ObjectStore

CHECK_TIMEOUT_S = 2.0
PROBE_PREFIX = "_probe/"

CheckResult = dict[str, Any]


async def _timed(step: Callable[[], Awaitable[Any]], timeout: float) -> CheckResult:
    started = time.monotonic()
    try:
        async with asyncio.timeout(timeout):
            details = await step()
    except TimeoutError:
        error: str | None = f"no answer within {timeout:g} s"
        details = None
    except Exception as exc:  # any failure of the store is a failed check, never a 500
        error = f"{type(exc).__name__}: {exc}"[:300]
        details = None
    else:
        error = None
    result: CheckResult = {
        "ok": error is None,
        "ms": round((time.monotonic() - started) * 1000, 1),
        "error": error,
    }
    if details:
        result.update(details)
    return result


@dataclasses.dataclass(eq=False)
class Readiness:
    """The checks of one broker.  ``cluster_state()``: (None or why the cluster plane is not
    up, details)."""

    node_id: str
    meta: MetaStore
    objects: ObjectStore
    cluster_state: Callable[[], tuple[str | None, dict[str, Any]]]
    _: dataclasses.KW_ONLY
    timeout: float = CHECK_TIMEOUT_S
    _running: asyncio.Future[dict[str, CheckResult]] | None = dataclasses.field(
        default=None, init=False, repr=False
    )

    def __post_init__(self) -> None:
        # A random suffix: brokers started with the same node id never delete each other's probe.
        self._probe_key = f"{PROBE_PREFIX}{key_component(self.node_id)}-{secrets.token_hex(4)}"
        self._meta_probe_key = keys.SETTINGS.pack("readiness_probe", self._probe_key)

    async def checks(self) -> dict[str, CheckResult]:
        if self._running is None or self._running.done():
            self._running = asyncio.ensure_future(self._run())
        return await asyncio.shield(self._running)

    async def _run(self) -> dict[str, CheckResult]:
        meta, objects = await asyncio.gather(
            _timed(self._check_meta, self.timeout), _timed(self._check_objects, self.timeout)
        )
        return {"meta": meta, "objects": objects, "cluster": self._check_cluster()}

    async def _check_meta(self) -> None:
        key = self._meta_probe_key

        def probe(tr: Transaction) -> None:
            tr.set(key, b"flowmq readiness probe")
            tr.clear(key)

        await self.meta.transact(probe)

    async def _check_objects(self) -> None:
        await self.objects.put(self._probe_key, b"flowmq readiness probe")
        await self.objects.delete(self._probe_key)

    def _check_cluster(self) -> CheckResult:
        problem, details = self.cluster_state()
        return {"ok": problem is None, "ms": 0.0, "error": problem, **details}
