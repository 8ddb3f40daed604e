"""Users of every protocol (MQTT user name/password, AMQP PLAIN, Kafka SASL PLAIN and SCRAM),
kept in the meta store, and each broker's in-memory ``UserDirectory`` that checks logins.

Record: ``USERS(name)`` -> JSON ``{"name", "namespace", "created_at_ms", "groups", "password":
"scrypt$N$r$p$<salt>$<hash>", "scram": {"SCRAM-SHA-256": {"salt", "iterations",
"stored_key", "server_key"}, "SCRAM-SHA-512": {...}}}`` (base64 values).  Records written
before namespaces and SCRAM lack those keys: they read as namespace ``default`` and get SCRAM
credentials the next time their password is set.

Invariants:
- Every change commits together with its change-log entry (``record_change``), so every
  broker's directory reloads through its catalog sync; nothing else writes ``USERS``.
- No password is stored: scrypt for PLAIN-style checks, RFC 5802 keys for SCRAM.  Admin views
  (``user_view``) carry name, namespace and creation time only.
- Hashing never runs on the event loop in async code: ``create_user``/``set_password``/
  ``set_user`` and ``UserDirectory.authenticate`` run it in a small thread pool.
- An unknown user is refused, never taken as anonymous; failed logins are rate limited per
  client address (``LoginLimiter``) before any hash is computed.
- The cache of successful checks is keyed by HMAC-SHA256 under a random per-directory key of
  (name, password), so it holds neither a password nor an unsalted hash; it is bounded (LRU)
  and each entry names the password hash it was verified against, so an entry stops matching
  the moment its user changes and is dropped at the next refresh.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import functools
import hashlib
import hmac
import json
import os
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from flowmq_core.errors import AlreadyExists, FlowMQError, InvalidName, NotFound
from flowmq_core.limits import MAX_NAME_BYTES
from flowmq_meta import keys
from flowmq_meta.api import MetaStore, Transaction
from flowmq_meta.catalog import DEFAULT_NAMESPACE, validate_namespace_name
from flowmq_meta.changelog import clear_recorded, record_change
from flowmq_meta.login_limiter import LoginLimiter
from flowmq_meta.scram import MECHANISMS, ScramCredential, make_credential

# scrypt parameters (RFC 7914): ~16 MiB and ~50 ms per hash — slow for attackers; brokers
# cache successful checks so a reconnect storm does not pay it every time.
_N, _R, _P = 2**14, 8, 1

MAX_USERNAME_BYTES = MAX_NAME_BYTES
"""User names: 1 to 255 bytes of UTF-8, no control characters."""

MAX_PASSWORD_BYTES = 1024
"""Passwords: 1 to 1024 bytes of UTF-8."""

CACHE_SIZE = 10_000
"""Successful checks remembered per broker (each entry ~200 bytes)."""

HASH_WORKERS = max(1, (os.cpu_count() or 2) // 2)
"""Threads hashing passwords per process: half the cores, so the event loop keeps one."""

T = TypeVar("T")


class InvalidPassword(FlowMQError, ValueError):
    code = "invalid_password"


def _check_text(text: str, what: str, max_bytes: int, error: type[FlowMQError]) -> None:
    """Non-empty, encodable as UTF-8 and at most ``max_bytes`` of it."""
    if not text:
        raise error(f"{what} must not be empty")
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise error(f"{what} is not valid Unicode text") from None
    if size > max_bytes:
        raise error(f"{what} must be at most {max_bytes} bytes (UTF-8)")


def validate_username(name: str) -> None:
    _check_text(name, "user name", MAX_USERNAME_BYTES, InvalidName)
    if any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in name):
        raise InvalidName("user name must not contain control characters")


def validate_password(password: str) -> None:
    _check_text(password, "password", MAX_PASSWORD_BYTES, InvalidPassword)


def _as_bytes(password: str | bytes) -> bytes:
    return password.encode("utf-8", "surrogatepass") if isinstance(password, str) else password


def hash_password(password: str | bytes) -> str:
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(_as_bytes(password), salt=salt, n=_N, r=_R, p=_P, dklen=32)
    return f"scrypt${_N}${_R}${_P}${base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}"


def verify_password(stored: str, password: str | bytes) -> bool:
    """The one password check: scrypt of ``password`` against the stored hash (CPU-bound)."""
    try:
        scheme, n, r, p, salt, digest = stored.split("$")
    except ValueError:
        return False
    if scheme != "scrypt":
        return False
    expected = base64.b64decode(digest)
    got = hashlib.scrypt(
        _as_bytes(password),
        salt=base64.b64decode(salt),
        n=int(n),
        r=int(r),
        p=int(p),
        dklen=len(expected),
    )
    return hmac.compare_digest(got, expected)


def password_secrets(password: str) -> dict[str, Any]:
    """What a record keeps of a password: its scrypt hash and a SCRAM credential per
    mechanism.  CPU-bound: async code calls it through ``off_loop``."""
    return {
        "password": hash_password(password),
        "scram": {mech: make_credential(mech, password).to_json() for mech in MECHANISMS},
    }


_pool: tuple[int, ThreadPoolExecutor] | None = None


def _hash_pool() -> ThreadPoolExecutor:
    """The process's hashing threads (made afresh in a forked child)."""
    global _pool
    if _pool is None or _pool[0] != os.getpid():
        executor = ThreadPoolExecutor(HASH_WORKERS, thread_name_prefix="flowmq-passwords")
        _pool = (os.getpid(), executor)
    return _pool[1]


