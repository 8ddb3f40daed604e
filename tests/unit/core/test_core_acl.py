"""The authorization model (flowmq_core.acl): filter algebra checked against the reference
matcher, decisions, and the decision cache's invalidation."""

from __future__ import annotations

import gc
import itertools

import pytest

from flowmq_core.acl import (
    ALLOW,
    DENY,
    Access,
    Authorizer,
    InvalidAcl,
    Rule,
    covers,
    intersects,
    parse_resource,
    rule_id,
    validate_rule,
)
from flowmq_core.topics import matches, validate_filter

# --- filter algebra -------------------------------------------------------------------------
_FILTER_LEVELS = ("a", "b", "$x", "+", "#")
_TOPIC_LEVELS = ("a", "b", "$x", "c")  # "c" stands for any level no filter names


def _filters(max_levels: int = 3) -> list[str]:
    out = []
    for n in range(1, max_levels + 1):
        for levels in itertools.product(_FILTER_LEVELS, repeat=n):
            f = "/".join(levels)
            try:
                validate_filter(f)
            except ValueError:
                continue
            out.append(f)
    return out


def _topics(max_levels: int = 4) -> list[str]:
    return [
        "/".join(levels)
        for n in range(1, max_levels + 1)
        for levels in itertools.product(_TOPIC_LEVELS, repeat=n)
    ]


FILTERS = _filters()
TOPICS = _topics()
MATCHED = {f: frozenset(t for t in TOPICS if matches(f, t)) for f in FILTERS}


def test_covers_agrees_with_the_reference_matcher():
    wrong = [
        (outer, inner)
        for outer in FILTERS
        for inner in FILTERS
        if covers(outer, inner) != (MATCHED[inner] <= MATCHED[outer])
    ]
    assert not wrong, wrong[:10]


def test_intersects_agrees_with_the_reference_matcher():
    wrong = [
        (a, b)
        for a in FILTERS
        for b in FILTERS
        if intersects(a, b) != bool(MATCHED[a] & MATCHED[b])
    ]
    assert not wrong, wrong[:10]


# --- rules ----------------------------------------------------------------------------------
def rule(principal: str, resource: str, action: str, effect: str = ALLOW, ns: str = "default"):
    return Rule(principal, ns, resource, action, effect)


def test_parse_resource():
    assert parse_resource("namespace") == ("namespace", "")
    assert parse_resource("stream:orders") == ("stream", "orders")
    assert parse_resource("queue:jobs.*") == ("queue", "jobs.*")
    assert parse_resource("group:g1") == ("group", "g1")
    assert parse_resource("sensors/+/temp") == ("topic", "sensors/+/temp")
    assert parse_resource("other:x") == ("topic", "other:x")


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        (rule("", "a/b", "publish"), "principal"),
        (rule("group:", "a/b", "publish"), "group name"),
        (rule("alice", "a/#/b", "publish"), "resource"),
        (rule("alice", "$share/g/a", "subscribe"), "share"),
        (rule("alice", "a/b", "produce"), "does not apply"),
        (rule("alice", "stream:s", "publish"), "does not apply"),
        (rule("alice", "group:g", "produce"), "does not apply"),
        (rule("alice", "stream:", "produce"), "name"),
        (rule("alice", "a/b", "read"), "action"),
        (rule("alice", "a/b", "publish", "maybe"), "effect"),
        (rule("al\x01ice", "a/b", "publish"), "control"),
    ],
)
def test_invalid_rules_are_refused(bad, why):
    with pytest.raises(InvalidAcl, match=why):
        validate_rule(bad)


def test_valid_rules_and_content_ids():
    for good in (
        rule("*", "#", "all"),
        rule("group:ops", "namespace", "admin"),
        rule("bob", "stream:orders.*", "produce", DENY),
        rule("bob", "queue:*", "consume"),
        rule("bob", "group:g", "consume"),
    ):
        validate_rule(good)
    a, b = rule("bob", "x/y", "publish"), rule("bob", "x/y", "publish")
    assert rule_id(a) == rule_id(b) != rule_id(rule("bob", "x/y", "publish", DENY))
    assert Rule.from_json(a.to_json()) == Rule.from_json(b.to_json())


# --- decisions -------------------------------------------------------------------------------
def access(rules, user="alice", default_allow=False, ns="default", groups=None):
    authorizer = Authorizer(
        rules, default_allow=default_allow, groups_of=lambda u: (groups or {}).get(u, ())
    )
    return authorizer, authorizer.access(ns, user)


def test_default_decides_without_rules():
    _, allow_all = access([], default_allow=True)
    assert allow_all.may_publish("a/b") and allow_all.may_subscribe("#")
    assert allow_all.may_access()
    _, deny_all = access([], default_allow=False)
    assert not deny_all.may_publish("a/b") and not deny_all.may_subscribe("a/b")
    assert not deny_all.may_access()


def test_explicit_deny_beats_allow():
    _, a = access(
        [rule("alice", "t/#", "all"), rule("alice", "t/secret", "publish", DENY)],
    )
    assert a.may_publish("t/open")
    assert not a.may_publish("t/secret")
    assert a.may_subscribe("t/secret")  # only publish was denied
    _, b = access(
        [rule("*", "t/#", "publish"), rule("alice", "namespace", "all", DENY)], default_allow=True
    )
    assert not b.may_publish("t/x") and not b.may_access()


