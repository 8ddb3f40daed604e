"""The admin REST API application (DESIGN.md §9): ``/api/v1`` + Prometheus metrics."""

from __future__ import annotations

import logging
import re

from aiohttp import web

import flowmq_metrics
from flowmq_admin import handlers as h
from flowmq_admin import live_handlers as lh
from flowmq_admin import live_schemas as ls
from flowmq_admin import schemas
from flowmq_admin.auth import audit, authenticate, authorize, restrict
from flowmq_admin.bad_requests import log_bad_requests_briefly
from flowmq_admin.console import add_routes as add_console_routes
from flowmq_admin.envelope import ApiError, error_response, from_exception, ok
from flowmq_admin.openapi import build_document
from flowmq_admin.operations import PARAMS_KEY, Operation, Param, path_param
from flowmq_admin.token_handlers import token_operations
from flowmq_admin.validation import validate
from flowmq_core.errors import FlowMQError
from flowmq_core.version import flowmq_version

log = logging.getLogger(__name__)

BACKEND_KEY = web.AppKey("backend", object)
TOKEN_KEY = web.AppKey("token", str)
OPERATIONS_KEY = web.AppKey("operations", list)

API = "/api/v1"
MAX_BODY_BYTES = 16 * 1024 * 1024

_NAMESPACE_QUERY = Param(
    "namespace",
    "query",
    {**schemas.NAMESPACE_NAME, "default": "default"},
    description="Namespace of the destination (default: default).",
)
_NAME = path_param("name", schemas.text(255))
# 16384 characters percent-encode to at most 192 KiB, within the request-line limit.
_TOPIC_PATH = path_param(
    "topic",
    schemas.text(16384),
    "Canonical topic (at most 16384 characters here)",
    multi_level=True,
)
_GROUP = path_param("group", schemas.text(255, "^[^/]+$"), "Consumer group id (Kafka group.id)")
# Client ids are at most MAX_CLIENT_ID_BYTES; 1024 characters leave room for addresses.
_CLIENT_ID = path_param(
    "id",
    schemas.text(1024),
    "A connection id from GET /clients (protocol:address), or an MQTT client identifier",
    multi_level=True,
)


def _int_query(name: str, minimum: int, maximum: int, default: int | None, text: str) -> Param:
    keywords = {} if default is None else {"default": default}
    return Param(name, "query", schemas.int_range(minimum, maximum, **keywords), description=text)


_USERNAME = path_param("username", schemas.USERNAME, "The user name", multi_level=True)
_ACL_NAMESPACE_QUERY = Param(
    "namespace",
    "query",
    schemas.NAMESPACE_NAME,
    description="Only the rules of this namespace (default: every namespace's).",
)
_ACL_ID = path_param("id", schemas.ACL_ID)


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
    document = build_document(request.app[OPERATIONS_KEY], flowmq_version())
    return web.json_response(document)


def _live_operations() -> list[Operation]:
    """Health, readiness, reads, purge, consumer groups and clients (live_handlers.py)."""
    stream_messages = (
        _NAME,
        _int_query("partition", 0, 1023, 0, "Partition to read (default 0)."),
        _int_query("offset", 0, 2**62, None, "First offset (default: the log start)."),
        _int_query("limit", 1, 1000, 100, "Most records to return (default 100)."),
        _int_query("wait_ms", 0, 30000, 0,
                   "Wait up to this long for a record when there is none yet (default 0)."),
        _NAMESPACE_QUERY,
    )  # fmt: skip
    queue = (_NAME, _NAMESPACE_QUERY)
    return [
        Operation("GET", f"{API}/health", lh.health, "getHealth",
                  "Liveness: the broker answers (no token needed)", "Operations", ls.HEALTH,
                  auth=False, errors=()),
        Operation("GET", f"{API}/ready", lh.ready, "getReady",
                  "Readiness: meta store, object store and cluster plane usable (no token "
                  "needed); 503 names the failed check", "Operations", ls.READY,
                  auth=False, errors=(503,)),
        Operation("GET", f"{API}/streams/{{name}}/messages", lh.read_stream, "readStream",
                  "Read records of one stream partition (nothing is committed)", "Streams",
                  ls.STREAM_MESSAGES, params=stream_messages, errors=(400, 401, 404, 422)),
        Operation("GET", f"{API}/queues/{{name}}/messages", lh.peek_queue, "peekQueue",
                  "Look at the oldest ready messages, leaving them in the queue", "Queues",
                  ls.QUEUE_MESSAGES,
                  params=(*queue, _int_query("limit", 1, 100, 10, "Most messages (default 10).")),
                  errors=(400, 401, 404, 422)),
        Operation("POST", f"{API}/queues/{{name}}/messages/take", lh.take_from_queue,
                  "takeFromQueue", "Take messages off the queue for good (get with ack)",
                  "Queues", ls.QUEUE_MESSAGES, body=ls.QUEUE_TAKE, params=queue,
                  errors=(400, 401, 404, 413, 422)),
        Operation("POST", f"{API}/queues/{{name}}/purge", lh.purge_queue, "purgeQueue",
                  "Drop every ready message of a queue", "Queues", ls.QUEUE_PURGED,
                  params=queue, errors=(400, 401, 404, 422)),
        Operation("GET", f"{API}/groups", lh.list_groups, "listGroups",
                  "Consumer groups of a namespace", "Groups",
                  {"type": "array", "items": ls.GROUP_SUMMARY}, params=(_NAMESPACE_QUERY,),
                  errors=(400, 401, 404, 422)),
        Operation("GET", f"{API}/groups/{{group}}", lh.get_group, "getGroup",
                  "A consumer group: members (if this broker coordinates it), committed "
                  "offsets and lag", "Groups", ls.GROUP, params=(_GROUP, _NAMESPACE_QUERY),
                  errors=(400, 401, 404, 422)),
        Operation("POST", f"{API}/groups/{{group}}/reset-offsets", lh.reset_group_offsets,
                  "resetGroupOffsets",
                  "Set a group's committed offsets on a stream; refused while it has members",
                  "Groups", ls.GROUP_RESET_RESULT, body=ls.GROUP_RESET,
                  params=(_GROUP, _NAMESPACE_QUERY), errors=(400, 401, 404, 409, 413, 422)),
        Operation("GET", f"{API}/clients", lh.list_clients, "listClients",
                  "Client connections on this broker (MQTT, AMQP, Kafka)", "Clients",
                  {"type": "array", "items": ls.CLIENT},
                  params=(Param("protocol", "query", schemas.enum(["mqtt", "amqp", "kafka"]),
                                description="Only this protocol's connections."),),
                  errors=(400, 401, 422)),
        Operation("DELETE", f"{API}/clients/{{id}}", lh.disconnect_client, "disconnectClient",
                  "Disconnect a client (MQTT v5: DISCONNECT 0x98 administrative action)",
                  "Clients", ls.CLIENTS_DISCONNECTED, params=(_CLIENT_ID,),
                  errors=(400, 401, 404, 422)),
    ]  # fmt: skip