async def off_loop(fn: Callable[..., T], *args: Any) -> T:
    """Run CPU-bound ``fn(*args)`` in the hashing threads."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_hash_pool(), functools.partial(fn, *args))


# --- records in the meta store ------------------------------------------------------------
def user_view(record: dict[str, Any]) -> dict[str, Any]:
    """What the admin API shows of a user: never a hash or a credential."""
    return {
        "username": record["name"],
        "namespace": record.get("namespace", DEFAULT_NAMESPACE),
        "created_at_ms": record.get("created_at_ms"),
    }


def _check_namespace(tr: Transaction, namespace: str) -> None:
    # ``default`` always exists once a broker has started; `flowmq user` may run before.
    if namespace != DEFAULT_NAMESPACE and tr.get(keys.NAMESPACES.pack(namespace)) is None:
        raise NotFound(f"namespace {namespace!r} does not exist")


_CREATE, _UPDATE, _UPSERT = "create", "update", "upsert"


async def _write_user(
    store: MetaStore, name: str, password: str, namespace: str | None, mode: str
) -> dict[str, Any]:
    validate_username(name)
    validate_password(password)
    if namespace is not None:
        validate_namespace_name(namespace)
    hashed = await off_loop(password_secrets, password)  # before the transaction: it retries
    key = keys.USERS.pack(name)

    def txn(tr: Transaction) -> dict[str, Any]:
        raw = tr.get(key)
        current = json.loads(raw) if raw is not None else None
        if current is not None and mode == _CREATE:
            raise AlreadyExists(f"user {name!r} already exists")
        if current is None and mode == _UPDATE:
            raise NotFound(f"user {name!r} does not exist")
        record = dict(current or {"name": name, "created_at_ms": int(time.time() * 1000)})
        if namespace is not None:
            _check_namespace(tr, namespace)
            record["namespace"] = namespace
        record.setdefault("namespace", DEFAULT_NAMESPACE)
        record.update(hashed)
        tr.set(key, json.dumps(record).encode())
        kind = "user.created" if current is None else "user.updated"
        record_change(tr, kind, {"name": name})
        return record

    return user_view(await store.transact(txn))


async def create_user(
    store: MetaStore, name: str, password: str, namespace: str = DEFAULT_NAMESPACE
) -> dict[str, Any]:
    """Create a user; ``AlreadyExists`` if the name is taken, ``NotFound`` if the namespace
    is.  Returns ``user_view``."""
    return await _write_user(store, name, password, namespace, _CREATE)


async def set_password(store: MetaStore, name: str, password: str) -> dict[str, Any]:
    """Change an existing user's password (``NotFound`` if none).  Returns ``user_view``."""
    return await _write_user(store, name, password, None, _UPDATE)


