"""The admin REST API application (DESIGN.md §9): ``/api/v1`` + Prometheus metrics."""

from __future__ import annotations

import hmac
import logging
from importlib.metadata import PackageNotFoundError, version

from aiohttp import web

import flowmq_metrics
from flowmq_admin import handlers as h
from flowmq_admin import schemas
from flowmq_admin.envelope import ApiError, error_response, from_exception, ok
from flowmq_admin.openapi import build_document
from flowmq_admin.operations import Operation, Param
from flowmq_admin.validation import validate
from flowmq_core.errors import FlowMQError

log = logging.getLogger(__name__)

BACKEND_KEY = web.AppKey("backend", object)
TOKEN_KEY = web.AppKey("token", str)
OPERATIONS_KEY = web.AppKey("operations", list)

API = "/api/v1"
MAX_BODY_BYTES = 16 * 1024 * 1024

_NAMESPACE_QUERY = Param(
    "namespace",
    "query",
    {
        "type": "string",
        "minLength": 1,
        "maxLength": 64,
        "pattern": "^[A-Za-z0-9_-]+$",
        "default": "default",
    },
    description="Namespace of the destination (default: default).",
)
_NAME = Param("name", "path", {"type": "string", "minLength": 1, "maxLength": 255}, required=True)
_TOPIC_PATH = Param(
    "topic",
    "path",
    # 16384 characters percent-encode to at most 192 KiB, within the request-line limit.
    {"type": "string", "minLength": 1, "maxLength": 16384},
    required=True,
    description="Canonical topic (at most 16384 characters here); '/' may be sent as-is "
    "or percent-encoded.",
    multi_level=True,
)
_USERNAME = Param(
    "username",
    "path",
    schemas.USERNAME,
    required=True,
    description="The user name; '/' may be sent as-is or percent-encoded.",
    multi_level=True,
)


_ACL_NAMESPACE_QUERY = Param(
    "namespace",
    "query",
    {"type": "string", "minLength": 1, "maxLength": 64, "pattern": "^[A-Za-z0-9_-]+$"},
    description="Only the rules of this namespace (default: every namespace's).",
)
_ACL_ID = Param("id", "path", schemas.ACL_ID, required=True)


def _flowmq_version() -> str:
    try:
        return version("flowmq")
    except PackageNotFoundError:  # running from a source tree without install
        return "0.0.0"


def _destination_operations(
    plural: str, resource: h.DestinationResource, view: schemas.Schema
) -> list[Operation]:
    tag = plural.capitalize()
    item = f"{API}/{plural}/{{name}}"
    singular = plural[:-1]
    return [
        Operation("GET", f"{API}/{plural}", h.list_handler(resource), f"list{tag}",
                  f"List {plural} of a namespace", tag, {"type": "array", "items": view},
                  params=(_NAMESPACE_QUERY,), errors=(400, 401, 404, 422)),
        Operation("POST", f"{API}/{plural}", h.create_handler(resource), f"create{tag[:-1]}",
                  f"Create a {singular}", tag, view, body=resource.create_schema, status=201,
                  params=(_NAMESPACE_QUERY,), errors=(400, 401, 404, 409, 413, 422)),
        Operation("GET", item, h.get_handler(resource), f"get{tag[:-1]}",
                  f"Get a {singular}", tag, view, params=(_NAME, _NAMESPACE_QUERY),
                  errors=(400, 401, 404, 422)),
        Operation("PUT", item, h.update_handler(resource), f"update{tag[:-1]}",
                  f"Update a {singular}'s settings", tag, view, body=resource.update_schema,
                  params=(_NAME, _NAMESPACE_QUERY), errors=(400, 401, 404, 413, 422)),
        Operation("DELETE", item, h.delete_handler(resource), f"delete{tag[:-1]}",
                  f"Delete a {singular}", tag, {"type": "object"},
                  params=(_NAME, _NAMESPACE_QUERY), errors=(400, 401, 404, 422)),
    ]  # fmt: skip


async def _openapi(request: web.Request, backend: object) -> web.Response:
    document = build_document(request.app[OPERATIONS_KEY], _flowmq_version())
    return web.json_response(document)


