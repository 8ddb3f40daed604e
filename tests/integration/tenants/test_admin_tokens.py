"""Namespace-scoped admin tokens (``/api/v1/tokens``) against a real broker: only the cluster
admin token manages them; a token scoped to ``a`` reads (``viewer``) or changes (``admin``)
namespace ``a`` only, and gets 403 ``forbidden`` for namespace ``b`` and for what is
cluster-wide.  Without scoped tokens every call with one is a 401, and each test fails."""

from __future__ import annotations

import pytest

from tests.fixtures.broker_process import BrokerProcess, start_broker
from tests.fixtures.waiting import wait_until
from tests.integration.tenants.conftest import http
from tests.integration.tenants.test_tenant_isolation import Mqtt


def make_token(broker: BrokerProcess, namespace: str, role: str) -> dict:
    body = {"namespace": namespace, "role": role, "description": f"{role} of {namespace}"}
    status, answer = http(broker, "POST", "/tokens", body, broker.token)
    assert status == 201, answer
    return answer["data"]


@pytest.fixture(scope="module")
def a_admin(tenants_broker) -> str:
    return make_token(tenants_broker, "a", "admin")["token"]


@pytest.fixture(scope="module")
def a_viewer(tenants_broker) -> str:
    return make_token(tenants_broker, "a", "viewer")["token"]


def test_tokens_are_listed_without_their_secret_and_stop_working_once_deleted(tenants_broker):
    made = make_token(tenants_broker, "b", "viewer")
    secret = made["token"]
    assert set(made) == {"id", "namespace", "role", "description", "created_at_ms", "token"}
    status, answer = http(tenants_broker, "GET", "/tokens", token=tenants_broker.token)
    assert status == 200
    listed = [t for t in answer["data"] if t["id"] == made["id"]]
    assert listed == [{k: v for k, v in made.items() if k != "token"}]
    assert secret not in repr(answer)

    assert http(tenants_broker, "GET", "/streams", token=secret)[0] == 200
    status, _ = http(tenants_broker, "DELETE", f"/tokens/{made['id']}", token=tenants_broker.token)
    assert status == 200
    assert http(tenants_broker, "GET", "/streams", token=secret)[0] == 401
    assert (
        http(tenants_broker, "DELETE", f"/tokens/{made['id']}", token=tenants_broker.token)[0]
        == 404
    )


def test_only_the_cluster_token_manages_tokens(tenants_broker, a_admin):
    body = {"namespace": "a", "role": "admin"}
    for method, path, payload in (
        ("GET", "/tokens", None),
        ("POST", "/tokens", body),
        ("DELETE", "/tokens/0123abcd", None),
    ):
        status, answer = http(tenants_broker, method, path, payload, a_admin)
        assert (status, answer["error"]["code"]) == (403, "forbidden"), (method, path, answer)
    status, answer = http(
        tenants_broker, "POST", "/tokens", {"namespace": "nowhere", "role": "admin"},
        tenants_broker.token,
    )  # fmt: skip
    assert status == 404, answer
    status, answer = http(
        tenants_broker, "POST", "/tokens", {"namespace": "a", "role": "owner"}, tenants_broker.token
    )
    assert status == 422, answer


def test_scoped_admin_works_in_its_namespace_and_not_in_another(tenants_broker, a_admin, uid):
    cluster = tenants_broker.token
    name = f"s-{uid}"
    for namespace in ("a", "b"):
        status, answer = http(
            tenants_broker, "POST", f"/streams?namespace={namespace}", {"name": name}, cluster
        )
        assert status == 201, answer

    # Its own namespace, named or not.
    status, answer = http(tenants_broker, "GET", "/streams", token=a_admin)
    assert status == 200 and name in [s["name"] for s in answer["data"]], answer
    assert {s["namespace"] for s in answer["data"]} == {"a"}
    status, answer = http(tenants_broker, "GET", f"/streams/{name}?namespace=a", token=a_admin)
    assert status == 200 and answer["data"]["namespace"] == "a"
    status, answer = http(tenants_broker, "POST", "/queues", {"name": f"q-{uid}"}, a_admin)
    assert status == 201 and answer["data"]["namespace"] == "a", answer

    # Namespace b: neither listed, read nor deleted.
    for method, path in (
        ("GET", "/streams?namespace=b"),
        ("GET", f"/streams/{name}?namespace=b"),
        ("DELETE", f"/streams/{name}?namespace=b"),
        ("GET", "/queues?namespace=b"),
        ("GET", "/groups?namespace=b"),
        ("POST", "/topics/t%2F1/messages?namespace=b"),
    ):
        body = {"payload": "x"} if method == "POST" else None
        status, answer = http(tenants_broker, method, path, body, a_admin)
        assert (status, answer["error"]["code"]) == (403, "forbidden"), (method, path, answer)
    status, answer = http(tenants_broker, "GET", f"/streams/{name}?namespace=b", token=cluster)
    assert status == 200, "b's stream was deleted through a token scoped to a"

    status, answer = http(tenants_broker, "DELETE", f"/streams/{name}", token=a_admin)
    assert status == 200
    assert http(tenants_broker, "GET", f"/streams/{name}?namespace=a", token=cluster)[0] == 404


