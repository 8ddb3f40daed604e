"""Cluster-level APIs: ApiVersions, Metadata, FindCoordinator, DescribeConfigs."""

from __future__ import annotations

from typing import Any

from flowmq_broker.kafka.cluster import KafkaNode
from flowmq_broker.kafka.context import RequestContext
from flowmq_broker.kafka.topics import TopicError, partition_count
from flowmq_core.acl import CREATE, DESCRIBE, GROUP, NAMESPACE, STREAM
from flowmq_meta.catalog import DEFAULT_STREAM_RETENTION_MS, Destination
from flowmq_wire.kafka import ErrorCode

CLUSTER_ID = "flowmq-py"
# Kafka's "authorised operations not requested" (encoded as bit 31 alone).
_OPS_OMITTED = None
GROUP_KEY_TYPE = 0

# DescribeConfigs: config_source and config_type numbers of Kafka's protocol.
_DYNAMIC_TOPIC, _STATIC_BROKER, _DEFAULT = 1, 4, 5
_BOOLEAN, _STRING, _INT, _LONG, _LIST = 1, 2, 3, 5, 7
RESOURCE_TOPIC, RESOURCE_BROKER = 2, 4


def handle_api_versions(ctx: RequestContext, req: Any) -> Any:
    resp = ctx.response
    return resp(
        error_code=0,
        api_keys=[
            resp.ApiVersion(api_key=key, min_version=low, max_version=high)
            for key, low, high in ctx.server.supported
        ],
        throttle_time_ms=0,
    )


def _host(ctx: RequestContext, node: KafkaNode) -> str:
    return node.host or ctx.conn.local_host


def _port(ctx: RequestContext, node: KafkaNode) -> int:
    """A TLS client is told the brokers' TLS ports: it reconnects the way it came."""
    return node.port_for(ctx.conn.tls)


def handle_metadata(ctx: RequestContext, req: Any) -> Any:
    topics = ctx.tenant.topics
    if req.topics is None or (ctx.version == 0 and not req.topics):
        names: list[str] | None = None
    else:
        names = []
        for t in req.topics:
            name = t.name
            if name is None and ctx.version >= 10 and t.topic_id is not None:
                dest = topics.by_id(t.topic_id)
                name = dest.name if dest is not None else None
            if name is not None:
                names.append(name)
    allow = ctx.version < 4 or bool(req.allow_auto_topic_creation)
    errors: dict[str, TopicError] = {}
    if names and allow and topics.auto_create:
        access = ctx.conn.access
        missing = []
        for n in names:
            if topics.get(n) is not None or topics.name_error(n) is not None:
                continue
            if access.allowed(CREATE, STREAM, n):
                missing.append(n)
            else:  # as Kafka: auto-creation not authorized
                errors[n] = TopicError(
                    ErrorCode.TOPIC_AUTHORIZATION_FAILED, f"not authorized to create {n!r}"
                )
        if missing:
            return _metadata_after_create(ctx, names, missing, errors)
    return _metadata_response(ctx, names, errors)


async def _metadata_after_create(
    ctx: RequestContext, names: list[str], missing: list[str], errors: dict[str, TopicError]
) -> Any:
    results = await ctx.tenant.topics.ensure(missing)
    errors.update((n, r) for n, r in results.items() if isinstance(r, TopicError))
    return _metadata_response(ctx, names, errors)


