"""Handlers of the admin API.  Each takes the request and the broker backend and returns the
``data`` of the success envelope; errors are raised (``ApiError`` or ``FlowMQError``)."""

from __future__ import annotations

import base64
import binascii
import dataclasses
import functools
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from aiohttp import web

import flowmq_metrics
from flowmq_admin import schemas
from flowmq_admin.envelope import ApiError
from flowmq_admin.operations import NAMESPACE_KEY
from flowmq_admin.validation import read_json_body
from flowmq_core.acl import Rule
from flowmq_core.errors import InvalidTopic
from flowmq_core.mapping import amqp_queue_filter, kafka_to_canonical
from flowmq_core.message import Message
from flowmq_core.topics import validate_topic
from flowmq_meta import acls, tokens, users
from flowmq_meta.catalog import (
    DEFAULT_NAMESPACE,
    QUEUE,
    QUEUE_DEFAULT_OPTIONS,
    STREAM,
    STREAM_DEFAULT_OPTIONS,
    Catalog,
    Destination,
    validate_namespace_name,
)
from flowmq_meta.tokens import TokenDirectory
from flowmq_meta.users import UserDirectory


@dataclasses.dataclass(frozen=True)
class StreamRead:
    """An operator's read of one stream partition (``GET /streams/{name}/messages``)."""

    namespace: str
    name: str
    partition: int
    offset: int | None  # None: from the log start
    limit: int  # records at the most
    wait_ms: int  # how long to wait for a first record when there is none yet


class AdminBackend(Protocol):
    """What the admin API needs from the broker process that hosts it."""

    catalog: Catalog
    users: UserDirectory
    tokens: TokenDirectory  # namespace-scoped admin tokens (auth.py)

    def route(self, namespace: str, topic: str) -> list[Destination]: ...

    async def publish(self, namespace: str, message: Message) -> list[Destination]: ...

    async def publish_batch(
        self, namespace: str, messages: list[Message]
    ) -> list[list[Destination]]: ...

    def subscriptions(self) -> list[dict[str, Any]]: ...

    def subscriber_nodes(self, namespace: str, topic: str) -> list[str]: ...

    async def nodes(self) -> list[dict[str, Any]]: ...

    async def metadata_changed(self) -> None:
        """Called after a catalog change so this broker routes by it at once."""

    # --- operations (live_handlers.py) ----------------------------------------------------
    node_id: str

    async def readiness_checks(self) -> dict[str, dict[str, Any]]:
        """``{"meta"|"objects"|"cluster": {"ok", "ms", "error", …}}``."""

    async def stream_counts(self, dest: Destination) -> dict[str, Any]: ...

    async def queue_counts(self, dest: Destination) -> dict[str, Any]: ...

    async def read_stream(self, read: StreamRead) -> dict[str, Any]:
        """``{"records": [kas3 Record], "next_offset", "high_watermark", "log_start_offset"}``."""

    async def peek_queue(self, namespace: str, name: str, limit: int) -> list[dict[str, Any]]:
        """``[{"seq", "redelivered", "message": Message}]``, left in the queue."""

    async def take_from_queue(self, namespace: str, name: str, limit: int) -> list[dict[str, Any]]:
        """As ``peek_queue``, but taken off the queue for good."""

    async def purge_queue(self, namespace: str, name: str) -> int: ...

    async def groups(self, namespace: str) -> list[dict[str, Any]]: ...

    async def group(self, namespace: str, group: str) -> dict[str, Any]: ...

    async def reset_group_offsets(
        self, namespace: str, group: str, stream: str, to: str | int, partition: int | None
    ) -> dict[str, Any]: ...

    def clients(self) -> list[dict[str, Any]]: ...

    def disconnect_client(self, connection_id: str) -> bool: ...


def namespace_of(request: web.Request) -> str:
    namespace = request.query.get("namespace", request.get(NAMESPACE_KEY, DEFAULT_NAMESPACE))
    validate_namespace_name(namespace)
    return namespace


