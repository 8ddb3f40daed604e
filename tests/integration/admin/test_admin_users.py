"""Users over the admin API (real HTTP, a broker on the SQLite meta store), and the broker's
UserDirectory that checks their logins: off the event loop, rate limited per address."""

from __future__ import annotations

import asyncio
import statistics

import pytest

from flowmq_meta.users import BAD_PASSWORD, RATE_LIMITED, UNKNOWN_USER
from tests.fixtures.cli import flowmq_user

USERS = "/api/v1/users"


def assert_error(status: int, body: dict, expected_status: int, code: str, *words: str) -> None:
    assert status == expected_status, body
    assert body["success"] is False and body["data"] is None
    assert body["error"]["code"] == code, body
    for word in words:
        assert word in body["error"]["message"], body


async def create(api, username: str, password: str = "pw", **extra) -> dict:
    status, body = await api.call(
        "POST", USERS, json={"username": username, "password": password, **extra}
    )
    assert status == 201, body
    return body["data"]


async def test_create_then_list_never_shows_secrets(api, broker):
    created = await create(api, "alice", "wonderland-pw")
    assert created.keys() == {"username", "namespace", "created_at_ms"}
    assert created["username"] == "alice" and created["namespace"] == "default"
    assert isinstance(created["created_at_ms"], int)
    async with api.session.get(
        api.base + USERS, headers={"Authorization": "Bearer test-token"}
    ) as response:
        assert response.status == 200
        text = await response.text()
        body = await response.json()
    assert body["data"] == [created]
    for secret in ("wonderland-pw", "scrypt", "salt", "stored_key", "server_key", "password"):
        assert secret not in text
    assert await broker.users.authenticate("alice", b"wonderland-pw", "192.0.2.1")


async def test_duplicate_is_409(api):
    await create(api, "alice")
    status, body = await api.call("POST", USERS, json={"username": "alice", "password": "x"})
    assert_error(status, body, 409, "already_exists", "alice")


@pytest.mark.parametrize(
    ("payload", "status", "code", "words"),
    [
        ({"username": "bob", "password": ""}, 422, "validation_failed", ("password",)),
        ({"username": "bob"}, 422, "validation_failed", ("password",)),
        ({"password": "pw"}, 422, "validation_failed", ("username",)),
        ({"username": "", "password": "pw"}, 422, "validation_failed", ("username",)),
        ({"username": "b\x01b", "password": "pw"}, 422, "validation_failed", ("username",)),
        ({"username": "bob", "password": "pw", "role": "x"}, 422, "validation_failed", ("role",)),
        ({"username": "é" * 128, "password": "pw"}, 422, "invalid_name", ("255 bytes",)),
        ({"username": "bob", "password": "pw", "namespace": "a b"}, 422, "validation_failed",
         ("namespace",)),
        ({"username": "bob", "password": "pw", "namespace": "nope"}, 404, "not_found", ("nope",)),
    ],
)  # fmt: skip
async def test_bad_create_bodies(api, payload, status, code, words):
    got, body = await api.call("POST", USERS, json=payload)
    assert_error(got, body, status, code, *words)
    status, body = await api.call("GET", USERS)
    assert body["data"] == []


async def test_malformed_json_is_400(api):
    status, body = await api.call("POST", USERS, data=b"{")
    assert_error(status, body, 400, "invalid_json")
    status, body = await api.call("POST", USERS, data=b"")
    assert_error(status, body, 400, "invalid_json")


async def test_username_of_255_bytes_is_accepted(api):
    name = "é" * 127 + "x"
    assert (await create(api, name))["username"] == name


async def test_namespace_of_a_user(api, broker):
    status, _ = await api.call("POST", "/api/v1/namespaces", json={"name": "tenant"})
    assert status == 201
    assert (await create(api, "carol", namespace="tenant"))["namespace"] == "tenant"
    result = await broker.users.authenticate("carol", "pw", "192.0.2.1")
    assert result and result.namespace == "tenant"


async def test_delete_then_authenticate_fails(api, broker):
    await create(api, "alice")
    assert await broker.users.authenticate("alice", "pw", "192.0.2.1")
    status, body = await api.call("DELETE", f"{USERS}/alice")
    assert status == 200 and body["data"] == {"deleted": "alice"}
    assert (await broker.users.authenticate("alice", "pw", "192.0.2.1")).reason == UNKNOWN_USER
    status, body = await api.call("GET", USERS)
    assert body["data"] == []
    status, body = await api.call("DELETE", f"{USERS}/alice")
    assert_error(status, body, 404, "not_found", "alice")


