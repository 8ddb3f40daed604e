"""ACL rules over the admin API (real HTTP, a broker on the SQLite meta store): the exact
body shape, validation (422, unknown fields refused), 404/409, and that the broker that
served the request decides by the new rules at once."""

from __future__ import annotations

import pytest

ACLS = "/api/v1/acls"
FIELDS = {"principal", "namespace", "resource", "action", "effect"}


def body(**overrides):
    rule = {
        "principal": "alice",
        "namespace": "default",
        "resource": "sensors/#",
        "action": "publish",
        "effect": "allow",
    }
    rule.update(overrides)
    return rule


async def test_post_returns_the_rule_with_an_id_and_get_lists_it(api, broker):
    status, created = await api.call("POST", ACLS, json=body())
    assert status == 201, created
    rule = created["data"]
    assert rule.keys() == FIELDS | {"id"} and len(rule["id"]) == 16
    assert {k: rule[k] for k in FIELDS} == body()
    status, listed = await api.call("GET", ACLS)
    assert status == 200 and listed["data"] == [rule]
    status, filtered = await api.call("GET", ACLS, params={"namespace": "other"})
    assert status == 200 and filtered["data"] == []
    status, deleted = await api.call("DELETE", f"{ACLS}/{rule['id']}")
    assert status == 200 and deleted["data"] == {"deleted": rule["id"]}
    status, listed = await api.call("GET", ACLS)
    assert listed["data"] == []
    status, again = await api.call("DELETE", f"{ACLS}/{rule['id']}")
    assert status == 404 and again["error"]["code"] == "not_found"


async def test_the_same_rule_twice_is_409(api):
    status, first = await api.call("POST", ACLS, json=body())
    assert status == 201
    status, second = await api.call("POST", ACLS, json=body())
    assert status == 409 and second["error"]["code"] == "already_exists"
    assert second["error"]["details"] == {"id": first["data"]["id"]}


@pytest.mark.parametrize(
    ("payload", "words"),
    [
        ({**body(), "extra": 1}, "unknown field 'extra'"),
        ({k: v for k, v in body().items() if k != "effect"}, "missing required field"),
        (body(action="read"), "action"),
        (body(effect="maybe"), "effect"),
        (body(principal=""), "principal"),
        (body(namespace="no spaces"), "namespace"),
        (body(resource="a/#/b"), "resource"),
        (body(resource="stream:orders"), "does not apply"),  # publish on a stream
        (body(resource="topic", action="consume"), "does not apply"),
        (body(principal="group:"), "group name"),
        (body(resource="$share/g/a"), "share"),
    ],
)
async def test_bad_rules_are_422(api, payload, words):
    status, answer = await api.call("POST", ACLS, json=payload)
    assert status == 422, answer
    assert words in answer["error"]["message"], answer


async def test_unknown_namespace_is_404_and_bad_id_422(api):
    status, answer = await api.call("POST", ACLS, json=body(namespace="tenant-x"))
    assert status == 404 and answer["error"]["code"] == "not_found"
    status, answer = await api.call("DELETE", f"{ACLS}/not-an-id")
    assert status == 422, answer


async def test_needs_the_admin_token(api):
    status, _ = await api.call("GET", ACLS, token=None)
    assert status == 401
    status, _ = await api.call("POST", ACLS, token="wrong", json=body())
    assert status == 401


async def test_the_serving_broker_applies_a_change_at_once(api, broker):
    alice = broker.authorizer.access("default", "alice")
    assert alice.may_publish("sensors/1")  # loopback broker: acl_default allow
    status, created = await api.call("POST", ACLS, json=body(effect="deny"))
    assert status == 201
    assert not alice.may_publish("sensors/1")
    assert alice.may_publish("other/1")
    await api.call("DELETE", f"{ACLS}/{created['data']['id']}")
    assert alice.may_publish("sensors/1")
