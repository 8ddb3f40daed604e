"""``Catalog.update_destination`` with a change function, on SQLite meta stores: the change is
applied to the record its own transaction reads, so concurrent updates (also through two
connections, where SQLite conflicts make a transaction and its change run again) all stay."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from flowmq_core.errors import InvalidName, NotFound
from flowmq_meta import open_meta_store
from flowmq_meta.catalog import DEFAULT_NAMESPACE, QUEUE, STREAM, Catalog, Destination

N = 20


@pytest.fixture
async def catalogs(tmp_path):
    url = f"sqlite:///{tmp_path / 'meta.db'}"
    stores = [open_meta_store(url), open_meta_store(url)]
    catalogs = [Catalog(store) for store in stores]
    await catalogs[0].ensure_namespace()
    await catalogs[0].create_destination(Destination(STREAM, DEFAULT_NAMESPACE, "s", ["s/0"]))
    yield catalogs
    for store in stores:
        await store.close()


def _adding(topic_filter: str):
    def change(current: Destination) -> Destination:
        return dataclasses.replace(current, topic_filters=[*current.topic_filters, topic_filter])

    return change


async def test_concurrent_changes_through_two_connections_all_stay(catalogs):
    await asyncio.gather(
        *(
            catalogs[i % 2].update_destination(DEFAULT_NAMESPACE, "s", STREAM, _adding(f"s/{i}"))
            for i in range(1, N + 1)
        )
    )
    got = await catalogs[0].get_destination(DEFAULT_NAMESPACE, "s", STREAM)
    assert sorted(got.topic_filters) == sorted(f"s/{i}" for i in range(N + 1))


async def test_a_change_keeps_the_creation_time_and_may_not_rename(catalogs):
    catalog = catalogs[0]
    before = await catalog.get_destination(DEFAULT_NAMESPACE, "s", STREAM)
    after = await catalog.update_destination(
        DEFAULT_NAMESPACE, "s", STREAM, lambda d: dataclasses.replace(d, created_at_ms=1)
    )
    assert after.created_at_ms == before.created_at_ms and after.version > before.version
    with pytest.raises(InvalidName):
        await catalog.update_destination(
            DEFAULT_NAMESPACE, "s", STREAM, lambda d: dataclasses.replace(d, name="t")
        )
    with pytest.raises(NotFound):
        await catalog.update_destination(DEFAULT_NAMESPACE, "s", QUEUE, lambda d: d)