def namespace_filter(request: web.Request) -> str | None:
    """The namespace a list is cut down to: the one ``?namespace=`` names, else none (all)."""
    return namespace_of(request) if "namespace" in request.query else None


BackendHandler = Callable[[web.Request, AdminBackend], Awaitable[Any]]


def changes_metadata(handler: BackendHandler) -> BackendHandler:
    """For a handler that changes the meta store (through its change log): once the change is
    made, this broker routes and authorizes by it at once (``metadata_changed``); the other
    brokers follow by gossip or anti-entropy."""

    @functools.wraps(handler)
    async def changed(request: web.Request, backend: AdminBackend) -> Any:
        result = await handler(request, backend)
        await backend.metadata_changed()
        return result

    return changed


def delete_by_key(
    key: str, delete: Callable[[AdminBackend, str], Awaitable[bool]], missing: str
) -> BackendHandler:
    """DELETE of the record the path's ``key`` names; ``delete`` is false when there was none
    (404, ``missing`` formatted with the key's repr)."""

    @changes_metadata
    async def handler(request: web.Request, backend: AdminBackend) -> Any:
        value = request.match_info[key]
        if not await delete(backend, value):
            raise ApiError("not_found", missing.format(value))
        return {"deleted": value}

    return handler


# --- namespaces ----------------------------------------------------------------------------
async def list_namespaces(request: web.Request, backend: AdminBackend) -> Any:
    return await backend.catalog.list_namespaces()


@changes_metadata
async def create_namespace(request: web.Request, backend: AdminBackend) -> Any:
    body = await read_json_body(request, schemas.NAMESPACE_CREATE)
    return await backend.catalog.create_namespace(body["name"])


async def get_namespace(request: web.Request, backend: AdminBackend) -> Any:
    return await backend.catalog.get_namespace(request.match_info["name"])


@changes_metadata
async def delete_namespace(request: web.Request, backend: AdminBackend) -> Any:
    name = request.match_info["name"]
    await backend.catalog.delete_namespace(name)
    await tokens.delete_namespace_tokens(backend.tokens.store, name)  # not for a namesake
    return {"deleted": name}


# --- streams and queues: one resource shape, two destination types ------------------------
@dataclasses.dataclass(frozen=True)
class DestinationResource:
    type: str
    create_schema: schemas.Schema
    update_schema: schemas.Schema
    build: Callable[[str, str, dict[str, Any], Destination | None], Destination]
    view: Callable[[Destination], dict[str, Any]]
    # Live counts added to GET answers (from the meta store; see the schemas).
    counts: Callable[[AdminBackend, Destination], Awaitable[dict[str, Any]]]


def _options(
    defaults: Mapping[str, Any], body: dict[str, Any], current: Destination | None
) -> dict[str, Any]:
    """The current options (or a new destination's defaults) with the settings given in
    ``body`` applied; the defaults' keys are the settings a body may change."""
    options = dict(current.options if current else defaults)
    options.update((key, body[key]) for key in defaults if key in body)
    return options


def _view(dest: Destination, filters: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": dest.name,
        "namespace": dest.namespace,
        **filters,
        **dest.options,
        "created_at_ms": dest.created_at_ms,
        "version": dest.version,
    }


def _build_stream(
    namespace: str, name: str, body: dict[str, Any], current: Destination | None
) -> Destination:
    options = _options(STREAM_DEFAULT_OPTIONS, body, current)
    if current and options["partitions"] < current.options["partitions"]:
        raise ApiError(
            "invalid_partitions",
            f"partitions can only grow: stream {name!r} has {current.options['partitions']}, "
            f"asked for {options['partitions']}",
        )
    filters = body.get("topic_filters") or (
        current.topic_filters if current else [kafka_to_canonical(name)]
    )
    return Destination(STREAM, namespace, name, list(filters), options)


def _view_stream(dest: Destination) -> dict[str, Any]:
    return _view(dest, {"topic_filters": dest.topic_filters})


