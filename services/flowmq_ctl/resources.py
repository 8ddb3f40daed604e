"""``flowmq stream|queue|subscription|namespace|token|acl|group|client|user`` and ``cluster status``,
``version``: one admin API call (or two) per verb, the answer rendered by ``output``."""

from __future__ import annotations

import argparse
import getpass
import sys
from collections.abc import Callable
from typing import Any

from flowmq_core.version import flowmq_version
from flowmq_ctl.client import CliError, UsageError, quote
from flowmq_ctl.context import Context
from flowmq_ctl.output import emit

STREAM_COLUMNS = ("name", "partitions", "topic_filters", "messages", "bytes", "segments")
QUEUE_COLUMNS = ("name", "topic_filter", "ready", "unacked", "consumers", "shards")
GROUP_COLUMNS = ("group", "state", "members", "coordinator")
OFFSET_COLUMNS = ("stream", "partition", "committed_offset", "end_offset", "lag")
CLIENT_COLUMNS = (
    "id",
    "protocol",
    "client_id",
    "user",
    "namespace",
    "subscriptions",
    "inflight",
)
SUBSCRIPTION_COLUMNS = ("client_id", "topic_filter", "qos", "shared_group", "namespace", "node_id")
NODE_COLUMNS = ("node_id", "status", "gossip", "roles", "version", "host", "http", "self")
USER_COLUMNS = ("username", "namespace", "created_at_ms")
TOKEN_COLUMNS = ("id", "namespace", "role", "description", "created_at_ms")
ACL_COLUMNS = ("id", "principal", "namespace", "resource", "action", "effect")


def _done(ctx: Context, data: dict[str, Any], said: str, **computed: str) -> int:
    """A change went through: the answer as it is for scripts; for people, the one line
    ``said`` with its ``{fields}`` filled from the answer (a list joined with ", ") or from
    ``computed``."""
    if ctx.fmt != "table":
        emit(data, ctx.fmt)
        return 0
    fields = {k: ", ".join(map(str, v)) if isinstance(v, list) else v for k, v in data.items()}
    ctx.out.write(said.format_map({**fields, **computed}) + "\n")
    return 0


def _settings(args: argparse.Namespace, names: dict[str, str]) -> dict[str, Any]:
    """The API fields (``names``: argument -> field) the command line gave."""
    return {
        field: getattr(args, arg) for arg, field in names.items() if getattr(args, arg) is not None
    }


# --- streams and queues: list, describe and delete are alike --------------------------------------
Handler = Callable[[argparse.Namespace, Context], int]


def _lister(plural: str, columns: tuple[str, ...]) -> Handler:
    def handler(args: argparse.Namespace, ctx: Context) -> int:
        emit(ctx.api.call("GET", f"/{plural}", query=ctx.ns_query), ctx.fmt, columns)
        return 0

    return handler


def _describer(plural: str) -> Handler:
    def handler(args: argparse.Namespace, ctx: Context) -> int:
        emit(ctx.api.call("GET", f"/{plural}/{quote(args.name)}", query=ctx.ns_query), ctx.fmt)
        return 0

    return handler


def _deleter(plural: str, noun: str) -> Handler:
    def handler(args: argparse.Namespace, ctx: Context) -> int:
        data = ctx.api.call("DELETE", f"/{plural}/{quote(args.name)}", query=ctx.ns_query)
        return _done(ctx, data, noun + " {deleted} deleted")

    return handler


stream_list = _lister("streams", STREAM_COLUMNS)
stream_describe = _describer("streams")
stream_delete = _deleter("streams", "stream")
queue_list = _lister("queues", QUEUE_COLUMNS)
queue_describe = _describer("queues")
queue_delete = _deleter("queues", "queue")


# --- streams ----------------------------------------------------------------------------------
_STREAM_SETTINGS = {
    "filters": "topic_filters",
    "partitions": "partitions",
    "retention_ms": "retention_ms",
    "retention_bytes": "retention_bytes",
}


def stream_create(args: argparse.Namespace, ctx: Context) -> int:
    body = {"name": args.name, **_settings(args, _STREAM_SETTINGS)}
    data = ctx.api.call("POST", "/streams", body, ctx.ns_query)
    return _done(
        ctx, data, "stream {name} created: {partitions} partition(s), filters {topic_filters}"
    )


