"""KaS3 fixtures: a real SQLite meta store and file object store under ``tmp_path`` (and the
moto S3 server for the tests that ask for ``object_url`` with the ``s3`` param), wrapped so
tests can count object PUTs and meta transactions and inject failures
(``tests/fixtures/counting.py``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from flowmq_commit import GroupCommitBatcher
from flowmq_kas3 import PageCache, StreamStore, build_batch
from flowmq_meta import open_meta_store
from flowmq_objstore import open_object_store
from tests.fixtures.counting import CountingMetaStore, CountingObjectStore
from tests.fixtures.s3 import s3_bucket_url, s3_client, s3_server  # noqa: F401


def make_batch(values: list[bytes], timestamp: int = 1_000, key: bytes | None = None) -> bytes:
    return build_batch([(key, v, [], timestamp) for v in values])


@pytest.fixture
def meta_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'meta.db'}"


@pytest.fixture(params=["file"])
def object_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "file":
        return (tmp_path / "objects").as_uri()
    return request.getfixturevalue("s3_bucket_url")


@pytest.fixture
async def meta(meta_url: str) -> AsyncIterator[CountingMetaStore]:
    store = CountingMetaStore(open_meta_store(meta_url))
    yield store
    await store.close()


@pytest.fixture
async def objects(object_url: str) -> AsyncIterator[CountingObjectStore]:
    store = CountingObjectStore(open_object_store(object_url))
    yield store
    await store.close()


@pytest.fixture
async def batcher(
    meta: CountingMetaStore, objects: CountingObjectStore
) -> AsyncIterator[GroupCommitBatcher]:
    b = GroupCommitBatcher(meta, objects, node_id="test-node", flush_interval=0.002)
    await b.start()
    yield b
    await b.close()


@pytest.fixture
def stream_store(
    meta: CountingMetaStore, objects: CountingObjectStore, batcher: GroupCommitBatcher
) -> StreamStore:
    return StreamStore(meta, objects, batcher, PageCache(8 * 1024 * 1024))