def test_scoped_token_sees_nothing_cluster_wide(tenants_broker, a_admin, uid):
    for method, path, body in (
        ("GET", "/cluster/nodes", None),
        ("POST", "/namespaces", {"name": f"n{uid}"}),
        ("DELETE", "/namespaces/b", None),
        ("GET", "/namespaces/b", None),
        ("PUT", "/users/bob", {"password": "stolen"}),
        ("DELETE", "/users/bob", None),
        ("POST", "/users", {"username": f"u{uid}", "password": "p", "namespace": "b"}),
    ):
        status, answer = http(tenants_broker, method, path, body, a_admin)
        assert (status, answer["error"]["code"]) == (403, "forbidden"), (method, path, answer)

    status, answer = http(tenants_broker, "GET", "/namespaces", token=a_admin)
    assert [n["name"] for n in answer["data"]] == ["a"]
    assert http(tenants_broker, "GET", "/namespaces/a", token=a_admin)[0] == 200
    status, answer = http(tenants_broker, "GET", "/users", token=a_admin)
    names = {u["username"] for u in answer["data"]}
    assert "alice" in names and "bob" not in names
    assert {u["namespace"] for u in answer["data"]} == {"a"}

    # A user made with an a-scoped token lands in a, and may be changed by it.
    body = {"username": f"carol-{uid}", "password": "pw"}
    status, answer = http(tenants_broker, "POST", "/users", body, a_admin)
    assert status == 201 and answer["data"]["namespace"] == "a", answer
    status, _ = http(tenants_broker, "PUT", f"/users/carol-{uid}", {"password": "new"}, a_admin)
    assert status == 200
    assert http(tenants_broker, "DELETE", f"/users/carol-{uid}", token=a_admin)[0] == 200


def test_viewer_reads_its_namespace_but_changes_nothing(tenants_broker, a_viewer, uid):
    assert http(tenants_broker, "GET", "/streams", token=a_viewer)[0] == 200
    assert http(tenants_broker, "GET", "/streams?namespace=b", token=a_viewer)[0] == 403
    for method, path, body in (
        ("POST", "/streams", {"name": f"v-{uid}"}),
        ("POST", "/queues", {"name": f"v-{uid}"}),
        ("POST", "/topics/t%2F1/messages", {"payload": "x"}),
        ("POST", "/users", {"username": f"v{uid}", "password": "p"}),
    ):
        status, answer = http(tenants_broker, method, path, body, a_viewer)
        assert (status, answer["error"]["code"]) == (403, "forbidden"), (method, path, answer)
    status, answer = http(tenants_broker, "GET", f"/streams/v-{uid}?namespace=a",
                          token=tenants_broker.token)  # fmt: skip
    assert status == 404, "a viewer created a stream"


def test_scoped_token_sees_and_kicks_its_own_clients_only(tenants_broker, a_admin, uid):
    alice = Mqtt(tenants_broker, "alice", f"alice-{uid}")
    bob = Mqtt(tenants_broker, "bob", f"bob-{uid}")
    try:
        status, answer = http(tenants_broker, "GET", "/clients", token=a_admin)
        assert status == 200
        ids = {c["client_id"] for c in answer["data"]}
        assert f"alice-{uid}" in ids and f"bob-{uid}" not in ids
        assert {c["namespace"] for c in answer["data"]} == {"a"}
        status, _ = http(tenants_broker, "DELETE", f"/clients/bob-{uid}", token=a_admin)
        assert status == 404
        status, _ = http(tenants_broker, "DELETE", f"/clients/alice-{uid}", token=a_admin)
        assert status == 200
    finally:
        alice.close()
        bob.close()


def test_deleting_a_namespace_revokes_its_tokens(tenants_broker, uid):
    cluster = tenants_broker.token
    namespace = f"gone{uid}"
    assert http(tenants_broker, "POST", "/namespaces", {"name": namespace}, cluster)[0] == 201
    secret = make_token(tenants_broker, namespace, "admin")["token"]
    assert http(tenants_broker, "GET", "/streams", token=secret)[0] == 200
    assert http(tenants_broker, "DELETE", f"/namespaces/{namespace}", token=cluster)[0] == 200
    assert http(tenants_broker, "POST", "/namespaces", {"name": namespace}, cluster)[0] == 201
    assert http(tenants_broker, "GET", "/streams", token=secret)[0] == 401


def test_a_token_works_on_every_broker_of_the_meta_store_until_deleted(tmp_path):
    """Tokens live in the meta store and reach each broker's copy through the change log:
    made on one broker, they open the other within seconds, and so does their deletion."""
    first = start_broker(tmp_path / "one" / "data")
    meta = f"sqlite:///{first.data_dir / 'meta.db'}"
    second = start_broker(tmp_path / "two" / "data", "--meta", meta)
    try:
        assert http(first, "POST", "/namespaces", {"name": "shared"}, first.token)[0] == 201
        made = make_token(first, "shared", "viewer")
        wait_until(
            lambda: http(second, "GET", "/streams", token=made["token"])[0] == 200,
            10,
            what="the token accepted by the second broker",
        )
        assert http(first, "DELETE", f"/tokens/{made['id']}", token=first.token)[0] == 200
        wait_until(
            lambda: http(second, "GET", "/streams", token=made["token"])[0] == 401,
            10,
            what="the deleted token refused by the second broker",
        )
    finally:
        second.stop()
        first.stop()
