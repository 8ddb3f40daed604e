"""``flowmq token create|list|delete`` with the cluster admin token, and the other commands
working as they are with a scoped token (``--token``): its namespace by default, another
namespace refused (exit 1)."""

from __future__ import annotations

import json

from tests.fixtures.cli import flowmq


def test_token_commands_and_a_scoped_token_on_the_cli(tenants_broker, uid):
    target = ["--url", tenants_broker.http]
    cluster = [*target, "--token", tenants_broker.token]

    made = flowmq("token", "create", "-n", "a", "--role", "admin", "--description", uid, *cluster)
    assert made.returncode == 0, made.stderr
    first, secret = made.stdout.strip().splitlines()
    token_id = first.split()[1]
    assert f"token {token_id} created: admin of namespace a" in first

    listed = flowmq("token", "list", *cluster, "-o", "json")
    assert listed.returncode == 0, listed.stderr
    mine = [t for t in json.loads(listed.stdout) if t["id"] == token_id]
    assert mine and mine[0]["namespace"] == "a" and mine[0]["description"] == uid
    assert secret not in listed.stdout

    scoped = [*target, "--token", secret]
    created = flowmq("stream", "create", f"cli-{uid}", *scoped)
    assert created.returncode == 0, created.stderr
    streams = flowmq("stream", "list", *scoped, "-o", "json")
    assert streams.returncode == 0, streams.stderr
    assert {s["namespace"] for s in json.loads(streams.stdout)} == {"a"}
    other = flowmq("stream", "list", "-n", "b", *scoped)
    assert other.returncode == 1 and "may not reach namespace 'b'" in other.stderr, other.stderr
    nodes = flowmq("cluster", "status", *scoped)
    assert nodes.returncode == 1 and "cluster-wide" in nodes.stderr, nodes.stderr
    assert flowmq("token", "list", *scoped).returncode == 1

    deleted = flowmq("token", "delete", token_id, *cluster)
    assert deleted.returncode == 0 and f"token {token_id} deleted" in deleted.stdout
    gone = flowmq("stream", "list", *scoped)
    assert gone.returncode == 1 and "invalid admin token" in gone.stderr, gone.stderr
