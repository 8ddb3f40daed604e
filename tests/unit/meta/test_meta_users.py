"""Users in a real SQLite meta store and the UserDirectory that checks logins: records keep
no password, SCRAM credentials work, the rate limit, the keyed cache and its invalidation."""

from __future__ import annotations

import asyncio
import hashlib
import json

import pytest

from flowmq_core.errors import AlreadyExists, InvalidName, NotFound
from flowmq_meta import keys, open_meta_store
from flowmq_meta.catalog import Catalog
from flowmq_meta.changelog import changes_since, read_version
from flowmq_meta.login_limiter import LoginLimiter
from flowmq_meta.scram import MECHANISMS, MIN_ITERATIONS, ScramError, ScramServer
from flowmq_meta.users import (
    BAD_PASSWORD,
    OK,
    RATE_LIMITED,
    UNKNOWN_USER,
    InvalidPassword,
    UserDirectory,
    create_user,
    delete_user,
    hash_password,
    load_users,
    set_password,
    set_user,
    user_view,
)
from tests.unit.meta.test_meta_scram import Client


@pytest.fixture
async def store(tmp_path):
    store = open_meta_store(f"sqlite:///{tmp_path / 'meta.db'}")
    yield store
    await store.close()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
async def directory(store, clock):
    return UserDirectory(store, limiter=LoginLimiter(clock=clock))


async def test_record_keeps_no_password_and_has_scram_credentials(store, directory):
    await create_user(store, "alice", "wonderland-pw")
    raw = await store.transact(lambda tr: tr.get(keys.USERS.pack("alice")))
    assert b"wonderland-pw" not in raw
    record = json.loads(raw)
    assert record["namespace"] == "default"
    assert record["password"].startswith("scrypt$")
    assert set(record["scram"]) == set(MECHANISMS)
    for credential in record["scram"].values():
        assert set(credential) == {"salt", "iterations", "stored_key", "server_key"}
        assert credential["iterations"] >= MIN_ITERATIONS
    assert user_view(record).keys() == {"username", "namespace", "created_at_ms"}


@pytest.mark.parametrize("mechanism", sorted(MECHANISMS))
async def test_stored_scram_credential_logs_in_with_the_password_only(store, mechanism):
    await create_user(store, "alice", "wonderland-pw")
    directory = UserDirectory(store)
    await directory.refresh()
    for password, accepted in (("wonderland-pw", True), ("guess", False)):
        client = Client(MECHANISMS[mechanism], "alice", password)
        server = ScramServer(mechanism)
        first = server.receive_client_first(client.first())
        final = client.final(
            server.server_first(directory.scram_credential(first.username, mechanism))
        )
        if accepted:
            client.check_server_final(server.receive_client_final(final))
        else:
            with pytest.raises(ScramError):
                server.receive_client_final(final)


async def test_every_change_is_in_the_change_log(store):
    await create_user(store, "alice", "pw1")
    await set_password(store, "alice", "pw2")
    await delete_user(store, "alice")
    log = await store.transact(lambda tr: changes_since(tr, 0))
    assert [entry["kind"] for entry in log] == ["user.created", "user.updated", "user.deleted"]
    assert await store.transact(read_version) == 3


async def test_create_refuses_duplicates_and_bad_input(store):
    await create_user(store, "alice", "pw")
    with pytest.raises(AlreadyExists):
        await create_user(store, "alice", "other")
    with pytest.raises(InvalidPassword):
        await create_user(store, "bob", "")
    with pytest.raises(InvalidPassword):
        await set_user(store, "bob", "")
    with pytest.raises(InvalidName):
        await create_user(store, "", "pw")
    with pytest.raises(InvalidName):
        await create_user(store, "tab\there", "pw")
    with pytest.raises(InvalidName):
        await create_user(store, "c1\x85", "pw")
    with pytest.raises(InvalidName):
        await create_user(store, "é" * 128, "pw")  # 256 bytes
    await create_user(store, "é" * 127 + "x", "pw")  # 255 bytes
    with pytest.raises(NotFound):
        await set_password(store, "nobody", "pw")
    assert sorted(await load_users(store)) == ["alice", "é" * 127 + "x"]