def _metadata_response(
    ctx: RequestContext, names: list[str] | None, errors: dict[str, TopicError]
) -> Any:
    server = ctx.server
    cluster = server.cluster
    topics = ctx.tenant.topics
    resp = ctx.response
    brokers = [
        resp.MetadataResponseBroker(node_id=n.id, host=_host(ctx, n), port=_port(ctx, n), rack=None)
        for n in cluster.nodes
    ]
    access = ctx.conn.access
    dests: list[tuple[str, Destination | None]]
    if names is None:  # every topic the client may describe; the others are not shown
        dests = [(d.name, d) for d in topics.all() if access.allowed(DESCRIBE, STREAM, d.name)]
    else:
        dests = [(n, topics.get(n)) for n in dict.fromkeys(names)]
    out = []
    for name, dest in dests:
        if names is not None and not access.allowed(DESCRIBE, STREAM, name):
            out.append(
                resp.MetadataResponseTopic(
                    error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                    name=name,
                    is_internal=False,
                    partitions=[],
                    authorized_operations=_OPS_OMITTED,
                )
            )
            continue
        if dest is None:
            error = errors.get(name) or topics.name_error(name)
            code = error.code if error is not None else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            out.append(
                resp.MetadataResponseTopic(
                    error_code=code,
                    name=name,
                    is_internal=False,
                    partitions=[],
                    authorized_operations=_OPS_OMITTED,
                )
            )
            continue
        partitions = []
        for p in range(partition_count(dest)):
            leader = cluster.partition_leader(name, p).id
            partitions.append(
                resp.MetadataResponseTopic.MetadataResponsePartition(
                    error_code=0,
                    partition_index=p,
                    leader_id=leader,
                    leader_epoch=-1,
                    replica_nodes=[leader],
                    isr_nodes=[leader],
                    offline_replicas=[],
                )
            )
        fields: dict[str, Any] = {}
        if ctx.version >= 10:
            fields["topic_id"] = topics.topic_id(dest)
        out.append(
            resp.MetadataResponseTopic(
                error_code=0,
                name=name,
                is_internal=False,
                partitions=partitions,
                authorized_operations=_OPS_OMITTED,
                **fields,
            )
        )
    return resp(
        throttle_time_ms=0,
        brokers=brokers,
        cluster_id=CLUSTER_ID,
        controller_id=cluster.local.id,
        topics=out,
        authorized_operations=_OPS_OMITTED,
    )


def handle_find_coordinator(ctx: RequestContext, req: Any) -> Any:
    resp = ctx.response
    cluster = ctx.server.cluster
    key_type = req.key_type if ctx.version >= 1 else GROUP_KEY_TYPE

    access = ctx.conn.access

    def locate(key: str) -> tuple[int, str | None, KafkaNode | None]:
        if key_type != GROUP_KEY_TYPE:
            return ErrorCode.INVALID_REQUEST, "transactions are not supported by FlowMQ", None
        if not access.allowed(DESCRIBE, GROUP, key):
            return ErrorCode.GROUP_AUTHORIZATION_FAILED, f"not authorized on group {key!r}", None
        return ErrorCode.NONE, None, cluster.coordinator(key)

    if ctx.version >= 4:
        coordinators = []
        for key in req.coordinator_keys:
            code, message, node = locate(key)
            coordinators.append(
                resp.Coordinator(
                    key=key,
                    node_id=node.id if node else -1,
                    host=_host(ctx, node) if node else "",
                    port=_port(ctx, node) if node else -1,
                    error_code=code,
                    error_message=message,
                )
            )
        return resp(throttle_time_ms=0, coordinators=coordinators)
    code, message, node = locate(req.key)
    return resp(
        throttle_time_ms=0,
        error_code=code,
        error_message=message,
        node_id=node.id if node else -1,
        host=_host(ctx, node) if node else "",
        port=_port(ctx, node) if node else -1,
    )


def handle_describe_cluster(ctx: RequestContext, req: Any) -> Any:
    resp = ctx.response
    cluster = ctx.server.cluster
    if not ctx.conn.access.allowed(DESCRIBE, NAMESPACE):
        return resp(
            throttle_time_ms=0,
            error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
            error_message="not authorized to describe the cluster",
            endpoint_type=1,
            cluster_id=CLUSTER_ID,
            controller_id=-1,
            brokers=[],
            authorized_operations=_OPS_OMITTED,
        )
    return resp(
        throttle_time_ms=0,
        error_code=ErrorCode.NONE,
        error_message=None,
        endpoint_type=1,
        cluster_id=CLUSTER_ID,
        controller_id=cluster.local.id,
        brokers=[
            resp.DescribeClusterBroker(
                broker_id=n.id,
                host=_host(ctx, n),
                port=_port(ctx, n),
                rack=None,
                is_fenced=False,
            )
            for n in cluster.nodes
        ],
        authorized_operations=_OPS_OMITTED,
    )


# -- DescribeConfigs ----------------------------------------------------------------------------


