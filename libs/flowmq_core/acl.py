"""Authorization: one model for every protocol (DESIGN.md §12), pure — no I/O, no protocol.

A rule is ``{principal, namespace, resource, action, effect}`` (``Rule``):

- principal: a user name, ``group:<name>`` (a user's ``groups`` attribute) or ``*`` (anyone,
  anonymous clients included; anonymous clients match ``*`` only);
- namespace: the tenant the rule governs; a client is judged by the rules of the namespace it
  works in;
- resource: a canonical topic filter (MQTT syntax), ``stream:<name>``, ``queue:<name>``,
  ``group:<kafka group>`` (a name ending in ``*`` is a prefix: ``stream:orders.*``; ``*`` alone is
  every name), or ``namespace`` — the namespace itself and everything in it;
- action: ``publish``/``subscribe`` (topics), ``produce``/``consume``/``create``/``delete``/
  ``describe``/``admin`` (streams, queues, groups), or ``all``;
- effect: ``allow`` or ``deny``.

Decisions (``Access``):

- An explicit deny wins over any allow.  Without a matching rule the answer is the
  configured default (``acl_default``).
- A concrete resource (a topic, a stream …) is allowed when an allow rule matches it and no
  deny rule does.  A topic *filter* (MQTT SUBSCRIBE, an AMQP binding) must be wholly allowed:
  some allow rule (or the default) covers every topic it can match, and no deny rule matches
  any of them — a subscriber never receives a message it may not read, without a check per
  delivery.
- ``describe`` is also granted by an allow of any other action on the same resource (as
  Kafka's READ, WRITE, DELETE and ALTER imply DESCRIBE); only a deny of ``describe``/``all``
  refuses it.
- Namespace access (MQTT CONNECT, AMQP Connection.Open) is refused by a deny of ``all`` on
  ``namespace``, and, with the default ``deny``, when no allow rule names the client at all.

Cache and invalidation (NATS's sublist shape: results cached, reset by a generation):

- ``Authorizer`` indexes the rules per (namespace, principal) scope; topic rules also sit in a
  ``RouteTrie`` per scope, so a topic decision walks the topic's levels, not every rule.
- ``Access`` is one (namespace, user)'s view, shared by all its connections while any holds
  it (weakly referenced by the authorizer).  It caches decisions: ``publish`` (topic -> bool,
  the MQTT hot path's single dict lookup) and per (action, kind, name); each dict is bounded
  (cleared when it reaches ``cache_size``).
- ``Authorizer.load`` (any ACL change) and ``groups_changed`` bump ``generation`` and re-resolve
  every live ``Access`` in place, clearing its dicts — never replacing them, so a reference a
  connection holds stays the live cache.  Listeners then run (the MQTT adapter drops
  subscriptions no longer allowed).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from flowmq_core.errors import FlowMQError
from flowmq_core.limits import MAX_NAME_BYTES, utf8_size
from flowmq_core.topics import SHARE_PREFIX, is_wildcard, validate_filter
from flowmq_core.trie import RouteTrie

# --- vocabulary ----------------------------------------------------------------------------
PUBLISH, SUBSCRIBE = "publish", "subscribe"
PRODUCE, CONSUME, CREATE, DELETE, DESCRIBE, ADMIN = (
    "produce",
    "consume",
    "create",
    "delete",
    "describe",
    "admin",
)
ALL = "all"
ACTIONS = (PUBLISH, SUBSCRIBE, PRODUCE, CONSUME, CREATE, DELETE, DESCRIBE, ADMIN, ALL)
ALLOW, DENY = "allow", "deny"
EFFECTS = (ALLOW, DENY)
ANYONE = "*"
GROUP_PRINCIPAL = "group:"

# Resource kinds: a topic filter, a named destination or group, or the namespace itself.
TOPIC, STREAM, QUEUE, GROUP, NAMESPACE = "topic", "stream", "queue", "group", "namespace"
NAMED_KINDS = (STREAM, QUEUE, GROUP)

# Which actions mean something on which kind of resource (a rule naming another is refused).
KIND_ACTIONS: dict[str, frozenset[str]] = {
    TOPIC: frozenset({PUBLISH, SUBSCRIBE, ALL}),
    STREAM: frozenset({PRODUCE, CONSUME, CREATE, DELETE, DESCRIBE, ADMIN, ALL}),
    QUEUE: frozenset({CONSUME, CREATE, DELETE, DESCRIBE, ALL}),
    GROUP: frozenset({CONSUME, DELETE, DESCRIBE, ALL}),
    NAMESPACE: frozenset(ACTIONS),
}
# An allow of any of these on a resource also allows ``describe`` on it (Kafka's implication).
_DESCRIBE_IMPLIED = frozenset({DESCRIBE, ALL, PRODUCE, CONSUME, CREATE, DELETE, ADMIN})

DEFAULT_CACHE_SIZE = 100_000
"""Decisions cached per dict of an ``Access`` before it is cleared."""


class InvalidAcl(FlowMQError, ValueError):
    code = "invalid_acl"


# --- rules ---------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True)
class Rule:
    principal: str
    namespace: str
    resource: str
    action: str
    effect: str
    id: str = ""

    def to_json(self) -> dict[str, str]:
        return {
            "id": self.id or rule_id(self),
            "principal": self.principal,
            "namespace": self.namespace,
            "resource": self.resource,
            "action": self.action,
            "effect": self.effect,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Rule:
        rule = cls(
            data["principal"], data["namespace"], data["resource"], data["action"], data["effect"]
        )
        return dataclasses.replace(rule, id=data.get("id") or rule_id(rule))


def rule_id(rule: Rule) -> str:
    """A rule's id: a hash of its content, so the same rule twice is one rule."""
    text = json.dumps(
        [rule.principal, rule.namespace, rule.resource, rule.action, rule.effect],
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def parse_resource(resource: str) -> tuple[str, str]:
    """(kind, name) of a rule's or a request's resource: ``("topic", filter)``,
    ``("stream", name)`` …, ``("namespace", "")``."""
    if resource == NAMESPACE:
        return NAMESPACE, ""
    kind, sep, name = resource.partition(":")
    if sep and kind in NAMED_KINDS:
        return kind, name
    return TOPIC, resource


def _check_text(text: Any, what: str, max_bytes: int = MAX_NAME_BYTES) -> None:
    if not isinstance(text, str) or not text:
        raise InvalidAcl(f"{what} must be a non-empty string")
    try:
        size = utf8_size(text)
    except UnicodeEncodeError:
        raise InvalidAcl(f"{what} is not valid Unicode text") from None
    if size > max_bytes:
        raise InvalidAcl(f"{what} must be at most {max_bytes} bytes (UTF-8)")
    if any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in text):
        raise InvalidAcl(f"{what} must not contain control characters")