def operations() -> list[Operation]:
    deleted = {"type": "object", "properties": {"deleted": {"type": "string"}}}
    return [
        Operation("GET", f"{API}/openapi.json", _openapi, "getOpenApi",
                  "This OpenAPI document", "Meta", auth=False, errors=(),
                  raw_response={"type": "object"}),
        Operation("GET", f"{API}/namespaces", h.list_namespaces, "listNamespaces",
                  "List namespaces", "Namespaces", {"type": "array", "items": schemas.NAMESPACE},
                  errors=(401,)),
        Operation("POST", f"{API}/namespaces", h.create_namespace, "createNamespace",
                  "Create a namespace", "Namespaces", schemas.NAMESPACE,
                  body=schemas.NAMESPACE_CREATE, status=201, errors=(400, 401, 409, 413, 422)),
        Operation("GET", f"{API}/namespaces/{{name}}", h.get_namespace, "getNamespace",
                  "Get a namespace", "Namespaces", schemas.NAMESPACE, params=(_NAME,),
                  errors=(401, 404)),
        Operation("DELETE", f"{API}/namespaces/{{name}}", h.delete_namespace, "deleteNamespace",
                  "Delete an empty namespace", "Namespaces", deleted, params=(_NAME,),
                  errors=(401, 404, 409)),
        *_destination_operations("streams", h.STREAMS, schemas.STREAM),
        *_destination_operations("queues", h.QUEUES, schemas.QUEUE),
        Operation("GET", f"{API}/users", h.list_users, "listUsers",
                  "List users (never their password hashes or credentials)", "Users",
                  {"type": "array", "items": schemas.USER}, errors=(401,)),
        Operation("POST", f"{API}/users", h.create_user, "createUser",
                  "Create a user (MQTT, AMQP PLAIN, Kafka SASL PLAIN and SCRAM)", "Users",
                  schemas.USER, body=schemas.USER_CREATE, status=201,
                  errors=(400, 401, 404, 409, 413, 422)),
        Operation("PUT", f"{API}/users/{{username}}", h.update_user, "updateUser",
                  "Change a user's password", "Users", schemas.USER, body=schemas.USER_UPDATE,
                  params=(_USERNAME,), errors=(400, 401, 404, 413, 422)),
        Operation("DELETE", f"{API}/users/{{username}}", h.delete_user, "deleteUser",
                  "Delete a user", "Users", deleted, params=(_USERNAME,),
                  errors=(400, 401, 404, 422)),
        Operation("GET", f"{API}/acls", h.list_acls, "listAcls",
                  "List ACL rules", "ACLs", {"type": "array", "items": schemas.ACL},
                  params=(_ACL_NAMESPACE_QUERY,), errors=(400, 401, 422)),
        Operation("POST", f"{API}/acls", h.create_acl, "createAcl",
                  "Add an ACL rule (applied by every broker within about a second)", "ACLs",
                  schemas.ACL, body=schemas.ACL_CREATE, status=201,
                  errors=(400, 401, 404, 409, 413, 422)),
        Operation("DELETE", f"{API}/acls/{{id}}", h.delete_acl, "deleteAcl",
                  "Delete an ACL rule", "ACLs", deleted, params=(_ACL_ID,),
                  errors=(400, 401, 404, 422)),
        Operation("GET", f"{API}/subscriptions", h.list_subscriptions, "listSubscriptions",
                  "List Subscriptions (memory push consumers) on this broker", "Subscriptions",
                  {"type": "array", "items": schemas.SUBSCRIPTION},
                  params=(_NAMESPACE_QUERY,), errors=(400, 401, 422)),
        Operation("GET", f"{API}/routes", h.test_route, "testRoute",
                  "The destinations a topic would reach", "Routing", schemas.ROUTE_RESULT,
                  params=(Param("topic", "query", {"type": "string", "minLength": 1}, required=True),
                          _NAMESPACE_QUERY), errors=(400, 401, 404, 422)),
        Operation("GET", f"{API}/cluster/nodes", h.list_nodes, "listNodes",
                  "Broker nodes of the cluster", "Cluster", {"type": "array", "items": schemas.NODE},
                  errors=(401,)),
        Operation("POST", f"{API}/topics/{{topic}}/messages/batch", h.publish_batch,
                  "publishBatch", "Publish several messages to a topic", "Publish",
                  schemas.PUBLISH_BATCH_RESULT, body=schemas.PUBLISH_BATCH,
                  params=(_TOPIC_PATH, _NAMESPACE_QUERY), errors=(400, 401, 404, 413, 422, 503)),
        Operation("POST", f"{API}/topics/{{topic}}/messages", h.publish_message,
                  "publishMessage", "Publish a message to a topic", "Publish",
                  schemas.PUBLISH_RESULT, body=schemas.PUBLISH_MESSAGE,
                  params=(_TOPIC_PATH, _NAMESPACE_QUERY), errors=(400, 401, 404, 413, 422, 503)),
    ]  # fmt: skip