def stream_update(args: argparse.Namespace, ctx: Context) -> int:
    body = _settings(args, _STREAM_SETTINGS)
    if not body:
        raise UsageError(
            "nothing to update: give --filter, --partitions, --retention-ms or --retention-bytes"
        )
    data = ctx.api.call("PUT", f"/streams/{quote(args.name)}", body, ctx.ns_query)
    return _done(ctx, data, "stream {name} updated")


# --- queues ----------------------------------------------------------------------------------
_QUEUE_SETTINGS = {
    "filter": "topic_filter",
    "max_size_mb": "max_size_mb",
    "ttl_seconds": "message_ttl_seconds",
    "max_retries": "max_retries",
    "dead_letter_topic": "dead_letter_topic",
}


def queue_create(args: argparse.Namespace, ctx: Context) -> int:
    body = {"name": args.name, **_settings(args, {**_QUEUE_SETTINGS, "shards": "shards"})}
    data = ctx.api.call("POST", "/queues", body, ctx.ns_query)
    return _done(ctx, data, "queue {name} created: filter {topic_filter}")


def queue_purge(args: argparse.Namespace, ctx: Context) -> int:
    data = ctx.api.call("POST", f"/queues/{quote(args.name)}/purge", query=ctx.ns_query)
    return _done(ctx, data, "queue {queue}: {purged} message(s) purged")


# --- subscriptions, namespaces ----------------------------------------------------------------
def subscription_list(args: argparse.Namespace, ctx: Context) -> int:
    emit(ctx.api.call("GET", "/subscriptions", query=ctx.ns_query), ctx.fmt, SUBSCRIPTION_COLUMNS)
    return 0


def namespace_list(args: argparse.Namespace, ctx: Context) -> int:
    emit(ctx.api.call("GET", "/namespaces"), ctx.fmt, ("name", "created_at_ms"))
    return 0


def namespace_create(args: argparse.Namespace, ctx: Context) -> int:
    data = ctx.api.call("POST", "/namespaces", {"name": args.name})
    return _done(ctx, data, "namespace {name} created")


def namespace_delete(args: argparse.Namespace, ctx: Context) -> int:
    data = ctx.api.call("DELETE", f"/namespaces/{quote(args.name)}")
    return _done(ctx, data, "namespace {deleted} deleted")


# --- admin tokens ------------------------------------------------------------------------------
def token_create(args: argparse.Namespace, ctx: Context) -> int:
    body = {"namespace": args.namespace, "role": args.role}
    if args.description:
        body["description"] = args.description
    data = ctx.api.call("POST", "/tokens", body)
    if ctx.fmt != "table":
        emit(data, ctx.fmt)
        return 0
    ctx.out.write(
        f"token {data['id']} created: {data['role']} of namespace {data['namespace']}; "
        f"its secret, shown only this once, is the next line\n{data['token']}\n"
    )
    return 0


def token_list(args: argparse.Namespace, ctx: Context) -> int:
    emit(ctx.api.call("GET", "/tokens"), ctx.fmt, TOKEN_COLUMNS)
    return 0


def token_delete(args: argparse.Namespace, ctx: Context) -> int:
    data = ctx.api.call("DELETE", f"/tokens/{quote(args.id)}")
    return _done(ctx, data, "token {deleted} deleted")


# --- ACL rules ----------------------------------------------------------------------------------
def acl_add(args: argparse.Namespace, ctx: Context) -> int:
    body = {
        "principal": args.principal,
        "namespace": args.namespace or "default",
        "resource": args.resource,
        "action": args.action,
        "effect": args.effect,
    }
    data = ctx.api.call("POST", "/acls", body)
    return _done(
        ctx, data, "rule {id} added: {effect} {principal} {action} {resource} in {namespace}"
    )


def acl_list(args: argparse.Namespace, ctx: Context) -> int:
    query = {"namespace": args.namespace} if args.namespace else None
    emit(ctx.api.call("GET", "/acls", query=query), ctx.fmt, ACL_COLUMNS)
    return 0


def acl_delete(args: argparse.Namespace, ctx: Context) -> int:
    data = ctx.api.call("DELETE", f"/acls/{quote(args.id)}")
    return _done(ctx, data, "rule {deleted} deleted")


# --- consumer groups ----------------------------------------------------------------------------
def group_list(args: argparse.Namespace, ctx: Context) -> int:
    emit(ctx.api.call("GET", "/groups", query=ctx.ns_query), ctx.fmt, GROUP_COLUMNS)
    return 0