def validate_rule(rule: Rule) -> None:
    """Refuse a rule that could never mean what it says (``InvalidAcl``).  The namespace's
    existence and name syntax are the caller's (the meta store's) to check."""
    _check_text(rule.principal, "principal")
    if rule.principal.startswith(GROUP_PRINCIPAL) and len(rule.principal) == len(GROUP_PRINCIPAL):
        raise InvalidAcl("principal group: needs a group name: group:<name>")
    _check_text(rule.namespace, "namespace")
    if rule.action not in ACTIONS:
        raise InvalidAcl(f"action must be one of {', '.join(ACTIONS)}; got {rule.action!r}")
    if rule.effect not in EFFECTS:
        raise InvalidAcl(f"effect must be allow or deny; got {rule.effect!r}")
    if not isinstance(rule.resource, str) or not rule.resource:
        raise InvalidAcl("resource must be a non-empty string")
    kind, name = parse_resource(rule.resource)
    if kind == TOPIC:
        if rule.resource.startswith(SHARE_PREFIX):
            raise InvalidAcl("resource: a rule names the topic filter, without $share/<group>/")
        try:
            validate_filter(rule.resource)
        except ValueError as exc:
            raise InvalidAcl(f"resource: {exc}") from None
    elif kind in NAMED_KINDS:
        _check_text(name, f"resource {kind}: name")
    if rule.action not in KIND_ACTIONS[kind]:
        shown = "a topic filter" if kind == TOPIC else f"{kind} resources"
        raise InvalidAcl(
            f"action {rule.action} does not apply to {shown} (use one of "
            f"{', '.join(sorted(KIND_ACTIONS[kind]))})"
        )


