"""Who may call what on the admin API (docs/security.md "Admin tokens"), and the audit line
of every change (docs/security.md "Audit").

A request's Bearer token is the cluster admin token (``<data_dir>/admin_token``: everything)
or a namespace-scoped token from the meta store (``flowmq_meta.tokens``): ``viewer`` reads
(GET) within its namespace, ``admin`` reads and changes within it.  Neither reaches another
namespace nor anything cluster-wide.

How an operation is scoped, decided from the operation table (so an endpoint added later is
closed to scoped tokens unless it takes ``?namespace=``):
- an operation with a ``namespace`` query parameter addresses that namespace: a scoped token
  may name its own only, and addresses its own when it names none;
- a few operations find the namespace elsewhere (``_RULES``): a namespace by its path, a
  user by its record, a new user by its body; lists of namespaces and users are cut down to
  the token's namespace, and client connections and subscriptions are seen through a
  backend that shows the token's namespace only (``_TenantBackend``);
- every other authenticated operation is cluster-wide: the cluster admin token only.

Refusals are 403 ``forbidden``.  Invariant: a scoped token's request never reaches a handler
with another namespace, nor a backend that shows another namespace's connections.
"""

from __future__ import annotations

import dataclasses
import hmac
import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from flowmq_admin.envelope import ApiError, error_response
from flowmq_admin.handlers import AdminBackend
from flowmq_admin.operations import NAMESPACE_KEY, Operation
from flowmq_core.audit import audit_log
from flowmq_meta import keys
from flowmq_meta.tokens import ADMIN, VIEWER, TokenDirectory

CLUSTER_ADMIN_ID = "admin"
CHANGES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_READS = frozenset({"GET", "HEAD", "OPTIONS"})

# Where the middleware leaves the caller for the handler wrapper and the audit line
# (aiohttp 3.12+ wants a typed key; older versions take a string).
PRINCIPAL_KEY: Any = (
    web.RequestKey("principal", object) if hasattr(web, "RequestKey") else "flowmq_admin.principal"
)


@dataclasses.dataclass(frozen=True)
class Principal:
    """The caller: the cluster admin token, or one scoped token."""

    id: str  # "admin", or the scoped token's id
    namespace: str | None  # None: the cluster admin token (every namespace)
    role: str  # ADMIN or VIEWER

    @property
    def cluster_admin(self) -> bool:
        return self.namespace is None

    def __str__(self) -> str:
        if self.cluster_admin:
            return CLUSTER_ADMIN_ID
        return f"token {self.id} ({self.role} of namespace {self.namespace})"


CLUSTER = Principal(CLUSTER_ADMIN_ID, None, ADMIN)


def _forbidden(principal: Principal, why: str) -> ApiError:
    return ApiError(
        "forbidden",
        f"{principal} may not {why}",
        {"token": principal.id, "namespace": principal.namespace, "role": principal.role},
    )


# --- authentication ---------------------------------------------------------------------
def authenticate(
    request: web.Request, cluster_token: str, tokens: TokenDirectory | None
) -> Principal | web.Response:
    """The caller of ``request``, or the 401 answer."""
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    token = token.strip()
    challenge = {"WWW-Authenticate": 'Bearer realm="flowmq"'}
    if scheme.lower() != "bearer" or not token:
        return error_response(
            "unauthorized", "missing Bearer token: send 'Authorization: Bearer <admin token>'",
            headers=challenge,
        )  # fmt: skip
    if not token.isascii():  # tokens are URL-safe ASCII; anything else cannot match one
        return error_response("unauthorized", "invalid admin token", headers=challenge)
    if hmac.compare_digest(token.encode(), cluster_token.encode()):
        principal = CLUSTER
    else:
        scoped = tokens.lookup(token) if tokens is not None else None
        if scoped is None:
            return error_response("unauthorized", "invalid admin token", headers=challenge)
        principal = Principal(scoped.id, scoped.namespace, scoped.role)
    request[PRINCIPAL_KEY] = principal
    return principal


# --- authorization ----------------------------------------------------------------------
class _TenantBackend:
    """The backend as one namespace's token sees it: its own connections and subscriptions
    only; everything else is the backend's."""

    def __init__(self, backend: AdminBackend, namespace: str) -> None:
        self._backend = backend
        self._namespace = namespace

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def clients(self) -> list[dict[str, Any]]:
        return [c for c in self._backend.clients() if c.get("namespace") == self._namespace]

    def disconnect_client(self, connection_id: str) -> bool:
        if connection_id not in {c["id"] for c in self.clients()}:
            return False
        return self._backend.disconnect_client(connection_id)

    def subscriptions(self) -> list[dict[str, Any]]:
        return [s for s in self._backend.subscriptions() if s.get("namespace") == self._namespace]


Rule = Callable[[Principal, web.Request, AdminBackend], Awaitable[None]]