def _topic_configs(dest: Destination) -> list[tuple[str, str, int, int, bool]]:
    """(name, value, source, type, read only) of a topic, as admin tools ask for them."""
    retention_ms = dest.options.get("retention_ms", DEFAULT_STREAM_RETENTION_MS)
    retention_bytes = dest.options.get("retention_bytes", -1)
    return [
        ("cleanup.policy", "delete", _DEFAULT, _LIST, True),
        ("compression.type", "producer", _DEFAULT, _STRING, True),
        ("max.message.bytes", "1048588", _DEFAULT, _INT, True),
        ("message.timestamp.type", "CreateTime", _DEFAULT, _STRING, True),
        ("min.insync.replicas", "1", _DEFAULT, _INT, True),
        (
            "retention.bytes",
            str(-1 if retention_bytes is None else retention_bytes),
            _DYNAMIC_TOPIC,
            _LONG,
            False,
        ),
        (
            "retention.ms",
            str(-1 if retention_ms is None else retention_ms),
            _DYNAMIC_TOPIC,
            _LONG,
            False,
        ),
        ("segment.bytes", "1073741824", _DEFAULT, _INT, True),
        ("unclean.leader.election.enable", "false", _DEFAULT, _BOOLEAN, True),
    ]


def _broker_configs(ctx: RequestContext) -> list[tuple[str, str, int, int, bool]]:
    server = ctx.server
    return [
        (
            "auto.create.topics.enable",
            str(ctx.tenant.topics.auto_create).lower(),
            _STATIC_BROKER,
            _BOOLEAN,
            True,
        ),
        ("broker.id", str(server.cluster.local.id), _STATIC_BROKER, _INT, True),
        ("default.replication.factor", "1", _DEFAULT, _INT, True),
        ("log.retention.ms", str(DEFAULT_STREAM_RETENTION_MS), _DEFAULT, _LONG, True),
        ("message.max.bytes", str(server.max_message_bytes), _STATIC_BROKER, _INT, True),
        ("num.partitions", "1", _DEFAULT, _INT, True),
        ("offsets.topic.replication.factor", "1", _DEFAULT, _INT, True),
        ("socket.request.max.bytes", str(server.max_request_size), _STATIC_BROKER, _INT, True),
    ]


def handle_describe_configs(ctx: RequestContext, req: Any) -> Any:
    resp = ctx.response
    results = []
    for res in req.resources:
        error, message = ErrorCode.NONE, None
        entries: list[tuple[str, str, int, int, bool]] = []
        access = ctx.conn.access
        if res.resource_type == RESOURCE_TOPIC:
            dest = ctx.tenant.topics.get(res.resource_name)
            if not access.allowed(DESCRIBE, STREAM, res.resource_name):
                error, message = (
                    ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                    f"not authorized to describe topic {res.resource_name!r}",
                )
            elif dest is None:
                error, message = (
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                    f"topic {res.resource_name!r} does not exist",
                )
            else:
                entries = _topic_configs(dest)
        elif res.resource_type == RESOURCE_BROKER:
            if access.allowed(DESCRIBE, NAMESPACE):
                entries = _broker_configs(ctx)
            else:
                error, message = (
                    ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                    "not authorized to describe the broker's configs",
                )
        else:
            error, message = (
                ErrorCode.INVALID_REQUEST,
                f"resource type {res.resource_type} is not supported",
            )
        wanted = set(res.configuration_keys) if res.configuration_keys is not None else None
        configs = [
            resp.DescribeConfigsResult.DescribeConfigsResourceResult(
                name=name,
                value=value,
                read_only=read_only,
                config_source=source,
                is_default=source == _DEFAULT,
                is_sensitive=False,
                synonyms=[],
                config_type=kind,
                documentation=None,
            )
            for name, value, source, kind, read_only in entries
            if wanted is None or name in wanted
        ]
        results.append(
            resp.DescribeConfigsResult(
                error_code=error,
                error_message=message,
                resource_type=res.resource_type,
                resource_name=res.resource_name,
                configs=configs,
            )
        )
    return resp(throttle_time_ms=0, results=results)


__all__ = [
    "CLUSTER_ID",
    "handle_api_versions",
    "handle_describe_cluster",
    "handle_describe_configs",
    "handle_find_coordinator",
    "handle_metadata",
]
