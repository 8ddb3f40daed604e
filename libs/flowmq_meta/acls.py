"""ACL rules in the meta store (DESIGN.md §12): the storage side of ``flowmq_core.acl``.

Layout: ``ACLS(id)`` -> JSON rule; ``ACL_VERSION`` -> JSON ``{"version", "count"}``.

Invariants:
- Every change commits together with its change-log entry (``record_change``) and a bump of
  ``ACL_VERSION``, so every broker's catalog sync sees it (gossip at once, anti-entropy within
  a second) and reloads the rules — only when ``ACL_VERSION`` moved (``refresh``).
- A rule's id is the hash of its content (``flowmq_core.acl.rule_id``): the same rule cannot
  exist twice, and creating it again is ``AlreadyExists``.
- At most ``MAX_RULES`` rules: every broker holds all of them in memory.
- Nothing else writes ``ACLS``.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from flowmq_core.acl import Authorizer, Rule, rule_id, validate_rule
from flowmq_core.errors import AlreadyExists, FlowMQError, NotFound
from flowmq_meta import keys
from flowmq_meta.api import MetaStore, Transaction
from flowmq_meta.catalog import DEFAULT_NAMESPACE, validate_namespace_name
from flowmq_meta.changelog import record_change

MAX_RULES = 100_000
"""Rules per cluster (each broker indexes all of them; ~1 KiB each at most)."""


class TooManyRules(FlowMQError):
    code = "too_many_rules"


def _read_meta(tr: Transaction) -> dict[str, int]:
    raw = tr.get(keys.ACL_VERSION)
    return json.loads(raw) if raw is not None else {"version": 0, "count": 0}


def _write_meta(tr: Transaction, meta: dict[str, int], delta: int) -> None:
    new = {"version": meta["version"] + 1, "count": meta["count"] + delta}
    tr.set(keys.ACL_VERSION, json.dumps(new).encode())


async def create_rule(store: MetaStore, rule: Rule) -> dict[str, str]:
    """Store ``rule`` (validated; its namespace must exist); returns it with its ``id``.
    ``AlreadyExists`` if the same rule is there, ``NotFound`` for an unknown namespace,
    ``TooManyRules`` past ``MAX_RULES``."""
    validate_namespace_name(rule.namespace)
    validate_rule(rule)
    rule = dataclasses.replace(rule, id=rule_id(rule))
    key = keys.ACLS.pack(rule.id)
    value = json.dumps(rule.to_json()).encode()

    def txn(tr: Transaction) -> dict[str, str]:
        if tr.get(key) is not None:
            raise AlreadyExists(
                f"the same rule exists already (id {rule.id})", details={"id": rule.id}
            )
        if (
            rule.namespace != DEFAULT_NAMESPACE
            and tr.get(keys.NAMESPACES.pack(rule.namespace)) is None
        ):
            raise NotFound(f"namespace {rule.namespace!r} does not exist")
        meta = _read_meta(tr)
        if meta["count"] >= MAX_RULES:
            raise TooManyRules(f"at most {MAX_RULES} ACL rules; delete some first")
        tr.set(key, value)
        _write_meta(tr, meta, +1)
        record_change(tr, "acl.created", {"id": rule.id})
        return rule.to_json()

    return await store.transact(txn)


async def create_rules(store: MetaStore, rules: list[Rule], chunk: int = 2000) -> int:
    """Store many rules (benchmarks, imports): ``chunk`` per transaction, one change-log
    entry each; rules already there are skipped.  Returns how many were new."""
    prepared = []
    for rule in rules:
        validate_namespace_name(rule.namespace)
        validate_rule(rule)
        rule = dataclasses.replace(rule, id=rule_id(rule))
        prepared.append((keys.ACLS.pack(rule.id), json.dumps(rule.to_json()).encode()))
    added = 0
    for start in range(0, len(prepared), chunk):
        part = prepared[start : start + chunk]

        def txn(tr: Transaction, part: list[tuple[bytes, bytes]] = part) -> int:
            new = [(k, v) for k, v in part if tr.get(k) is None]
            meta = _read_meta(tr)
            if meta["count"] + len(new) > MAX_RULES:
                raise TooManyRules(f"at most {MAX_RULES} ACL rules")
            for k, v in new:
                tr.set(k, v)
            if new:
                _write_meta(tr, meta, len(new))
                record_change(tr, "acl.created", {"count": len(new)})
            return len(new)

        added += await store.transact(txn)
    return added


async def delete_rule(store: MetaStore, rule_id: str) -> bool:
    """Remove a rule; False if no rule has that id."""
    key = keys.ACLS.pack(rule_id)

    def txn(tr: Transaction) -> bool:
        if tr.get(key) is None:
            return False
        tr.clear(key)
        _write_meta(tr, _read_meta(tr), -1)
        record_change(tr, "acl.deleted", {"id": rule_id})
        return True

    return await store.transact(txn)


async def delete_rules(store: MetaStore, rule_ids: list[str], chunk: int = 2000) -> int:
    """Remove many rules (benchmarks, imports): ``chunk`` per transaction, one change-log
    entry each; ids of no rule are skipped.  Returns how many were removed."""
    removed = 0
    for start in range(0, len(rule_ids), chunk):
        part = [keys.ACLS.pack(i) for i in rule_ids[start : start + chunk]]

        def txn(tr: Transaction, part: list[bytes] = part) -> int:
            found = [k for k in part if tr.get(k) is not None]
            for k in found:
                tr.clear(k)
            if found:
                _write_meta(tr, _read_meta(tr), -len(found))
                record_change(tr, "acl.deleted", {"count": len(found)})
            return len(found)

        removed += await store.transact(txn)
    return removed


async def load_rules(store: MetaStore) -> tuple[int, list[Rule]]:
    """(ACL version, every rule), read in one transaction."""
    begin, end = keys.ACLS.range()

    def txn(tr: Transaction) -> tuple[int, list[Any]]:
        return _read_meta(tr)["version"], tr.get_range(begin, end)

    version, rows = await store.transact(txn)
    return version, [Rule.from_json(json.loads(value)) for _, value in rows]


async def list_rules(store: MetaStore, namespace: str | None = None) -> list[dict[str, str]]:
    """Every rule as JSON (those of ``namespace`` if given), ordered by namespace,
    principal, resource, action, effect."""
    _, rules = await load_rules(store)
    found = [r for r in rules if namespace is None or r.namespace == namespace]
    found.sort(key=lambda r: (r.namespace, r.principal, r.resource, r.action, r.effect))
    return [r.to_json() for r in found]


async def refresh(store: MetaStore, authorizer: Authorizer) -> bool:
    """Bring ``authorizer`` up to the stored rules if they changed since it last loaded
    (one small read otherwise).  Returns whether it reloaded."""
    raw = await store.transact(lambda tr: tr.get(keys.ACL_VERSION))
    version = json.loads(raw)["version"] if raw is not None else 0
    if version == authorizer.version:
        return False
    version, rules = await load_rules(store)
    authorizer.load(rules, version)
    return True


__all__ = [
    "MAX_RULES",
    "TooManyRules",
    "create_rule",
    "create_rules",
    "delete_rule",
    "delete_rules",
    "list_rules",
    "load_rules",
    "refresh",
]
