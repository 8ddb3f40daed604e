"""`flowmq user add`: empty passwords and bad names refused with one line and exit code 2,
``--namespace`` stored; the users land in the data directory's SQLite meta store."""

from __future__ import annotations

import pytest

from flowmq_core.config import BrokerConfig
from flowmq_meta import open_meta_store
from flowmq_meta.catalog import Catalog
from flowmq_meta.users import load_users
from tests.fixtures.cli import flowmq_user


async def stored_users(data_dir) -> dict:
    store = open_meta_store(BrokerConfig(data_dir=str(data_dir)).resolved().meta)
    try:
        return await load_users(store)
    finally:
        await store.close()


@pytest.mark.parametrize(
    ("args", "stdin", "words"),
    [
        (("alice", "--password", ""), None, "password must not be empty"),
        (("alice",), "\n", "password must not be empty"),
        (("alice",), "", "password must not be empty"),
        (("bad\x01name", "--password", "pw"), None, "control characters"),
        (("é" * 128, "--password", "pw"), None, "255 bytes"),
        (("alice", "--password", "pw", "--namespace", "a b"), None, "namespace name"),
    ],
)
async def test_bad_input_refused_with_one_line(tmp_path, args, stdin, words):
    data_dir = tmp_path / "d"
    assert flowmq_user(data_dir, "add", "keep", "--password", "pw").returncode == 0
    done = flowmq_user(data_dir, "add", *args, stdin=stdin)
    assert done.returncode == 2, done
    assert done.stderr.count("\n") == 1 and words in done.stderr, done.stderr
    assert list(await stored_users(data_dir)) == ["keep"]


async def test_namespace_flag(tmp_path):
    data_dir = tmp_path / "d"
    assert flowmq_user(data_dir, "add", "alice", "--password", "pw").returncode == 0
    missing = flowmq_user(data_dir, "add", "bob", "--password", "pw", "--namespace", "tenant")
    assert missing.returncode == 1 and "namespace 'tenant' does not exist" in missing.stderr
    store = open_meta_store(BrokerConfig(data_dir=str(data_dir)).resolved().meta)
    try:
        await Catalog(store).create_namespace("tenant")
    finally:
        await store.close()
    done = flowmq_user(data_dir, "add", "bob", "--password", "pw", "--namespace", "tenant")
    assert done.returncode == 0 and done.stdout == "user bob saved\n", done.stderr
    again = flowmq_user(data_dir, "add", "bob", stdin="pw2\n")  # keeps its namespace
    assert again.returncode == 0, again.stderr
    users = await stored_users(data_dir)
    assert {name: user["namespace"] for name, user in users.items()} == {
        "alice": "default",
        "bob": "tenant",
    }
    assert flowmq_user(data_dir, "list").stdout.split() == ["alice", "bob"]
