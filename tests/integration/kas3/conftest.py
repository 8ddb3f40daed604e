"""KaS3 fixtures: a real SQLite meta store and file object store under ``tmp_path`` (and the
moto S3 server for the tests that ask for ``object_url`` with the ``s3`` param), wrapped so
tests can count object PUTs and meta transactions and inject failures."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from flowmq_commit import GroupCommitBatcher
from flowmq_kas3 import PageCache, StreamStore, build_batch
from flowmq_meta import MetaError, MetaStore, Transaction, open_meta_store
from flowmq_objstore import ObjectStore, ObjectStoreError, open_object_store
from tests.fixtures.s3 import s3_bucket_url, s3_client, s3_server  # noqa: F401

T = TypeVar("T")


class CountingObjectStore(ObjectStore):
    """Counts requests; ``fail_puts`` makes that many next PUTs fail."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.url = inner.url
        self.puts = 0
        self.gets = 0
        self.fail_puts = 0
        self.put_gate: Any = None  # an asyncio.Event a PUT waits for, when set
        self.put_waiting = asyncio.Event()  # set when a PUT is held at the gate

    async def put(self, key: str, data: bytes) -> None:
        if self.put_gate is not None:
            self.put_waiting.set()
            await self.put_gate.wait()
        self.puts += 1
        if self.fail_puts:
            self.fail_puts -= 1
            raise ObjectStoreError("injected PUT failure")
        await self.inner.put(key, data)

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        self.gets += 1
        return await self.inner.get(key, start, end)

    async def delete(self, key: str) -> None:
        await self.inner.delete(key)

    async def list(self, prefix: str = "") -> list[str]:
        return await self.inner.list(prefix)

    async def close(self) -> None:
        await self.inner.close()


class CountingMetaStore(MetaStore):
    """Counts transactions; ``fail_transactions`` makes that many next ones fail (after
    running ``fn``, as a failed commit would)."""

    def __init__(self, inner: MetaStore) -> None:
        self.inner = inner
        self.url = inner.url
        self.transactions = 0
        self.fail_transactions = 0

    async def transact(self, fn: Callable[[Transaction], T]) -> T:
        self.transactions += 1
        if self.fail_transactions:
            self.fail_transactions -= 1

            def failing(tr: Transaction) -> T:
                fn(tr)
                raise MetaError("injected commit failure")

            return await self.inner.transact(failing)
        return await self.inner.transact(fn)

    async def close(self) -> None:
        await self.inner.close()


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
