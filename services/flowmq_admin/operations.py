"""The admin API's operation table: one entry per endpoint, read both by the router and by
the OpenAPI generator, so the document always describes exactly what is served."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from flowmq_admin.schemas import Schema

Handler = Callable[[web.Request, Any], Awaitable[Any]]

# Where the router leaves a request's checked parameters, integers parsed, for its handler
# (aiohttp 3.12+ wants a typed key; older versions take a string).
PARAMS_KEY: Any = (
    web.RequestKey("params", dict) if hasattr(web, "RequestKey") else "flowmq_admin.params"
)

# The namespace a request addresses when it names none (``?namespace=``): a scoped token's
# own (set by ``auth.authorize``); absent, ``default``.
NAMESPACE_KEY: Any = (
    web.RequestKey("namespace", str) if hasattr(web, "RequestKey") else "flowmq_admin.namespace"
)


@dataclasses.dataclass(frozen=True)
class Param:
    name: str
    location: str  # "path" or "query"
    schema: Schema
    required: bool = False
    description: str = ""
    multi_level: bool = False  # a topic: may hold '/', so it matches the rest of the path


def path_param(
    name: str, schema: Schema, description: str = "", *, multi_level: bool = False
) -> Param:
    """A path parameter (always required).  A multi-level one may hold '/' and its description
    says how it may be sent."""
    if multi_level:
        description += "; '/' may be sent as-is or percent-encoded."
    return Param(name, "path", schema, True, description, multi_level)


@dataclasses.dataclass(frozen=True)
class Operation:
    method: str
    path: str  # OpenAPI form, e.g. /api/v1/streams/{name}
    handler: Handler
    operation_id: str
    summary: str
    tag: str
    response: Schema | None = None  # schema of ``data`` in the success envelope
    body: Schema | None = None
    status: int = 200
    params: tuple[Param, ...] = ()
    errors: tuple[int, ...] = (400, 401, 422)
    auth: bool = True
    raw_response: Schema | None = None  # non-envelope responses (OpenAPI doc itself)

    @property
    def aiohttp_path(self) -> str:
        path = self.path
        for param in self.params:
            if param.location == "path" and param.multi_level:
                path = path.replace("{" + param.name + "}", "{" + param.name + ":.+}")
        return path
