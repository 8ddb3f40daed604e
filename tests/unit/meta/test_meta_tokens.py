"""Scoped admin tokens in a real SQLite meta store (flowmq_meta.tokens): only a hash of the
secret is kept, changes go through the change log, the directory finds a token by its secret
only, and deleting a namespace's tokens leaves the others."""

from __future__ import annotations

import hashlib
import json

import pytest

from flowmq_core.errors import NotFound
from flowmq_meta import keys, open_meta_store
from flowmq_meta.catalog import Catalog
from flowmq_meta.changelog import changes_since
from flowmq_meta.tokens import (
    TokenDirectory,
    create_token,
    delete_namespace_tokens,
    delete_token,
    load_token_records,
    new_secret,
)


@pytest.fixture
async def store(tmp_path):
    store = open_meta_store(f"sqlite:///{tmp_path / 'meta.db'}")
    catalog = Catalog(store)
    await catalog.ensure_namespace()
    await catalog.create_namespace("a")
    await catalog.create_namespace("b")
    yield store
    await store.close()


async def test_the_record_keeps_a_hash_of_the_secret_never_the_secret(store):
    token, secret = await create_token(store, "a", "viewer", "dashboards")
    assert len(secret) >= 43  # 32 random bytes, URL-safe base64
    raw = await store.transact(lambda tr: tr.get(keys.ADMIN_TOKENS.pack(token.id)))
    assert secret.encode() not in raw
    record = json.loads(raw)
    assert record["sha256"] == hashlib.sha256(secret.encode()).hexdigest()
    assert (record["namespace"], record["role"], record["description"]) == (
        "a",
        "viewer",
        "dashboards",
    )
    log = await store.transact(lambda tr: changes_since(tr, 0))
    assert log[-1]["kind"] == "token.created"


async def test_directory_finds_a_token_by_its_secret_until_it_is_deleted(store):
    directory = TokenDirectory(store)
    token, secret = await create_token(store, "a", "admin")
    assert directory.lookup(secret) is None  # not reloaded yet
    await directory.refresh()
    assert directory.lookup(secret) == token
    assert directory.lookup(secret + "x") is None
    assert directory.lookup(token.id) is None
    assert await delete_token(store, token.id)
    assert not await delete_token(store, token.id)
    await directory.refresh()
    assert directory.lookup(secret) is None


async def test_refused_for_an_unknown_namespace_or_role(store):
    with pytest.raises(NotFound):
        await create_token(store, "nowhere", "admin")
    with pytest.raises(ValueError):
        await create_token(store, "a", "owner")
    assert await load_token_records(store) == []


async def test_deleting_a_namespaces_tokens_keeps_the_others(store):
    a1, _ = await create_token(store, "a", "admin")
    a2, _ = await create_token(store, "a", "viewer")
    b1, _ = await create_token(store, "b", "admin")
    assert sorted(await delete_namespace_tokens(store, "a")) == sorted([a1.id, a2.id])
    assert [r["id"] for r in await load_token_records(store)] == [b1.id]


def test_a_secret_never_begins_with_a_dash():
    """The CLI's ``--token -x…`` would take it for an option (1 secret in 64 did)."""
    drawn = [new_secret() for _ in range(2000)]
    assert not [s for s in drawn if s.startswith("-")]
    assert len(set(drawn)) == 2000 and all(len(s) == 43 for s in drawn)