# --- filters against filters ---------------------------------------------------------------
def _dollar_excluded(a: list[str], b: list[str]) -> bool:
    """A leading wildcard never matches a ``$`` topic (MQTT §4.7.2)."""
    return (a[0] in ("+", "#") and b[0][:1] == "$") or (b[0] in ("+", "#") and a[0][:1] == "$")


def covers(outer: str, inner: str) -> bool:
    """Whether every topic ``inner`` matches is matched by ``outer`` (valid filters)."""
    ol, il = outer.split("/"), inner.split("/")
    if ol[0] in ("+", "#") and il[0][:1] == "$":
        return False
    for i, level in enumerate(ol):
        if level == "#":
            return True
        if i >= len(il):
            return False
        other = il[i]
        if other == "#":
            # ``inner`` matches any rest from here: zero levels too, except at the start
            # ("#" matches every topic, each having at least one level).
            rest = ol[i:]
            return rest == ["#"] or (i == 0 and rest == ["+", "#"])
        if level != "+" and other != level:
            return False
    return len(il) == len(ol)


def intersects(a: str, b: str) -> bool:
    """Whether some topic is matched by both filters (valid filters)."""
    al, bl = a.split("/"), b.split("/")
    if _dollar_excluded(al, bl):
        return False
    for i in range(max(len(al), len(bl))):
        x = al[i] if i < len(al) else None
        y = bl[i] if i < len(bl) else None
        if x == "#" or y == "#":
            return True  # "a/#" also matches "a"
        if x is None or y is None:
            return False
        if x != y and x != "+" and y != "+":
            return False
    return True


def _name_matches(pattern: str, name: str) -> bool:
    if pattern.endswith("*"):
        return name.startswith(pattern[:-1])
    return pattern == name


# --- the index -------------------------------------------------------------------------------
class _Scope:
    """The rules of one (namespace, principal)."""

    __slots__ = ("namespace_rules", "topic_rules", "topic_trie", "named")

    def __init__(self) -> None:
        self.namespace_rules: list[tuple[str, str]] = []  # (action, effect)
        self.topic_rules: list[tuple[str, str, str]] = []  # (filter, action, effect)
        self.topic_trie: RouteTrie[tuple[str, str]] = RouteTrie(cache_size=0)
        self.named: dict[str, list[tuple[str, str, str]]] = {k: [] for k in NAMED_KINDS}

    def add(self, rule: Rule) -> None:
        kind, name = parse_resource(rule.resource)
        pair = (rule.action, rule.effect)
        if kind == NAMESPACE:
            self.namespace_rules.append(pair)
        elif kind == TOPIC:
            self.topic_rules.append((name, *pair))
            self.topic_trie.add(name, pair)
        else:
            self.named[kind].append((name, *pair))

    def has_allow(self) -> bool:
        return (
            any(e == ALLOW for _, e in self.namespace_rules)
            or any(e == ALLOW for _, _, e in self.topic_rules)
            or any(e == ALLOW for found in self.named.values() for _, _, e in found)
        )


_NO_SCOPES: tuple[_Scope, ...] = ()