async def set_user(
    store: MetaStore, name: str, password: str, namespace: str | None = None
) -> dict[str, Any]:
    """Create a user or set its password (``flowmq user add``); ``namespace`` None keeps an
    existing user's namespace (``default`` for a new one)."""
    return await _write_user(store, name, password, namespace, _UPSERT)


MAX_GROUPS = 64
"""Groups per user (ACL principals ``group:<name>``)."""


async def set_groups(store: MetaStore, name: str, groups: list[str]) -> list[str]:
    """Set the user's ``groups`` (ACL principals ``group:<name>``); ``NotFound`` if no such
    user.  Returns the groups stored (deduplicated, in order)."""
    unique = list(dict.fromkeys(groups))
    if len(unique) > MAX_GROUPS:
        raise InvalidName(f"a user belongs to at most {MAX_GROUPS} groups")
    for group in unique:
        validate_username(group)  # the same rules as a user name
    key = keys.USERS.pack(name)

    def txn(tr: Transaction) -> list[str]:
        raw = tr.get(key)
        if raw is None:
            raise NotFound(f"user {name!r} does not exist")
        record = json.loads(raw)
        record["groups"] = unique
        tr.set(key, json.dumps(record).encode())
        record_change(tr, "user.updated", {"name": name})
        return unique

    return await store.transact(txn)


async def delete_user(store: MetaStore, name: str) -> bool:
    key = keys.USERS.pack(name)
    return await store.transact(lambda tr: clear_recorded(tr, key, "user.deleted", {"name": name}))


async def load_users(store: MetaStore) -> dict[str, dict[str, Any]]:
    begin, end = keys.USERS.range()
    rows = await store.transact(lambda tr: tr.get_range(begin, end))
    return {keys.USERS.unpack(key)[0]: json.loads(value) for key, value in rows}


# --- checking logins ----------------------------------------------------------------------
OK = "ok"
UNKNOWN_USER = "unknown_user"
BAD_PASSWORD = "bad_password"
RATE_LIMITED = "rate_limited"


@dataclasses.dataclass(frozen=True)
class AuthResult:
    """The outcome of ``UserDirectory.authenticate``; true when the login is accepted."""

    ok: bool
    reason: str  # OK, UNKNOWN_USER, BAD_PASSWORD or RATE_LIMITED
    namespace: str | None = None  # the user's namespace, when ok
    retry_after: float = 0.0  # seconds, when RATE_LIMITED

    def __bool__(self) -> bool:
        return self.ok


@dataclasses.dataclass(frozen=True)
class _Attempt:
    name: str
    password: bytes
    stored: str | None  # the user's password hash; None: unknown user
    digest: bytes  # cache key


@functools.cache
def _decoy_hash() -> str:
    """A hash no password matches, checked for unknown users so they cost the same time."""
    return hash_password(secrets.token_bytes(32))


def _verify_or_decoy(stored: str | None, password: bytes) -> bool:
    if stored is None:
        verify_password(_decoy_hash(), password)
        return False
    return verify_password(stored, password)