async def _own_namespace_by_path(principal: Principal, request: web.Request, _: Any) -> None:
    if request.match_info.get("name") != principal.namespace:
        raise _forbidden(principal, "see another namespace")


async def _anyone_scoped(principal: Principal, request: web.Request, _: Any) -> None:
    """Allowed; what is shown is cut down to the namespace (``restrict``, ``_TenantBackend``)."""


async def _new_user_in_own_namespace(principal: Principal, request: web.Request, _: Any) -> None:
    try:
        body = json.loads(await request.read() or b"null")
    except (ValueError, UnicodeDecodeError, RecursionError):
        body = None  # the handler answers for the body
    namespace = body.get("namespace") if isinstance(body, dict) else None
    if namespace is not None and namespace != principal.namespace:
        raise _forbidden(principal, f"create users in namespace {namespace!r}")
    request[NAMESPACE_KEY] = principal.namespace  # the default for a body without one


async def _user_of_own_namespace(
    principal: Principal, request: web.Request, backend: AdminBackend
) -> None:
    """Read from the meta store, not the broker's copy: a user another broker made a moment
    ago must not pass as unknown."""
    name = request.match_info.get("username", "")
    raw = await backend.users.store.transact(lambda tr: tr.get(keys.USERS.pack(name)))
    if raw is None:
        return  # the handler answers 404
    namespace = json.loads(raw).get("namespace", "default")
    if namespace != principal.namespace:
        raise _forbidden(principal, f"change users of namespace {namespace!r}")


_RULES: dict[str, Rule] = {
    "listNamespaces": _anyone_scoped,
    "getNamespace": _own_namespace_by_path,
    "listUsers": _anyone_scoped,
    "createUser": _new_user_in_own_namespace,
    "updateUser": _user_of_own_namespace,
    "deleteUser": _user_of_own_namespace,
    "listClients": _anyone_scoped,
    "disconnectClient": _anyone_scoped,
}

# Lists a scoped token sees only its namespace's rows of: operation id -> the row's field
# naming the namespace.
_ROW_NAMESPACE = {"listNamespaces": "name", "listUsers": "namespace"}


def _takes_namespace(op: Operation) -> bool:
    return any(p.name == "namespace" and p.location == "query" for p in op.params)


async def authorize(op: Operation, request: web.Request, backend: AdminBackend) -> AdminBackend:
    """Raise 403 ``forbidden`` unless the caller may call ``op`` as ``request`` asks; returns
    the backend the handler is to use."""
    principal = request.get(PRINCIPAL_KEY)
    if not op.auth or principal is None or principal.cluster_admin:
        return backend
    if principal.role == VIEWER and request.method not in _READS:
        raise _forbidden(principal, "change anything: a viewer token only reads")
    rule = _RULES.get(op.operation_id)
    if rule is not None:
        await rule(principal, request, backend)
    elif _takes_namespace(op):
        wanted = request.query.get("namespace", principal.namespace)
        if wanted != principal.namespace:
            raise _forbidden(principal, f"reach namespace {wanted!r}")
        request[NAMESPACE_KEY] = principal.namespace
    else:
        raise _forbidden(
            principal, f"call {op.method} {op.path}: it is cluster-wide (cluster admin token)"
        )
    return _TenantBackend(backend, principal.namespace)  # type: ignore[arg-type, return-value]


def restrict(op: Operation, request: web.Request, data: Any) -> Any:
    """A list answer cut down to the caller's namespace."""
    principal = request.get(PRINCIPAL_KEY)
    field = _ROW_NAMESPACE.get(op.operation_id)
    if field is None or principal is None or principal.cluster_admin or not isinstance(data, list):
        return data
    return [row for row in data if row.get(field) == principal.namespace]


# --- audit --------------------------------------------------------------------------------
def audit(request: web.Request, op: Operation | None, status: int) -> None:
    """The audit line of a request: every change (made or refused) and every refused token.
    A published message (HTTP publish) is data, not a change: only its refusals are logged."""
    refused = status in (401, 403)
    if not refused and (request.method not in CHANGES or (op is not None and op.tag == "Publish")):
        return
    principal = request.get(PRINCIPAL_KEY)
    who = str(principal) if principal is not None else "unauthenticated"
    audit_log.info(
        "admin API %s %s -> %d by %s from %s",
        request.method,
        request.path_qs,
        status,
        who,
        request.remote,
        extra={
            "audit": "admin_api",
            "who": principal.id if principal is not None else None,
            "token_namespace": principal.namespace if principal is not None else None,
            "method": request.method,
            "path": request.path_qs,
            "status": status,
            "remote": request.remote,
        },
    )


__all__ = [
    "CLUSTER",
    "CLUSTER_ADMIN_ID",
    "PRINCIPAL_KEY",
    "Principal",
    "audit",
    "authenticate",
    "authorize",
    "restrict",
]