class Access:
    """What one user (``None``: anonymous) may do in one namespace; see the module doc."""

    __slots__ = (
        "__weakref__",
        "_authorizer",
        "_decisions",
        "_scopes",
        "generation",
        "groups",
        "namespace",
        "publish",
        "user",
    )

    def __init__(self, authorizer: Authorizer, namespace: str, user: str | None) -> None:
        self._authorizer = authorizer
        self.namespace = namespace
        self.user = user
        self.groups: tuple[str, ...] = ()
        self._scopes: tuple[_Scope, ...] = _NO_SCOPES
        # topic -> may publish: adapters read it directly (one dict lookup per message) and
        # call ``may_publish`` on a miss.  Cleared in place, never replaced.
        self.publish: dict[str, bool] = {}
        self._decisions: dict[tuple[str, str, str], bool] = {}
        self.generation = -1
        self.resolve()

    def resolve(self) -> None:
        """Pick up the authorizer's current rules and this user's groups; forget decisions."""
        authorizer = self._authorizer
        self.groups = tuple(authorizer.groups_of(self.user)) if self.user is not None else ()
        principals = [ANYONE]
        if self.user is not None:
            if self.user != ANYONE and not self.user.startswith(GROUP_PRINCIPAL):
                principals.append(self.user)  # such names are principals of another kind
            principals.extend(GROUP_PRINCIPAL + g for g in self.groups)
        index = authorizer._index
        ns = self.namespace
        self._scopes = tuple(s for p in principals if (s := index.get((ns, p))) is not None)
        self.publish.clear()
        self._decisions.clear()
        self.generation = authorizer.generation

    # --- decisions --------------------------------------------------------------------
    def may_publish(self, topic: str) -> bool:
        """``publish`` on a topic, cached in ``publish``."""
        allowed = self.publish.get(topic)
        if allowed is None:
            allowed = self._remember(self.publish, topic, self._decide(PUBLISH, TOPIC, topic))
        return allowed

    def may_subscribe(self, topic_filter: str) -> bool:
        """``subscribe`` on every topic the filter can match."""
        return self.allowed(SUBSCRIBE, TOPIC, topic_filter)

    def allowed(self, action: str, kind: str, name: str = "") -> bool:
        """``action`` on the resource (kind, name), e.g. ``(CONSUME, STREAM, "orders")``,
        ``(DESCRIBE, NAMESPACE)``; cached."""
        key = (action, kind, name)
        allowed = self._decisions.get(key)
        if allowed is None:
            allowed = self._remember(self._decisions, key, self._decide(action, kind, name))
        return allowed

    def may_access(self) -> bool:
        """May the client work in the namespace at all (MQTT CONNECT, AMQP vhost)."""
        key = ("access", NAMESPACE, "")
        allowed = self._decisions.get(key)
        if allowed is None:
            denied = any(
                action == ALL and effect == DENY
                for scope in self._scopes
                for action, effect in scope.namespace_rules
            )
            allowed = not denied and (
                self._authorizer.default_allow or any(s.has_allow() for s in self._scopes)
            )
            self._remember(self._decisions, key, allowed)
        return allowed

    def may_any(self, action: str, kind: str) -> bool:
        """Whether ``action`` is allowed on at least one resource of ``kind`` (Kafka's
        idempotent producer: WRITE on any topic)."""
        key = (action, "any " + kind, "")
        allowed = self._decisions.get(key)
        if allowed is None:
            wanted = frozenset({action, ALL})
            namespace_wide = [(a, e) for s in self._scopes for a, e in s.namespace_rules]
            if any(a in wanted and e == DENY for a, e in namespace_wide):
                allowed = False
            elif self._authorizer.default_allow:
                allowed = True
            else:
                named = [(a, e) for s in self._scopes for _, a, e in s.named.get(kind, ())]
                allowed = any(a in wanted and e == ALLOW for a, e in namespace_wide + named)
            self._remember(self._decisions, key, allowed)
        return allowed

    def _remember(self, cache: dict[Any, bool], key: Any, allowed: bool) -> bool:
        """Cache a decision, emptying the cache first when it holds ``cache_size`` of them."""
        if len(cache) >= self._authorizer.cache_size:
            cache.clear()
        cache[key] = allowed
        return allowed

    def _decide(self, action: str, kind: str, name: str) -> bool:
        deny = frozenset({action, ALL})
        allow = _DESCRIBE_IMPLIED if action == DESCRIBE else deny
        allowed = False
        for scope in self._scopes:
            for a, e in scope.namespace_rules:
                if e == DENY:
                    if a in deny:
                        return False
                elif a in allow:
                    allowed = True
            if kind == TOPIC:
                if not is_wildcard(name):
                    for a, e in scope.topic_trie.match(name):
                        if e == DENY:
                            if a in deny:
                                return False
                        elif a in allow:
                            allowed = True
                    continue
                for rule_filter, a, e in scope.topic_rules:
                    if e == DENY:
                        if a in deny and intersects(rule_filter, name):
                            return False
                    elif not allowed and a in allow and covers(rule_filter, name):
                        allowed = True
            elif kind != NAMESPACE:
                for pattern, a, e in scope.named[kind]:
                    if e == DENY:
                        if a in deny and _name_matches(pattern, name):
                            return False
                    elif not allowed and a in allow and _name_matches(pattern, name):
                        allowed = True
        return allowed or self._authorizer.default_allow

    def __repr__(self) -> str:
        return f"Access({self.namespace!r}, {self.user!r}, generation {self.generation})"


