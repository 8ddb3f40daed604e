"""Users of every protocol (MQTT username/password, AMQP and Kafka SASL PLAIN), kept in the
meta store with scrypt password hashes."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from typing import Any

from flowmq_meta import keys
from flowmq_meta.api import MetaStore, Transaction
from flowmq_meta.changelog import record_change

# scrypt parameters (RFC 7914): ~16 MiB and tens of ms per hash — slow for attackers, and
# brokers cache successful checks so a connection storm does not pay it every time.
_N, _R, _P = 2**14, 8, 1


def hash_password(password: str) -> str:
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=_N, r=_R, p=_P, dklen=32)
    return f"scrypt${_N}${_R}${_P}${base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}"


def verify_password(stored: str, password: str) -> bool:
    try:
        scheme, n, r, p, salt, digest = stored.split("$")
    except ValueError:
        return False
    if scheme != "scrypt":
        return False
    expected = base64.b64decode(digest)
    got = hashlib.scrypt(
        password.encode(),
        salt=base64.b64decode(salt),
        n=int(n),
        r=int(r),
        p=int(p),
        dklen=len(expected),
    )
    return hmac.compare_digest(got, expected)


async def set_user(store: MetaStore, name: str, password: str) -> None:
    if not name:
        raise ValueError("user name must not be empty")
    record = json.dumps({"name": name, "password": hash_password(password)}).encode()

    def txn(tr: Transaction) -> None:
        tr.set(keys.USERS.pack(name), record)
        record_change(tr, "user.updated", {"name": name})

    await store.transact(txn)


async def delete_user(store: MetaStore, name: str) -> bool:
    def txn(tr: Transaction) -> bool:
        key = keys.USERS.pack(name)
        if tr.get(key) is None:
            return False
        tr.clear(key)
        record_change(tr, "user.deleted", {"name": name})
        return True

    return await store.transact(txn)


async def load_users(store: MetaStore) -> dict[str, dict[str, Any]]:
    begin, end = keys.USERS.range()
    rows = await store.transact(lambda tr: tr.get_range(begin, end))
    return {keys.USERS.unpack(key)[0]: json.loads(value) for key, value in rows}


class UserDirectory:
    """An in-memory copy of the users, refreshed when metadata changes, with a cache of
    successful password checks so the scrypt cost is paid once per (user, password)."""

    def __init__(self, store: MetaStore) -> None:
        self.store = store
        self._users: dict[str, dict[str, Any]] = {}
        self._verified: dict[tuple[str, bytes], str] = {}

    async def refresh(self) -> None:
        self._users = await load_users(self.store)

    def known(self, name: str) -> bool:
        return name in self._users

    def check(self, name: str, password: bytes | None) -> bool:
        user = self._users.get(name)
        if user is None or password is None:
            return False
        stored = user["password"]
        key = (name, hashlib.sha256(password).digest())
        if self._verified.get(key) == stored:
            return True
        try:
            text = password.decode()
        except UnicodeDecodeError:
            return False
        if verify_password(stored, text):
            self._verified[key] = stored
            return True
        return False