def group_describe(args: argparse.Namespace, ctx: Context) -> int:
    data = ctx.api.call("GET", f"/groups/{quote(args.group)}", query=ctx.ns_query)
    if ctx.fmt != "table":
        emit(data, ctx.fmt)
        return 0
    members = data.get("members")
    summary = {
        "group": data["group"],
        "namespace": data["namespace"],
        "state": data.get("state"),
        "coordinator": data.get("coordinator"),
        "members": None
        if members is None
        else [m.get("client_id") or m["member_id"] for m in members],
        "lag": data["lag"],
    }
    emit(summary, "table")
    if data["offsets"]:
        ctx.out.write("\n")
        emit(data["offsets"], "table", OFFSET_COLUMNS)
    return 0


def _offset_target(text: str) -> str | int:
    if text in ("earliest", "latest"):
        return text
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise UsageError(f"--to must be earliest, latest or an offset (0 or more); got {text!r}")
    return value


def group_reset(args: argparse.Namespace, ctx: Context) -> int:
    body: dict[str, Any] = {"stream": args.stream, "to": _offset_target(args.to)}
    if args.partition is not None:
        body["partition"] = args.partition
    data = ctx.api.call("POST", f"/groups/{quote(args.group)}/reset-offsets", body, ctx.ns_query)
    moved = ", ".join(f"{o['partition']}→{o['offset']}" for o in data["offsets"])
    return _done(ctx, data, "group {group} on {stream}: partition→offset {moved}", moved=moved)


# --- clients ------------------------------------------------------------------------------------
def client_list(args: argparse.Namespace, ctx: Context) -> int:
    emit(
        ctx.api.call("GET", "/clients", query={"protocol": args.protocol}), ctx.fmt, CLIENT_COLUMNS
    )
    return 0


def client_kick(args: argparse.Namespace, ctx: Context) -> int:
    data = ctx.api.call("DELETE", f"/clients/{quote(args.id)}")
    return _done(ctx, data, "disconnected {disconnected}")


# --- cluster, version ------------------------------------------------------------------------------
def cluster_status(args: argparse.Namespace, ctx: Context) -> int:
    nodes = ctx.api.call("GET", "/cluster/nodes")
    if ctx.fmt != "table":
        emit(nodes, ctx.fmt)
        return 0
    rows = [{**n, "http": (n.get("ports") or {}).get("http")} for n in nodes]
    emit(sorted(rows, key=lambda n: n["node_id"]), "table", NODE_COLUMNS)
    up = sum(1 for n in nodes if n.get("status") == "up")
    ctx.out.write(f"{up} of {len(nodes)} node(s) up\n")
    return 0


def version(args: argparse.Namespace, ctx: Context) -> int:
    data: dict[str, Any] = {"client": flowmq_version(), "server": None, "node_id": None}
    problem = None
    try:
        health = ctx.api.call("GET", "/health", timeout=5)
        data.update(server=health.get("version"), node_id=health.get("node_id"))
    except CliError as exc:
        problem = str(exc)
    if ctx.fmt != "table":
        emit(data, ctx.fmt)
    else:
        ctx.out.write(f"flowmq {data['client']}\n")
        if problem is None:
            ctx.out.write(f"server {data['server']} (node {data['node_id']}, {ctx.target.url})\n")
        else:
            ctx.out.write(f"server: {problem}\n")
    return 0


# --- users over the admin API --------------------------------------------------------------------
def read_password(given: str | None) -> str:
    """``--password``, else one line of standard input (asked for on a terminal)."""
    if given is not None:
        password = given
    elif sys.stdin.isatty():
        password = getpass.getpass("password: ")
    else:
        password = sys.stdin.readline().rstrip("\n")
    if not password:
        raise UsageError("password must not be empty")
    return password


def user_list(args: argparse.Namespace, ctx: Context) -> int:
    emit(ctx.api.call("GET", "/users"), ctx.fmt, USER_COLUMNS)
    return 0


def user_add(args: argparse.Namespace, ctx: Context) -> int:
    body = {"username": args.name, "password": read_password(args.password)}
    if args.namespace:
        body["namespace"] = args.namespace
    data = ctx.api.call("POST", "/users", body)
    return _done(ctx, data, "user {username} saved")


def user_passwd(args: argparse.Namespace, ctx: Context) -> int:
    password = read_password(args.password)
    data = ctx.api.call("PUT", f"/users/{quote(args.name)}", {"password": password})
    return _done(ctx, data, "password of user {username} changed")


def user_delete(args: argparse.Namespace, ctx: Context) -> int:
    data = ctx.api.call("DELETE", f"/users/{quote(args.name)}")
    return _done(ctx, data, "user {deleted} deleted")
