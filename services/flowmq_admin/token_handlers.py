"""``/api/v1/tokens``: the namespace-scoped admin tokens (``flowmq_meta.tokens``), managed
with the cluster admin token only (``auth.py`` refuses scoped tokens: these operations take
no ``?namespace=``).  The secret is in the answer to its creation, never again."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from flowmq_admin.handlers import AdminBackend, changes_metadata, delete_by_key
from flowmq_admin.operations import Operation, path_param
from flowmq_admin.schemas import (
    INTEGER,
    NAMESPACE_NAME,
    STRING,
    Schema,
    described,
    each,
    enum,
    obj,
    text,
)
from flowmq_admin.validation import read_json_body
from flowmq_meta import tokens
from flowmq_meta.tokens import MAX_DESCRIPTION_CHARS, ROLES

API = "/api/v1"

TOKEN_CREATE: Schema = obj(
    {
        "namespace": NAMESPACE_NAME,
        "role": enum(ROLES, "admin: read and change within the namespace; viewer: read only."),
        "description": {"type": "string", "maxLength": MAX_DESCRIPTION_CHARS},
    },
    ["namespace", "role"],
    closed=True,
)

_TOKEN_VIEW: dict[str, Schema] = {
    **each(STRING, "id", "namespace"),
    "role": enum(ROLES),
    "description": STRING,
    "created_at_ms": INTEGER,
}

TOKEN: Schema = obj(
    _TOKEN_VIEW,
    _TOKEN_VIEW,
    closed=True,
    description="A namespace-scoped admin token as the API shows it: never its secret.",
)

TOKEN_CREATED: Schema = obj(
    {
        **_TOKEN_VIEW,
        "token": described(STRING, "The Bearer token itself: shown only in this answer, keep it."),
    },
    [*_TOKEN_VIEW, "token"],
    closed=True,
    description="The new token, with its secret (shown only this once).",
)

_TOKEN_ID = path_param("id", text(64, "^[0-9a-f]+$"), "A token id from GET /tokens.")


async def list_tokens(request: web.Request, backend: AdminBackend) -> Any:
    records = await tokens.load_token_records(backend.tokens.store)
    found = [tokens.ScopedToken.from_record(r) for r in records]
    return [t.view() for t in sorted(found, key=lambda t: (t.namespace, t.created_at_ms, t.id))]


@changes_metadata
async def create_token(request: web.Request, backend: AdminBackend) -> Any:
    body = await read_json_body(request, TOKEN_CREATE)
    token, secret = await tokens.create_token(
        backend.tokens.store, body["namespace"], body["role"], body.get("description", "")
    )
    return {**token.view(), "token": secret}


delete_token = delete_by_key(
    "id",
    lambda backend, token_id: tokens.delete_token(backend.tokens.store, token_id),
    "token {!r} does not exist",
)


def token_operations() -> list[Operation]:
    deleted = {"type": "object", "properties": {"deleted": {"type": "string"}}}
    return [
        Operation("GET", f"{API}/tokens", list_tokens, "listTokens",
                  "List namespace-scoped admin tokens (never their secrets; cluster admin "
                  "token only)", "Tokens", {"type": "array", "items": TOKEN}, errors=(401,)),
        Operation("POST", f"{API}/tokens", create_token, "createToken",
                  "Create a namespace-scoped admin token; the answer holds its secret, shown "
                  "only this once (cluster admin token only)", "Tokens", TOKEN_CREATED,
                  body=TOKEN_CREATE, status=201, errors=(400, 401, 404, 413, 422)),
        Operation("DELETE", f"{API}/tokens/{{id}}", delete_token, "deleteToken",
                  "Delete a namespace-scoped admin token (cluster admin token only)", "Tokens",
                  deleted, params=(_TOKEN_ID,), errors=(400, 401, 404, 422)),
    ]  # fmt: skip


__all__ = ["TOKEN", "TOKEN_CREATE", "TOKEN_CREATED", "token_operations"]
