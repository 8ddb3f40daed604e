"""Write-path fixtures: a SQLite meta store and a file object store under ``tmp_path``,
wrapped to count requests and inject failures (``tests/fixtures/counting.py``), or bare
(``stores``: the pair the flush thread and the flush process need)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from flowmq_meta import MetaStore, open_meta_store
from flowmq_objstore import ObjectStore, open_object_store
from tests.fixtures.counting import CountingMetaStore, CountingObjectStore


@pytest.fixture
async def meta(tmp_path: Path) -> AsyncIterator[CountingMetaStore]:
    store = CountingMetaStore(open_meta_store(f"sqlite:///{tmp_path / 'meta.db'}"))
    yield store
    await store.close()


@pytest.fixture
async def objects(tmp_path: Path) -> AsyncIterator[CountingObjectStore]:
    store = CountingObjectStore(open_object_store((tmp_path / "objects").as_uri()))
    yield store
    await store.close()


@pytest.fixture
async def stores(tmp_path: Path) -> AsyncIterator[tuple[MetaStore, ObjectStore]]:
    # Watches are polled every 600 s: within a test only this process's commits fire them.
    meta = open_meta_store(f"sqlite:///{tmp_path / 'meta.db'}?poll_interval=600")
    objects = open_object_store((tmp_path / "objects").as_uri())
    yield meta, objects
    await objects.close()
    await meta.close()
