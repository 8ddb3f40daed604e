"""``flowmq acl add|list|delete``: rules made over the admin API, seen in the list, refused
with a clear line when they cannot apply, and gone after delete."""

from __future__ import annotations

import json

from tests.fixtures.cli import flowmq


def test_acl_commands_round_trip(tenants_broker, uid):
    cluster = ["--url", tenants_broker.http, "--token", tenants_broker.token]
    resource = f"cli/{uid}/#"

    added = flowmq("acl", "add", "alice", resource, "publish", "--effect", "deny", "-n", "a",
                   *cluster, "-o", "json")  # fmt: skip
    assert added.returncode == 0, added.stderr
    rule = json.loads(added.stdout)
    assert (rule["principal"], rule["resource"], rule["action"], rule["effect"]) == (
        "alice",
        resource,
        "publish",
        "deny",
    )
    assert rule["namespace"] == "a" and rule["id"]

    listed = flowmq("acl", "list", "-n", "a", *cluster, "-o", "json")
    assert listed.returncode == 0, listed.stderr
    assert [r["id"] for r in json.loads(listed.stdout) if r["resource"] == resource] == [rule["id"]]

    again = flowmq("acl", "add", "alice", resource, "publish", "--effect", "deny", "-n", "a",
                   *cluster)  # fmt: skip
    assert again.returncode == 1 and len(again.stderr.strip().splitlines()) == 1, again.stderr

    bad = flowmq("acl", "add", "alice", "a/#/b", "publish", "-n", "a", *cluster)
    assert bad.returncode == 1 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr

    deleted = flowmq("acl", "delete", rule["id"], *cluster)
    assert deleted.returncode == 0 and f"rule {rule['id']} deleted" in deleted.stdout
    listed = flowmq("acl", "list", "-n", "a", *cluster, "-o", "json")
    assert all(r["id"] != rule["id"] for r in json.loads(listed.stdout))