class UserDirectory:
    """This broker's copy of the users, reloaded when metadata changes (``refresh``).

    Adapters check a login with ``await authenticate(name, password, address)`` (PLAIN-style)
    or drive ``scram.ScramServer`` with ``scram_credential`` behind ``limiter``.
    """

    def __init__(
        self,
        store: MetaStore,
        *,
        limiter: LoginLimiter | None = None,
        cache_size: int = CACHE_SIZE,
    ) -> None:
        self.store = store
        self.limiter = limiter if limiter is not None else LoginLimiter()
        self.cache_size = cache_size
        self.password_checks = 0  # scrypt runs started, decoys included
        self._users: dict[str, dict[str, Any]] = {}
        self._cache_key = secrets.token_bytes(32)
        # digest -> (name, password hash it was verified against), least recent first
        self._verified: OrderedDict[bytes, tuple[str, str]] = OrderedDict()
        self._inflight: dict[tuple[bytes, str | None], asyncio.Future[bool]] = {}

    async def refresh(self) -> None:
        users = await load_users(self.store)
        self._users = users
        stale = [
            digest
            for digest, (name, stored) in self._verified.items()
            if users.get(name, {}).get("password") != stored
        ]
        for digest in stale:
            del self._verified[digest]

    # --- lookups ----------------------------------------------------------------------
    def namespace_of(self, name: str) -> str | None:
        """The user's namespace; ``None`` when no user has that name."""
        user = self._users.get(name)
        return None if user is None else user.get("namespace", DEFAULT_NAMESPACE)

    def groups_of(self, name: str) -> tuple[str, ...]:
        """The user's groups (ACL principals ``group:<name>``); none for an unknown user."""
        user = self._users.get(name)
        return () if user is None else tuple(user.get("groups", ()))

    def scram_credential(self, name: str, mechanism: str) -> ScramCredential | None:
        """The stored SCRAM credential (``None``: unknown user, or a record from before SCRAM;
        give ``None`` to ``ScramServer.server_first`` either way)."""
        user = self._users.get(name)
        stored = None if user is None else user.get("scram", {}).get(mechanism)
        return None if stored is None else ScramCredential.from_json(stored)

    # --- checks -------------------------------------------------------------------------
    async def authenticate(
        self, name: str, password: str | bytes | None, address: str
    ) -> AuthResult:
        """Check a login from client ``address`` (its IP address, no port) off the event
        loop.  Refuses, without hashing, while the address is rate limited, and a login
        without a password (``None``)."""
        wait = self.limiter.retry_after(address)
        if wait > 0:
            return AuthResult(False, RATE_LIMITED, retry_after=wait)
        if password is None:
            self.limiter.record_failure(address)
            known = name in self._users
            return AuthResult(False, BAD_PASSWORD if known else UNKNOWN_USER)
        attempt = self._begin(name, password)
        if attempt is not None:
            ok = await self._verify_off_loop(attempt.digest, attempt.stored, attempt.password)
            if attempt.stored is None:
                self.limiter.record_failure(address)
                return AuthResult(False, UNKNOWN_USER)
            if not self._finish(attempt, ok):
                self.limiter.record_failure(address)
                return AuthResult(False, BAD_PASSWORD)
        namespace = self.namespace_of(name)
        if namespace is None:  # deleted while being checked
            self.limiter.record_failure(address)
            return AuthResult(False, UNKNOWN_USER)
        return AuthResult(True, OK, namespace=namespace)

    # The steps of ``authenticate``: look up and consult the cache (``_begin``), then, after
    # ``verify_password`` ran in the hashing threads, settle (``_finish``).
    def _begin(self, name: str, password: str | bytes) -> _Attempt | None:
        """``None`` when the cache already vouches for (name, password)."""
        raw = _as_bytes(password)
        encoded = name.encode("utf-8", "surrogatepass")
        digest = hmac.digest(
            self._cache_key, len(encoded).to_bytes(4, "big") + encoded + raw, "sha256"
        )
        user = self._users.get(name)
        stored = None if user is None else user["password"]
        if stored is not None and self._verified.get(digest) == (name, stored):
            self._verified.move_to_end(digest)
            return None
        return _Attempt(name, raw, stored, digest)

    def _finish(self, attempt: _Attempt, ok: bool) -> bool:
        user = self._users.get(attempt.name)
        if not ok or user is None or user["password"] != attempt.stored:
            return False  # wrong, or the user changed while the check ran
        self._verified[attempt.digest] = (attempt.name, attempt.stored)
        self._verified.move_to_end(attempt.digest)
        while len(self._verified) > self.cache_size:
            self._verified.popitem(last=False)
        return True

    async def _verify_off_loop(self, digest: bytes, stored: str | None, password: bytes) -> bool:
        """``verify_password`` in the hashing threads (against a decoy for an unknown user,
        ``stored`` None); concurrent checks of the same (name, password, hash) share one run."""
        key = (digest, stored)
        future = self._inflight.get(key)
        if future is None:
            self.password_checks += 1
            loop = asyncio.get_running_loop()
            future = loop.run_in_executor(_hash_pool(), _verify_or_decoy, stored, password)
            self._inflight[key] = future

            def forget(done: asyncio.Future[bool]) -> None:
                if self._inflight.get(key) is done:
                    del self._inflight[key]

            future.add_done_callback(forget)
        return await asyncio.shield(future)
