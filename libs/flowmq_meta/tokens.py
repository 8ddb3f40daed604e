"""Namespace-scoped admin tokens (docs/security.md "Admin tokens"), kept in the meta store,
and each broker's in-memory ``TokenDirectory`` that the admin API checks Bearer tokens
against.

Record: ``ADMIN_TOKENS(id)`` -> JSON ``{"id", "namespace", "role", "description",
"created_at_ms", "sha256"}``.  ``role`` is ``admin`` (read and change within the namespace)
or ``viewer`` (read only).  The cluster admin token (``<data_dir>/admin_token``) is not
one of these: it lives in the broker's configuration and may do everything.

Invariants:
- The secret is 32 random bytes (URL-safe base64) shown once, in the answer to its
  creation; only its SHA-256 is stored.  A secret of that entropy needs no salt or slow
  hash: nobody can guess one whose hash leaked.
- Every change commits together with its change-log entry (``record_change``), so every
  broker's directory reloads through its catalog sync, as users do; nothing else writes
  ``ADMIN_TOKENS``.  A deleted token stops working on the broker that deleted it at once,
  on the others within a second (gossip, else anti-entropy).
- A token names an existing namespace when it is made; deleting the namespace deletes its
  tokens (``delete_namespace_tokens``), so a namespace made again under the same name does
  not inherit them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import secrets
import time
from typing import Any

from flowmq_core.errors import NotFound
from flowmq_meta import keys
from flowmq_meta.api import MetaStore, Transaction
from flowmq_meta.catalog import DEFAULT_NAMESPACE, validate_namespace_name
from flowmq_meta.changelog import clear_recorded, record_change

ADMIN = "admin"
VIEWER = "viewer"
ROLES = (ADMIN, VIEWER)

MAX_DESCRIPTION_CHARS = 256


@dataclasses.dataclass(frozen=True)
class ScopedToken:
    """What a broker knows of a token: never its secret."""

    id: str
    namespace: str
    role: str
    description: str = ""
    created_at_ms: int = 0

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> ScopedToken:
        return cls(
            record["id"],
            record["namespace"],
            record["role"],
            record.get("description") or "",
            record.get("created_at_ms", 0),
        )

    def view(self) -> dict[str, Any]:
        """What the admin API shows of a token: every field (a token never holds its secret)."""
        return dataclasses.asdict(self)


def new_secret() -> str:
    """32 random bytes, URL-safe base64, never beginning with ``-``: one that did (1 in 64)
    was taken for an option after the CLI's ``--token``."""
    while True:
        secret = secrets.token_urlsafe(32)
        if not secret.startswith("-"):
            return secret


def secret_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


def _namespace_exists(tr: Transaction, namespace: str) -> bool:
    return namespace == DEFAULT_NAMESPACE or tr.get(keys.NAMESPACES.pack(namespace)) is not None


async def create_token(
    store: MetaStore, namespace: str, role: str, description: str = ""
) -> tuple[ScopedToken, str]:
    """A new token for ``namespace`` with ``role``: (the token, its secret).  ``NotFound`` if
    the namespace does not exist; ``ValueError`` for a role that is none."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}; got {role!r}")
    validate_namespace_name(namespace)
    secret = new_secret()
    token = ScopedToken(secrets.token_hex(8), namespace, role, description, int(time.time() * 1000))
    record = {**token.view(), "sha256": secret_hash(secret)}

    def txn(tr: Transaction) -> None:
        if not _namespace_exists(tr, namespace):
            raise NotFound(f"namespace {namespace!r} does not exist")
        tr.set(keys.ADMIN_TOKENS.pack(token.id), json.dumps(record).encode())
        record_change(tr, "token.created", {"id": token.id, "namespace": namespace})

    await store.transact(txn)
    return token, secret


async def delete_token(store: MetaStore, token_id: str) -> bool:
    """Remove a token; False if there is none with that id."""

    key = keys.ADMIN_TOKENS.pack(token_id)
    return await store.transact(
        lambda tr: clear_recorded(tr, key, "token.deleted", {"id": token_id})
    )


async def delete_namespace_tokens(store: MetaStore, namespace: str) -> list[str]:
    """Remove every token of ``namespace`` (after the namespace was deleted); their ids."""
    begin, end = keys.ADMIN_TOKENS.range()

    def txn(tr: Transaction) -> list[str]:
        gone = []
        for key, value in tr.get_range(begin, end):
            if json.loads(value).get("namespace") == namespace:
                tr.clear(key)
                gone.append(keys.ADMIN_TOKENS.unpack(key)[0])
        if gone:
            record_change(tr, "token.deleted", {"ids": gone, "namespace": namespace})
        return gone

    return await store.transact(txn)


async def load_token_records(store: MetaStore) -> list[dict[str, Any]]:
    begin, end = keys.ADMIN_TOKENS.range()
    rows = await store.transact(lambda tr: tr.get_range(begin, end))
    return [json.loads(value) for _, value in rows]


class TokenDirectory:
    """This broker's copy of the scoped tokens, by the hash of their secret, reloaded when
    metadata changes (``refresh``); ``lookup`` is one hash and one dict read."""

    def __init__(self, store: MetaStore) -> None:
        self.store = store
        self._by_hash: dict[str, ScopedToken] = {}

    async def refresh(self) -> None:
        records = await load_token_records(self.store)
        self._by_hash = {r["sha256"]: ScopedToken.from_record(r) for r in records}

    def lookup(self, secret: str) -> ScopedToken | None:
        """The token whose secret is ``secret``, if any."""
        return self._by_hash.get(secret_hash(secret))


__all__ = [
    "ADMIN",
    "ROLES",
    "VIEWER",
    "ScopedToken",
    "TokenDirectory",
    "create_token",
    "delete_namespace_tokens",
    "delete_token",
    "load_token_records",
    "secret_hash",
]