def _build_queue(
    namespace: str, name: str, body: dict[str, Any], current: Destination | None
) -> Destination:
    options = _options(QUEUE_DEFAULT_OPTIONS, body, current)
    if options["dead_letter_topic"] is not None:
        validate_topic(options["dead_letter_topic"])
    if "topic_filter" in body:
        filters = [body["topic_filter"]]
    elif current:
        filters = current.topic_filters
    else:
        filters = [amqp_queue_filter(name)]
    return Destination(QUEUE, namespace, name, filters, options)


def _view_queue(dest: Destination) -> dict[str, Any]:
    return _view(dest, {"topic_filter": dest.topic_filters[0]})


STREAMS = DestinationResource(
    STREAM,
    schemas.STREAM_CREATE,
    schemas.STREAM_UPDATE,
    _build_stream,
    _view_stream,
    lambda backend, dest: backend.stream_counts(dest),
)
QUEUES = DestinationResource(
    QUEUE,
    schemas.QUEUE_CREATE,
    schemas.QUEUE_UPDATE,
    _build_queue,
    _view_queue,
    lambda backend, dest: backend.queue_counts(dest),
)


async def _live_view(
    resource: DestinationResource, backend: AdminBackend, dest: Destination
) -> dict[str, Any]:
    return {**resource.view(dest), **await resource.counts(backend, dest)}


def list_handler(resource: DestinationResource):
    async def handler(request: web.Request, backend: AdminBackend) -> Any:
        namespace = namespace_of(request)
        await backend.catalog.get_namespace(namespace)
        found = await backend.catalog.list_destinations(namespace, resource.type)
        return [await _live_view(resource, backend, dest) for dest in found]

    return handler


def create_handler(resource: DestinationResource):
    @changes_metadata
    async def handler(request: web.Request, backend: AdminBackend) -> Any:
        body = await read_json_body(request, resource.create_schema)
        dest = resource.build(namespace_of(request), body["name"], body, None)
        return resource.view(await backend.catalog.create_destination(dest))

    return handler


def get_handler(resource: DestinationResource):
    async def handler(request: web.Request, backend: AdminBackend) -> Any:
        dest = await backend.catalog.get_destination(
            namespace_of(request), request.match_info["name"], resource.type
        )
        return await _live_view(resource, backend, dest)

    return handler


def update_handler(resource: DestinationResource):
    @changes_metadata
    async def handler(request: web.Request, backend: AdminBackend) -> Any:
        body = await read_json_body(request, resource.update_schema)

        def change(current: Destination) -> Destination:
            return resource.build(current.namespace, current.name, body, current)

        updated = await backend.catalog.update_destination(
            namespace_of(request), request.match_info["name"], resource.type, change
        )
        return resource.view(updated)

    return handler


def delete_handler(resource: DestinationResource):
    @changes_metadata
    async def handler(request: web.Request, backend: AdminBackend) -> Any:
        name = request.match_info["name"]
        await backend.catalog.delete_destination(namespace_of(request), name, resource.type)
        return {"deleted": name}

    return handler


# --- users -------------------------------------------------------------------------------------
# Changes go through the meta store's change log (``changes_metadata``: this broker's directory
# reloads at once).
async def list_users(request: web.Request, backend: AdminBackend) -> Any:
    found = await users.load_users(backend.users.store)
    return [users.user_view(found[name]) for name in sorted(found)]


@changes_metadata
async def create_user(request: web.Request, backend: AdminBackend) -> Any:
    body = await read_json_body(request, schemas.USER_CREATE)
    return await users.create_user(
        backend.users.store,
        body["username"],
        body["password"],
        body.get("namespace", request.get(NAMESPACE_KEY, DEFAULT_NAMESPACE)),
    )


@changes_metadata
async def update_user(request: web.Request, backend: AdminBackend) -> Any:
    body = await read_json_body(request, schemas.USER_UPDATE)
    return await users.set_password(
        backend.users.store, request.match_info["username"], body["password"]
    )


delete_user = delete_by_key(
    "username",
    lambda backend, name: users.delete_user(backend.users.store, name),
    "user {!r} does not exist",
)