async def test_namespace_must_exist_except_default(store):
    with pytest.raises(NotFound):
        await create_user(store, "alice", "pw", namespace="tenant")
    await Catalog(store).create_namespace("tenant")
    assert (await create_user(store, "alice", "pw", namespace="tenant"))["namespace"] == "tenant"
    await set_password(store, "alice", "pw2")  # keeps the namespace
    await set_user(store, "alice", "pw3")  # so does the CLI's upsert without --namespace
    assert (await load_users(store))["alice"]["namespace"] == "tenant"


async def test_authenticate_accepts_the_password_only(store, directory):
    await create_user(store, "alice", "pw")
    await directory.refresh()
    accepted = await directory.authenticate("alice", b"pw", "10.0.0.1")
    assert accepted and accepted.reason == OK and accepted.namespace == "default"
    refused = await directory.authenticate("alice", "nope", "10.0.0.1")
    assert not refused and refused.reason == BAD_PASSWORD and refused.namespace is None


async def test_missing_password_refused(store, directory):
    await create_user(store, "alice", "pw")
    await directory.refresh()
    assert (await directory.authenticate("alice", None, "10.0.0.1")).reason == BAD_PASSWORD
    assert (await directory.authenticate("bob", None, "10.0.0.1")).reason == UNKNOWN_USER


async def test_unknown_user_refused(store, directory):
    await directory.refresh()
    result = await directory.authenticate("mallory", b"", "10.0.0.1")
    assert not result and result.reason == UNKNOWN_USER


async def test_rate_limit_per_address(store, directory, clock):
    await create_user(store, "alice", "pw")
    await directory.refresh()
    for _ in range(5):
        assert (await directory.authenticate("alice", "wrong", "10.0.0.1")).reason == BAD_PASSWORD
    checks = directory.password_checks
    limited = await directory.authenticate("alice", "pw", "10.0.0.1")
    assert limited.reason == RATE_LIMITED and limited.retry_after == pytest.approx(60)
    assert (await directory.authenticate("mallory", "x", "10.0.0.1")).reason == RATE_LIMITED
    assert directory.password_checks == checks  # refused without hashing
    assert await directory.authenticate("alice", "pw", "10.0.0.2")  # another address
    clock.now += 59
    assert (await directory.authenticate("alice", "pw", "10.0.0.1")).reason == RATE_LIMITED
    clock.now += 1.5
    assert await directory.authenticate("alice", "pw", "10.0.0.1")


async def test_unknown_users_count_as_failures(store, directory):
    await directory.refresh()
    for i in range(5):
        assert (await directory.authenticate(f"u{i}", "x", "10.0.0.1")).reason == UNKNOWN_USER
    assert (await directory.authenticate("u0", "x", "10.0.0.1")).reason == RATE_LIMITED


async def test_failures_outside_the_window_do_not_add_up(store, directory, clock):
    await create_user(store, "alice", "pw")
    await directory.refresh()
    for _ in range(4):
        await directory.authenticate("alice", "wrong", "10.0.0.1")
    clock.now += 61
    for _ in range(4):
        await directory.authenticate("alice", "wrong", "10.0.0.1")
    assert await directory.authenticate("alice", "pw", "10.0.0.1")


def test_limiter_tracks_a_bounded_number_of_addresses(clock):
    limiter = LoginLimiter(max_addresses=3, max_failures=2, clock=clock)
    for address in ("a", "b", "c"):
        limiter.record_failure(address)
    limiter.record_failure("a")  # "a" blocked, and now the most recent
    limiter.record_failure("d")  # evicts "b", the least recently seen
    assert len(limiter) == 3
    assert limiter.blocked("a")
    limiter.record_failure("b")  # forgotten: this is its first failure again
    assert not limiter.blocked("b")