async def test_password_change_takes_effect(api, broker):
    created = await create(api, "alice", "old-pw")
    assert await broker.users.authenticate("alice", "old-pw", "192.0.2.1")
    status, body = await api.call("PUT", f"{USERS}/alice", json={"password": "new-pw"})
    assert status == 200 and body["data"] == created
    assert (await broker.users.authenticate("alice", "old-pw", "192.0.2.1")).reason == BAD_PASSWORD
    assert await broker.users.authenticate("alice", "new-pw", "192.0.2.1")


async def test_bad_password_changes(api):
    await create(api, "alice")
    status, body = await api.call("PUT", f"{USERS}/alice", json={"password": ""})
    assert_error(status, body, 422, "validation_failed", "password")
    status, body = await api.call("PUT", f"{USERS}/alice", json={"namespace": "x"})
    assert_error(status, body, 422, "validation_failed")
    status, body = await api.call("PUT", f"{USERS}/nobody", json={"password": "pw"})
    assert_error(status, body, 404, "not_found", "nobody")
    status, body = await api.call("PUT", f"{USERS}/a%01b", json={"password": "pw"})
    assert_error(status, body, 422, "validation_failed", "username")


async def test_user_names_with_a_slash(api, broker):
    await create(api, "team/alice")
    status, body = await api.call("PUT", f"{USERS}/team/alice", json={"password": "pw2"})
    assert status == 200, body
    assert await broker.users.authenticate("team/alice", "pw2", "192.0.2.1")
    status, body = await api.call("DELETE", f"{USERS}/team%2Falice")
    assert status == 200 and body["data"] == {"deleted": "team/alice"}


async def test_token_required(api):
    for method, path, payload in [
        ("GET", USERS, None),
        ("POST", USERS, {"username": "eve", "password": "pw"}),
        ("PUT", f"{USERS}/eve", {"password": "pw"}),
        ("DELETE", f"{USERS}/eve", None),
    ]:
        status, body = await api.call(method, path, json=payload, token=None)
        assert_error(status, body, 401, "unauthorized")


async def test_openapi_document_declares_the_user_endpoints(api):
    status, document = await api.call("GET", "/api/v1/openapi.json", token=None)
    assert status == 200
    assert set(document["paths"][USERS]) == {"get", "post"}
    assert set(document["paths"][f"{USERS}/{{username}}"]) == {"put", "delete"}


async def test_unknown_user_is_refused(api, broker):
    await create(api, "alice")
    result = await broker.users.authenticate("mallory", "pw", "192.0.2.1")
    assert not result and result.reason == UNKNOWN_USER


async def test_rate_limit_per_address(api, broker):
    await create(api, "alice", "right")
    users = broker.users
    for _ in range(5):
        assert (await users.authenticate("alice", "wrong", "192.0.2.66")).reason == BAD_PASSWORD
    checks = users.password_checks
    limited = await users.authenticate("alice", "right", "192.0.2.66")
    assert limited.reason == RATE_LIMITED and limited.retry_after > 0
    assert users.password_checks == checks  # refused before any hashing
    assert await users.authenticate("alice", "right", "192.0.2.67")


async def test_authenticate_keeps_the_event_loop_responsive(api, broker):
    for i in range(4):
        await create(api, f"user{i}", f"password-{i}")
    loop = asyncio.get_running_loop()
    lags: list[float] = []
    period = 0.002

    async def ticker() -> None:
        while True:
            start = loop.time()
            await asyncio.sleep(period)
            lags.append(loop.time() - start - period)

    checks = broker.users.password_checks
    tick = asyncio.create_task(ticker())
    try:
        results = await asyncio.gather(
            *(broker.users.authenticate(f"user{i}", f"password-{i}", "192.0.2.9") for i in range(4))
        )
    finally:
        tick.cancel()
    assert all(results)
    assert broker.users.password_checks == checks + 4  # four real scrypt runs, no cache
    # scrypt takes ~50 ms a check: on the loop, 4 checks would leave a handful of ticks, each
    # late by that much.  The 90th percentile keeps other processes' scheduling noise out.
    assert len(lags) >= 10, lags
    assert statistics.quantiles(lags, n=10)[-1] < 0.020, sorted(lags)[-5:]


async def test_cli_user_with_namespace_is_listed_by_the_api(api, broker):
    status, _ = await api.call("POST", "/api/v1/namespaces", json={"name": "tenant"})
    assert status == 201
    done = await asyncio.to_thread(
        flowmq_user, broker.data_dir, "add", "dave", "--password", "pw", "--namespace", "tenant"
    )
    assert done.returncode == 0, done.stderr
    status, body = await api.call("GET", USERS)
    assert [(u["username"], u["namespace"]) for u in body["data"]] == [("dave", "tenant")]
