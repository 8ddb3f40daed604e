"""ACL rules in a real SQLite meta store (flowmq_meta.acls): content ids, validation, the
change log, and an Authorizer that reloads only when the rules moved."""

from __future__ import annotations

import pytest

from flowmq_core.acl import Authorizer, InvalidAcl, Rule
from flowmq_core.errors import AlreadyExists, InvalidName, NotFound
from flowmq_meta import acls, open_meta_store
from flowmq_meta.catalog import Catalog
from flowmq_meta.changelog import changes_since, read_version
from flowmq_meta.users import UserDirectory, create_user, set_groups


@pytest.fixture
async def store(tmp_path):
    store = open_meta_store(f"sqlite:///{tmp_path / 'meta.db'}")
    yield store
    await store.close()


def rule(principal="alice", resource="a/#", action="publish", effect="allow", ns="default"):
    return Rule(principal, ns, resource, action, effect)


async def test_create_list_delete_with_change_log(store):
    before = await store.transact(read_version)
    created = await acls.create_rule(store, rule())
    assert set(created) == {"id", "principal", "namespace", "resource", "action", "effect"}
    assert await acls.list_rules(store) == [created]
    with pytest.raises(AlreadyExists) as exc:
        await acls.create_rule(store, rule())
    assert exc.value.details == {"id": created["id"]}
    other = await acls.create_rule(store, rule(effect="deny"))
    assert other["id"] != created["id"]
    assert await acls.delete_rule(store, created["id"]) is True
    assert await acls.delete_rule(store, created["id"]) is False
    assert await acls.list_rules(store) == [other]
    log = await store.transact(lambda tr: changes_since(tr, before))
    assert [e["kind"] for e in log] == ["acl.created", "acl.created", "acl.deleted"]


async def test_invalid_rules_and_unknown_namespaces_are_refused(store):
    with pytest.raises(InvalidAcl):
        await acls.create_rule(store, rule(action="produce"))
    with pytest.raises(InvalidName):
        await acls.create_rule(store, rule(ns="bad ns"))
    with pytest.raises(NotFound):
        await acls.create_rule(store, rule(ns="tenant"))
    await Catalog(store).create_namespace("tenant")
    await acls.create_rule(store, rule(ns="tenant"))
    assert [r["namespace"] for r in await acls.list_rules(store, "tenant")] == ["tenant"]
    assert await acls.list_rules(store, "default") == []


async def test_rule_count_is_bounded(store, monkeypatch):
    monkeypatch.setattr(acls, "MAX_RULES", 2)
    await acls.create_rule(store, rule(resource="a"))
    await acls.create_rule(store, rule(resource="b"))
    with pytest.raises(acls.TooManyRules):
        await acls.create_rule(store, rule(resource="c"))
    with pytest.raises(acls.TooManyRules):
        await acls.create_rules(store, [rule(resource="d")])


async def test_bulk_create_skips_existing(store):
    rules = [rule(resource=f"t/{i}") for i in range(50)]
    assert await acls.create_rules(store, rules, chunk=20) == 50
    assert await acls.create_rules(store, rules[:10] + [rule(resource="x")]) == 1
    version, loaded = await acls.load_rules(store)
    assert len(loaded) == 51 and version == 4  # three chunks, then one more
    ids = [r.id for r in loaded[:30]] + ["0" * 16]
    assert await acls.delete_rules(store, ids, chunk=20) == 30
    version, loaded = await acls.load_rules(store)
    assert len(loaded) == 21 and version == 6


async def test_refresh_reloads_only_when_the_rules_moved(store):
    authorizer = Authorizer(default_allow=False)
    assert await acls.refresh(store, authorizer) is True  # the first load
    generation = authorizer.generation
    assert await acls.refresh(store, authorizer) is False
    assert authorizer.generation == generation
    alice = authorizer.access("default", "alice")
    assert not alice.may_publish("a/b")
    await acls.create_rule(store, rule())
    assert await acls.refresh(store, authorizer) is True
    assert alice.may_publish("a/b")


async def test_group_principals_follow_the_user_record(store):
    await create_user(store, "bob", "pw")
    users = UserDirectory(store)
    await users.refresh()
    authorizer = Authorizer(default_allow=False, groups_of=users.groups_of)
    await acls.create_rule(store, rule(principal="group:ops"))
    await acls.refresh(store, authorizer)
    bob = authorizer.access("default", "bob")
    assert not bob.may_publish("a/x")
    assert await set_groups(store, "bob", ["ops", "ops", "dev"]) == ["ops", "dev"]
    await users.refresh()
    assert authorizer.groups_changed() is True
    assert bob.may_publish("a/x")
    with pytest.raises(NotFound):
        await set_groups(store, "nobody", ["ops"])
    with pytest.raises(InvalidName):
        await set_groups(store, "bob", ["bad\x00group"])
