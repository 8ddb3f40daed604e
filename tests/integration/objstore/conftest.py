"""Object store suite: every test taking ``store``/``store_url`` runs once per backend."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from flowmq_objstore import ObjectStore, open_object_store
from tests.fixtures.s3 import s3_bucket_url, s3_client, s3_server  # noqa: F401

BACKENDS = ["file", "s3"]


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "file":
        return (tmp_path / "objects").as_uri()
    # Looked up lazily so file-only runs (-k file) never start the moto server.
    return request.getfixturevalue("s3_bucket_url")


@pytest.fixture
async def store(store_url: str) -> AsyncIterator[ObjectStore]:
    s = open_object_store(store_url)
    yield s
    await s.close()
