"""Two admin updates of one destination at once, each changing its own setting: both stay. An
update reads the record inside the transaction that writes it, so a second update that commits
in between is what the first one changes, not something it overwrites."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from flowmq_meta import MetaStore, Transaction

T = TypeVar("T")
TIMEOUT = 5.0


class HoldFirstUpdate:
    """The broker's SQLite meta store, except that the first transaction of
    ``Catalog.update_destination`` waits until ``release`` is set; all else passes through."""

    def __init__(self, inner: MetaStore) -> None:
        self.inner = inner
        self.held = asyncio.Event()
        self.release = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def transact(self, fn: Callable[[Transaction], T]) -> T:
        if not self.held.is_set() and fn.__qualname__.startswith("Catalog.update_destination."):
            self.held.set()
            await self.release.wait()
        return await self.inner.transact(fn)


async def test_concurrent_updates_of_one_stream_both_survive(broker, api):
    status, body = await api.call(
        "POST", "/api/v1/streams", json={"name": "race", "topic_filters": ["race/#"]}
    )
    assert status == 201, body
    gate = HoldFirstUpdate(broker.catalog.store)
    broker.catalog.store = gate
    try:
        first = asyncio.create_task(
            api.call("PUT", "/api/v1/streams/race", json={"retention_ms": 1234})
        )
        await asyncio.wait_for(gate.held.wait(), TIMEOUT)
        # The first update is between its start and its write; the second one commits now.
        status, body = await api.call("PUT", "/api/v1/streams/race", json={"retention_bytes": 5678})
        assert status == 200 and body["data"]["retention_bytes"] == 5678, body
        gate.release.set()
        status, body = await asyncio.wait_for(first, TIMEOUT)
        assert status == 200, body
    finally:
        gate.release.set()
        broker.catalog.store = gate.inner
    status, body = await api.call("GET", "/api/v1/streams/race")
    assert status == 200, body
    got = body["data"]
    assert (got["retention_ms"], got["retention_bytes"]) == (1234, 5678), got