# Long enough that finding it by chance in a random digest or hash is impossible.
PASSWORD = "correct-horse-battery-staple"
PASSWORD_BYTES = PASSWORD.encode()


async def test_successes_are_cached_under_a_keyed_digest(store, directory):
    await create_user(store, "alice", PASSWORD)
    await directory.refresh()
    assert await directory.authenticate("alice", PASSWORD, "10.0.0.1")
    checks = directory.password_checks
    assert await directory.authenticate("alice", PASSWORD_BYTES, "10.0.0.1")
    assert directory.password_checks == checks  # served from the cache
    (digest,) = directory._verified
    other = UserDirectory(store)
    await other.refresh()
    assert await other.authenticate("alice", PASSWORD_BYTES, "10.0.0.1")
    (other_digest,) = other._verified
    assert digest != other_digest  # keyed per directory, not a plain hash
    for unkeyed in (
        PASSWORD_BYTES,
        hashlib.sha256(PASSWORD_BYTES).digest(),
        hashlib.sha256(b"alice" + PASSWORD_BYTES).digest(),
    ):
        assert unkeyed not in digest and unkeyed != digest
    assert all(PASSWORD_BYTES not in str(entry).encode() for entry in directory._verified.values())


async def test_password_change_invalidates_the_cache(store, directory):
    await create_user(store, "alice", "old")
    await directory.refresh()
    assert await directory.authenticate("alice", "old", "10.0.0.1")
    assert len(directory._verified) == 1
    await set_password(store, "alice", "new")
    await directory.refresh()
    assert len(directory._verified) == 0
    assert (await directory.authenticate("alice", "old", "10.0.0.1")).reason == BAD_PASSWORD
    assert await directory.authenticate("alice", "new", "10.0.0.1")


async def test_deleted_user_is_refused_even_when_cached(store, directory):
    await create_user(store, "alice", "pw")
    await directory.refresh()
    assert await directory.authenticate("alice", "pw", "10.0.0.1")
    await delete_user(store, "alice")
    await directory.refresh()
    assert (await directory.authenticate("alice", "pw", "10.0.0.1")).reason == UNKNOWN_USER
    assert directory.namespace_of("alice") is None


async def test_cache_is_bounded(store, clock):
    directory = UserDirectory(store, cache_size=2)
    for name in ("a", "b", "c"):
        await create_user(store, name, "pw")
    await directory.refresh()
    for name in ("a", "b", "c"):
        assert await directory.authenticate(name, "pw", "10.0.0.1")
    assert len(directory._verified) == 2
    checks = directory.password_checks
    assert await directory.authenticate("a", "pw", "10.0.0.1")  # evicted: checked again
    assert directory.password_checks == checks + 1


async def test_concurrent_checks_of_one_login_share_one_hash(store, directory):
    await create_user(store, "alice", "pw")
    await directory.refresh()
    checks = directory.password_checks
    results = await asyncio.gather(
        *(directory.authenticate("alice", "pw", f"10.0.0.{i}") for i in range(5))
    )
    assert all(results)
    assert directory.password_checks == checks + 1


async def test_record_from_before_namespaces_and_scram(store):
    old = {"name": "legacy", "password": hash_password("pw")}  # as written before
    await store.transact(lambda tr: tr.set(keys.USERS.pack("legacy"), json.dumps(old).encode()))
    directory = UserDirectory(store)
    await directory.refresh()
    assert directory.namespace_of("legacy") == "default"
    assert directory.scram_credential("legacy", "SCRAM-SHA-256") is None
    assert (await directory.authenticate("legacy", "pw", "10.0.0.1")).namespace == "default"
    assert user_view((await load_users(store))["legacy"])["created_at_ms"] is None
    await set_user(store, "legacy", "pw2")
    await directory.refresh()
    assert directory.scram_credential("legacy", "SCRAM-SHA-512") is not None