def test_a_subscription_must_be_wholly_allowed():
    _, a = access([rule("alice", "sensors/#", "subscribe"), rule("alice", "sensors/secret/#",
                                                               "subscribe", DENY)])  # fmt: skip
    assert a.may_subscribe("sensors/+/temp") is False  # sensors/secret/temp is denied
    assert a.may_subscribe("sensors/open/+")
    assert a.may_subscribe("sensors/open/#")
    assert not a.may_subscribe("#")  # not covered by any allow
    assert not a.may_subscribe("sensors/secret/x")
    _, b = access([rule("alice", "a/b/#", "subscribe", DENY)], default_allow=True)
    assert not b.may_subscribe("#") and not b.may_subscribe("a/+/c")
    assert b.may_subscribe("a/c/#") and b.may_subscribe("$SYS/#")


def test_principals_user_group_anyone_and_anonymous():
    rules = [
        rule("alice", "a", "publish"),
        rule("group:ops", "o", "publish"),
        rule("*", "any", "publish"),
    ]
    authorizer = Authorizer(
        rules, default_allow=False, groups_of=lambda u: {"bob": ["ops"]}.get(u, ())
    )
    alice, bob, anon = (authorizer.access("default", u) for u in ("alice", "bob", None))
    assert alice.may_publish("a") and not alice.may_publish("o") and alice.may_publish("any")
    assert bob.may_publish("o") and not bob.may_publish("a") and bob.may_publish("any")
    assert anon.may_publish("any") and not anon.may_publish("a") and not anon.may_publish("o")
    # A user named like a group principal is not the group.
    assert not authorizer.access("default", "group:ops").may_publish("o")


def test_rules_are_per_namespace():
    authorizer = Authorizer([rule("alice", "#", "all", ns="tenant-a")], default_allow=False)
    assert authorizer.access("tenant-a", "alice").may_publish("x")
    assert not authorizer.access("default", "alice").may_publish("x")


def test_named_resources_prefixes_and_describe_implication():
    _, a = access(
        [
            rule("alice", "stream:orders.*", "produce"),
            rule("alice", "stream:orders.secret", "produce", DENY),
            rule("alice", "group:g1", "consume"),
            rule("alice", "stream:audit", "describe", DENY),
            rule("alice", "stream:audit", "consume"),
        ]
    )
    assert a.allowed("produce", "stream", "orders.eu")
    assert not a.allowed("produce", "stream", "orders.secret")
    assert not a.allowed("produce", "stream", "billing")
    assert not a.allowed("consume", "stream", "orders.eu")
    assert a.allowed("describe", "stream", "orders.eu")  # implied by produce
    assert not a.allowed("describe", "stream", "audit")  # explicitly denied
    assert a.allowed("consume", "group", "g1") and a.allowed("describe", "group", "g1")
    assert not a.allowed("delete", "group", "g1")
    assert a.may_any("produce", "stream") and not a.may_any("create", "stream")


def test_namespace_rules_apply_to_every_resource():
    _, admin = access([rule("alice", "namespace", "all")])
    assert admin.may_publish("x/y") and admin.may_subscribe("#")
    assert admin.allowed("delete", "stream", "s") and admin.allowed("create", "queue", "q")
    assert admin.allowed("describe", "namespace")
    _, creator = access([rule("alice", "namespace", "create")])
    assert creator.allowed("create", "stream", "s") and not creator.allowed("delete", "stream", "s")
    assert creator.may_access()


# --- cache --------------------------------------------------------------------------------------
def test_load_bumps_the_generation_and_clears_decisions_in_place():
    authorizer, a = access([rule("alice", "t/#", "publish")])
    cache = a.publish
    assert a.may_publish("t/1") and cache == {"t/1": True}
    seen: list[int] = []
    authorizer.listeners.append(lambda: seen.append(authorizer.generation))
    generation = authorizer.generation
    authorizer.load([rule("alice", "t/#", "publish", DENY)], version=7)
    assert a.publish is cache and cache == {}  # the same dict a connection holds, emptied
    assert not a.may_publish("t/1")
    assert authorizer.generation == generation + 1 and seen == [generation + 1]
    assert authorizer.version == 7
    assert authorizer.access("default", "alice") is a


def test_cache_is_bounded():
    authorizer = Authorizer([], default_allow=True, cache_size=10)
    a = authorizer.access("default", "alice")
    for i in range(25):
        a.may_publish(f"t/{i}")
        a.allowed("produce", "stream", f"s{i}")
    assert len(a.publish) <= 10 and len(a._decisions) <= 10


def test_views_are_shared_while_held_and_dropped_after():
    authorizer = Authorizer([], default_allow=True)
    a = authorizer.access("default", "alice")
    assert authorizer.access("default", "alice") is a
    assert isinstance(a, Access)
    del a
    gc.collect()
    assert len(authorizer._live) == 0


def test_groups_changed_re_resolves_only_when_they_did():
    groups = {"bob": ["ops"]}
    authorizer = Authorizer(
        [rule("group:ops", "o", "publish")],
        default_allow=False,
        groups_of=lambda u: groups.get(u, ()),
    )
    bob = authorizer.access("default", "bob")
    assert bob.may_publish("o")
    assert authorizer.groups_changed() is False
    groups["bob"] = []
    assert authorizer.groups_changed() is True
    assert not bob.may_publish("o")


def test_set_default():
    authorizer, a = access([], default_allow=True)
    assert a.may_publish("x")
    authorizer.set_default(False)
    assert not a.may_publish("x")
