"""Consumer-group offsets in the meta store: concurrent commits share transactions and are
acknowledged only once durable."""

from __future__ import annotations

import asyncio

from flowmq_meta import MetaStore, open_meta_store
from flowmq_meta.group_offsets import CommittedOffset, GroupOffsetStore


class SlowMeta(MetaStore):
    """Counts transactions and makes each take a while, as a real commit does."""

    def __init__(self) -> None:
        self.inner = open_meta_store("memory://")
        self.url = self.inner.url
        self.count = 0

    async def transact(self, fn):  # type: ignore[override]
        self.count += 1
        await asyncio.sleep(0.01)
        return await self.inner.transact(fn)

    async def close(self) -> None:
        await self.inner.close()


async def test_concurrent_commits_are_coalesced_and_readable() -> None:
    meta = SlowMeta()
    store = GroupOffsetStore(meta)
    futures = [
        store.commit(
            "default", f"g{i % 3}", [("orders", i, CommittedOffset(i * 10, f"m{i}", 2, 1))]
        )
        for i in range(50)
    ]
    assert not any(f.done() for f in futures)
    await asyncio.gather(*futures)
    assert meta.count <= 2  # one transaction, maybe one more for stragglers
    got = await store.fetch("default", "g1")
    assert got[("orders", 1)] == CommittedOffset(10, "m1", 2, 1)
    assert len(got) == 17
    some = await store.fetch("default", "g0", [("orders", 0), ("orders", 1), ("other", 0)])
    assert list(some) == [("orders", 0)]
    assert await store.groups("default") == ["g0", "g1", "g2"]
    await store.delete_stream("default", "orders")
    assert await store.fetch("default", "g2") == {}
    await meta.close()


async def test_a_failed_transaction_fails_its_commits_only() -> None:
    meta = open_meta_store("memory://")
    store = GroupOffsetStore(meta)
    real = meta.transact
    calls = 0

    async def flaky(fn):
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("meta store down")
        return await real(fn)

    meta.transact = flaky  # type: ignore[method-assign]
    first = store.commit("default", "g", [("s", 0, CommittedOffset(5))])
    results = await asyncio.gather(first, return_exceptions=True)
    assert isinstance(results[0], RuntimeError)
    await store.commit("default", "g", [("s", 0, CommittedOffset(6))])

    assert (await store.fetch("default", "g"))[("s", 0)].offset == 6
    await meta.close()