def _check_params(op: Operation, request: web.Request) -> None:
    """Hold path and query parameters to the schemas the OpenAPI document gives them."""
    for param in op.params:
        source = request.match_info if param.location == "path" else request.query
        value = source.get(param.name)
        if value is None:
            if param.required:
                raise ApiError("bad_request", f"query parameter {param.name!r} is required")
            continue
        try:
            validate(param.schema, value)
        except ApiError as exc:
            exc.message = f"{param.location} parameter {param.name}: " + exc.message.removeprefix(
                "body: "
            )
            raise


def _wrap(op: Operation):
    async def handle(request: web.Request) -> web.StreamResponse:
        _check_params(op, request)
        result = await op.handler(request, request.app[BACKEND_KEY])
        if isinstance(result, web.StreamResponse):
            return result
        return ok(result, op.status)

    handle.operation = op  # type: ignore[attr-defined]
    return handle


def _authorized(request: web.Request) -> web.Response | None:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    challenge = {"WWW-Authenticate": 'Bearer realm="flowmq"'}
    if scheme.lower() != "bearer" or not token.strip():
        return error_response(
            "unauthorized", "missing Bearer token: send 'Authorization: Bearer <admin token>'",
            headers=challenge,
        )  # fmt: skip
    if not hmac.compare_digest(token.strip().encode(), request.app[TOKEN_KEY].encode()):
        return error_response("unauthorized", "invalid admin token", headers=challenge)
    return None


@web.middleware
async def _envelope_middleware(request: web.Request, handler) -> web.StreamResponse:
    op: Operation | None = getattr(handler, "operation", None)
    if op is not None and op.auth:
        denied = _authorized(request)
        if denied is not None:
            return denied
    try:
        return await handler(request)
    except ApiError as exc:
        return error_response(exc.code, exc.message, exc.details)
    except FlowMQError as exc:
        return from_exception(exc)
    except web.HTTPRequestEntityTooLarge:
        return error_response("payload_too_large", f"request body exceeds {MAX_BODY_BYTES} bytes")
    except web.HTTPException as exc:
        if exc.status == 404:
            return error_response("not_found", f"no such endpoint: {request.path}")
        if exc.status == 405:
            return error_response(
                "method_not_allowed", f"{request.method} is not allowed on {request.path}",
                status=405, headers={"Allow": exc.headers.get("Allow", "")},
            )  # fmt: skip
        raise
    except Exception:
        log.exception("admin API error on %s %s", request.method, request.path)
        return error_response("internal_error", "internal error; see the broker log", status=500)


async def _metrics(request: web.Request) -> web.Response:
    return web.Response(
        body=flowmq_metrics.exposition(),
        headers={"Content-Type": flowmq_metrics.CONTENT_TYPE},
    )


def create_app(backend: h.AdminBackend, token: str, admin: bool = True) -> web.Application:
    """The HTTP application: metrics always; the admin API when ``admin`` is on."""
    app = web.Application(middlewares=[_envelope_middleware], client_max_size=MAX_BODY_BYTES)
    app[BACKEND_KEY] = backend
    app[TOKEN_KEY] = token
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/v1/prometheus/metrics", _metrics)
    ops = operations() if admin else []
    app[OPERATIONS_KEY] = ops
    for op in ops:
        app.router.add_route(op.method, op.aiohttp_path, _wrap(op))
    return app
