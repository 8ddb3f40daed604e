"""Consumer-group offsets in the meta store: concurrent commits share transactions and are
acknowledged only once durable."""

from __future__ import annotations

import asyncio

from flowmq_meta import MetaStore, open_meta_store
from flowmq_meta.group_offsets import CommittedOffset, GroupOffsetStore, StaleGeneration


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


async def test_a_commit_of_a_generation_older_than_the_stored_one_is_refused(tmp_path) -> None:
    """Two coordinators of one group on one meta store (the deposed one's write delayed):
    generations never repeat, and the older generation's commit cannot land after the
    newer one's, while unfenced commits (generation -1) are written as before."""
    meta = open_meta_store(f"sqlite:///{tmp_path / 'meta.db'}")
    deposed, successor = GroupOffsetStore(meta), GroupOffsetStore(meta)
    first = await deposed.next_generation("default", "g", 0)
    assert first == 1
    await deposed.commit("default", "g", [("s", 0, CommittedOffset(100))], first)
    # The successor's in-memory group starts at 0: its generation continues from the store.
    second = await successor.next_generation("default", "g", 0)
    assert second == 2
    await successor.commit("default", "g", [("s", 0, CommittedOffset(200))], second)
    late = deposed.commit("default", "g", [("s", 0, CommittedOffset(50))], first)
    current = deposed.commit("default", "g", [("s", 1, CommittedOffset(7))], second)
    other_group = deposed.commit("default", "h", [("s", 0, CommittedOffset(9))], first)
    results = await asyncio.gather(late, current, other_group, return_exceptions=True)
    assert isinstance(results[0], StaleGeneration)
    assert results[1:] == [None, None]  # one batch: only the stale commit was refused
    got = await successor.fetch("default", "g")
    assert got[("s", 0)].offset == 200 and got[("s", 1)].offset == 7
    await deposed.commit("default", "g", [("s", 0, CommittedOffset(300))])  # unfenced
    assert (await successor.fetch("default", "g"))[("s", 0)].offset == 300
    await meta.close()