def _no_groups(user: str) -> Sequence[str]:
    return ()


class Authorizer:
    """One per broker process: the rules, indexed, and the live ``Access`` views."""

    def __init__(
        self,
        rules: Iterable[Rule] = (),
        *,
        default_allow: bool = True,
        groups_of: Callable[[str], Sequence[str]] = _no_groups,
        cache_size: int = DEFAULT_CACHE_SIZE,
    ) -> None:
        self.default_allow = default_allow
        self.groups_of = groups_of
        self.cache_size = cache_size
        self.generation = 0
        self.version = -1  # the ACL version loaded from the meta store (-1: none yet)
        self.listeners: list[Callable[[], None]] = []
        self._rules: list[Rule] = []
        self._index: dict[tuple[str, str], _Scope] = {}
        self._live: weakref.WeakValueDictionary[tuple[str, str | None], Access] = (
            weakref.WeakValueDictionary()
        )
        self._build(rules)

    @property
    def rules(self) -> list[Rule]:
        return list(self._rules)

    def access(self, namespace: str, user: str | None) -> Access:
        """The view of ``user`` (None: anonymous) in ``namespace``; keep a reference to it
        while the client is connected (its caches live as long as some holder does)."""
        key = (namespace, user)
        found = self._live.get(key)
        if found is None:
            found = self._live[key] = Access(self, namespace, user)
        return found

    def load(self, rules: Iterable[Rule], version: int | None = None) -> None:
        """Replace every rule (an ACL change): new generation, live views re-resolved."""
        self._build(rules)
        if version is not None:
            self.version = version
        self._changed()

    def set_default(self, default_allow: bool) -> None:
        if default_allow != self.default_allow:
            self.default_allow = default_allow
            self._changed()

    def groups_changed(self) -> bool:
        """Users' groups may have changed: re-resolve the views whose groups did.  Returns
        whether any did."""
        stale = [
            a
            for a in list(self._live.values())
            if a.user is not None and tuple(self.groups_of(a.user)) != a.groups
        ]
        if not stale:
            return False
        self.generation += 1
        for access in stale:
            access.resolve()
        self._notify()
        return True

    def _build(self, rules: Iterable[Rule]) -> None:
        self._rules = list(rules)
        index: dict[tuple[str, str], _Scope] = {}
        for rule in self._rules:
            scope = index.get((rule.namespace, rule.principal))
            if scope is None:
                scope = index[(rule.namespace, rule.principal)] = _Scope()
            scope.add(rule)
        self._index = index

    def _changed(self) -> None:
        self.generation += 1
        for access in list(self._live.values()):
            access.resolve()
        self._notify()

    def _notify(self) -> None:
        for listener in list(self.listeners):
            listener()


__all__ = [
    "ACTIONS",
    "ALL",
    "ALLOW",
    "ANYONE",
    "DENY",
    "EFFECTS",
    "Access",
    "Authorizer",
    "InvalidAcl",
    "Rule",
    "covers",
    "intersects",
    "parse_resource",
    "rule_id",
    "validate_rule",
]