def operations() -> list[Operation]:
    deleted = {"type": "object", "properties": {"deleted": {"type": "string"}}}
    return [
        Operation("GET", f"{API}/openapi.json", _openapi, "getOpenApi",
                  "This OpenAPI document", "Meta", auth=False, errors=(),
                  raw_response={"type": "object"}),
        *_live_operations(),
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
        *token_operations(),
        Operation("POST", f"{API}/topics/{{topic}}/messages/batch", h.publish_batch,
                  "publishBatch", "Publish several messages to a topic", "Publish",
                  schemas.PUBLISH_BATCH_RESULT, body=schemas.PUBLISH_BATCH,
                  params=(_TOPIC_PATH, _NAMESPACE_QUERY), errors=(400, 401, 404, 413, 422, 503)),
        Operation("POST", f"{API}/topics/{{topic}}/messages", h.publish_message,
                  "publishMessage", "Publish a message to a topic", "Publish",
                  schemas.PUBLISH_RESULT, body=schemas.PUBLISH_MESSAGE,
                  params=(_TOPIC_PATH, _NAMESPACE_QUERY), errors=(400, 401, 404, 413, 422, 503)),
    ]  # fmt: skip


_INTEGER = re.compile(r"-?[0-9]{1,20}")


def _check_params(op: Operation, request: web.Request) -> None:
    """Hold path and query parameters to the schemas the OpenAPI document gives them; the
    values, integers parsed, are left in ``request[PARAMS_KEY]`` for the handler."""
    parsed: dict[str, object] = {}
    for param in op.params:
        source = request.match_info if param.location == "path" else request.query
        raw = source.get(param.name)
        if raw is None:
            if param.required:
                raise ApiError("bad_request", f"query parameter {param.name!r} is required")
            continue
        where = f"{param.location} parameter {param.name}: "
        value: object = raw
        if param.schema.get("type") == "integer":
            if not _INTEGER.fullmatch(raw):
                raise ApiError("validation_failed", f"{where}{raw[:40]!r} is not an integer")
            value = int(raw)
        try:
            validate(param.schema, value)
        except ApiError as exc:
            exc.message = where + exc.message.removeprefix("body: ")
            raise
        parsed[param.name] = value
    request[PARAMS_KEY] = parsed


def _wrap(op: Operation):
    async def handle(request: web.Request) -> web.StreamResponse:
        _check_params(op, request)
        backend = await authorize(op, request, request.app[BACKEND_KEY])
        result = await op.handler(request, backend)
        if isinstance(result, web.StreamResponse):
            return result
        return ok(restrict(op, request, result), op.status)

    handle.operation = op  # type: ignore[attr-defined]
    return handle


@web.middleware
async def _envelope_middleware(request: web.Request, handler) -> web.StreamResponse:
    """Authentication (``auth.py``), the JSON envelope of errors, and the audit line."""
    op: Operation | None = getattr(handler, "operation", None)
    try:
        response = await _answer(request, handler, op)
    except web.HTTPException as exc:
        audit(request, op, exc.status)
        raise
    audit(request, op, response.status)
    return response


async def _answer(request: web.Request, handler, op: Operation | None) -> web.StreamResponse:
    if op is not None and op.auth:
        tokens = getattr(request.app[BACKEND_KEY], "tokens", None)
        caller = authenticate(request, request.app[TOKEN_KEY], tokens)
        if isinstance(caller, web.Response):
            return caller
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
    """The HTTP application: metrics always; the admin API and the web console at ``/``
    (flowmq_admin.console) when ``admin`` is on."""
    log_bad_requests_briefly()
    app = web.Application(middlewares=[_envelope_middleware], client_max_size=MAX_BODY_BYTES)
    app[BACKEND_KEY] = backend
    app[TOKEN_KEY] = token
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/v1/prometheus/metrics", _metrics)
    ops = operations() if admin else []
    app[OPERATIONS_KEY] = ops
    for op in ops:
        app.router.add_route(op.method, op.aiohttp_path, _wrap(op))
    if admin:
        add_console_routes(app)
    return app