# --- ACLs ----------------------------------------------------------------------------------------
# Like users: committed with a change-log entry; ``changes_metadata`` applies the change here
# at once (the rules reload).
async def list_acls(request: web.Request, backend: AdminBackend) -> Any:
    return await acls.list_rules(backend.catalog.store, namespace_filter(request))


@changes_metadata
async def create_acl(request: web.Request, backend: AdminBackend) -> Any:
    body = await read_json_body(request, schemas.ACL_CREATE)
    rule = Rule(
        body["principal"], body["namespace"], body["resource"], body["action"], body["effect"]
    )
    return await acls.create_rule(backend.catalog.store, rule)


delete_acl = delete_by_key(
    "id",
    lambda backend, rule_id: acls.delete_rule(backend.catalog.store, rule_id),
    "no ACL rule has id {!r}",
)


# --- subscriptions, routes, cluster ----------------------------------------------------------
async def list_subscriptions(request: web.Request, backend: AdminBackend) -> Any:
    namespace = namespace_filter(request)
    return [s for s in backend.subscriptions() if namespace is None or s["namespace"] == namespace]


def _destination_refs(found: list[Destination]) -> list[dict[str, Any]]:
    return [
        {"type": d.type, "name": d.name, "topic_filters": d.topic_filters}
        for d in sorted(found, key=lambda d: (d.type, d.name))
    ]


def _required_query(request: web.Request, name: str) -> str:
    value = request.query.get(name)
    if value is None:
        raise ApiError("bad_request", f"query parameter {name!r} is required")
    return value


async def test_route(request: web.Request, backend: AdminBackend) -> Any:
    topic = _required_query(request, "topic")
    validate_topic(topic)
    namespace = namespace_of(request)
    await backend.catalog.get_namespace(namespace)
    return {
        "namespace": namespace,
        "topic": topic,
        "destinations": _destination_refs(backend.route(namespace, topic)),
        "subscriber_nodes": backend.subscriber_nodes(namespace, topic),
    }


async def list_nodes(request: web.Request, backend: AdminBackend) -> Any:
    return await backend.nodes()


# --- HTTP publish -------------------------------------------------------------------------------
def _message_from(topic: str, body: dict[str, Any]) -> Message:
    if body.get("encoding", "utf8") == "base64":
        try:
            payload = base64.b64decode(body["payload"], validate=True)
        except (binascii.Error, ValueError):
            raise ApiError("validation_failed", "payload: not valid base64") from None
    else:
        payload = body["payload"].encode("utf-8", "surrogatepass")
    key = body.get("key")
    return Message(
        topic=topic,
        payload=payload,
        qos=body.get("qos", 1),
        retain=body.get("retain", False),
        headers=[(name, value.encode()) for name, value in body.get("headers", {}).items()],
        key=None if key is None else key.encode(),
        content_type=body.get("content_type"),
        source_protocol="http",
    )


async def _publish_target(request: web.Request, backend: AdminBackend) -> tuple[str, str]:
    topic = request.match_info["topic"]
    try:
        validate_topic(topic)
    except InvalidTopic as exc:
        flowmq_metrics.record_limit_refusal(exc.details)
        raise
    namespace = namespace_of(request)
    await backend.catalog.get_namespace(namespace)
    return namespace, topic


async def publish_message(request: web.Request, backend: AdminBackend) -> Any:
    namespace, topic = await _publish_target(request, backend)
    body = await read_json_body(request, schemas.PUBLISH_MESSAGE)
    routed = await backend.publish(namespace, _message_from(topic, body))
    return {"topic": topic, "destinations": _destination_refs(routed)}


async def publish_batch(request: web.Request, backend: AdminBackend) -> Any:
    namespace, topic = await _publish_target(request, backend)
    body = await read_json_body(request, schemas.PUBLISH_BATCH)
    messages = [_message_from(topic, item) for item in body["messages"]]  # validate all first
    routed = await backend.publish_batch(namespace, messages)
    return {"results": [{"topic": topic, "destinations": _destination_refs(r)} for r in routed]}
