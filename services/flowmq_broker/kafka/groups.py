"""Consumer-group membership APIs on the ``GroupCoordinator``: JoinGroup, SyncGroup,
Heartbeat, LeaveGroup, DescribeGroups, ListGroups, DeleteGroups."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from flowmq_broker.kafka.context import RequestContext
from flowmq_broker.kafka.coordinator import GroupState, JoinResult, SyncResult
from flowmq_core.acl import CONSUME, DELETE, DESCRIBE, GROUP, NAMESPACE
from flowmq_wire.kafka import ErrorCode

log = logging.getLogger(__name__)

# Kafka's "authorised operations not requested" (encoded as bit 31 alone).
_OPS_OMITTED = None


def _then(result: Any, build: Callable[[Any], Any]) -> Any:
    """``build(result)`` now, or when the future ``result`` resolves."""
    if not isinstance(result, asyncio.Future):
        return build(result)
    answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    def done(fut: asyncio.Future[Any]) -> None:
        if fut.cancelled():
            answer.cancel()
        elif fut.exception() is not None:
            answer.set_exception(fut.exception())  # type: ignore[arg-type]
        else:
            try:
                answer.set_result(build(fut.result()))
            except BaseException as exc:
                answer.set_exception(exc)

    result.add_done_callback(done)
    return answer


# -- membership --------------------------------------------------------------------------------


def _refusal(ctx: RequestContext, group_id: str) -> int:
    """Why this broker does not serve ``group_id`` to this client (the ACL's ``consume`` on
    the group, then coordination), or ``NONE``."""
    if not ctx.conn.access.allowed(CONSUME, GROUP, group_id):
        return ErrorCode.GROUP_AUTHORIZATION_FAILED
    if not ctx.server.owns_group(group_id):
        return ErrorCode.NOT_COORDINATOR
    return ErrorCode.NONE


def handle_join_group(ctx: RequestContext, req: Any) -> Any:
    resp = ctx.response
    version = ctx.version

    def build(r: JoinResult) -> Any:
        protocol = r.protocol if r.protocol is not None or version >= 7 else ""
        return resp(
            throttle_time_ms=0,
            error_code=r.error,
            generation_id=r.generation,
            protocol_type=r.protocol_type,
            protocol_name=protocol,
            leader=r.leader,
            skip_assignment=False,
            member_id=r.member_id,
            members=[
                resp.JoinGroupResponseMember(member_id=m, group_instance_id=i, metadata=meta)
                for m, i, meta in r.members
            ],
        )

    refused = _refusal(ctx, req.group_id)
    if refused:
        return build(JoinResult(refused))
    result = ctx.tenant.coordinator.join(
        req.group_id,
        req.member_id or "",
        req.group_instance_id if version >= 5 else None,
        req.protocol_type,
        [(p.name, p.metadata) for p in req.protocols],
        req.session_timeout_ms,
        req.rebalance_timeout_ms if version >= 1 else req.session_timeout_ms,
        ctx.client_id or "",
        ctx.conn.client_host,
        require_known_member_id=version >= 4,
    )
    return _then(result, build)


def handle_sync_group(ctx: RequestContext, req: Any) -> Any:
    resp = ctx.response

    def build(r: SyncResult) -> Any:
        return resp(
            throttle_time_ms=0,
            error_code=r.error,
            protocol_type=r.protocol_type,
            protocol_name=r.protocol,
            assignment=r.assignment,
        )

    refused = _refusal(ctx, req.group_id)
    if refused:
        return build(SyncResult(refused))
    result = ctx.tenant.coordinator.sync(
        req.group_id,
        req.generation_id,
        req.member_id,
        req.protocol_type if ctx.version >= 5 else None,
        req.protocol_name if ctx.version >= 5 else None,
        [(a.member_id, a.assignment) for a in req.assignments],
    )
    return _then(result, build)


def handle_heartbeat(ctx: RequestContext, req: Any) -> Any:
    code = _refusal(ctx, req.group_id) or ctx.tenant.coordinator.heartbeat(
        req.group_id, req.generation_id, req.member_id
    )
    return ctx.response(throttle_time_ms=0, error_code=code)


def handle_leave_group(ctx: RequestContext, req: Any) -> Any:
    resp = ctx.response
    if ctx.version >= 3:
        identities = [(m.member_id, m.group_instance_id) for m in req.members]
    else:
        identities = [(req.member_id, None)]
    refused = _refusal(ctx, req.group_id)
    if refused:
        return resp(throttle_time_ms=0, error_code=refused, members=[])
    codes = ctx.tenant.coordinator.leave(req.group_id, [m for m, _ in identities])
    if ctx.version < 3:
        return resp(throttle_time_ms=0, error_code=codes[0])
    return resp(
        throttle_time_ms=0,
        error_code=ErrorCode.NONE,
        members=[
            resp.MemberResponse(member_id=m, group_instance_id=i, error_code=c)
            for (m, i), c in zip(identities, codes, strict=True)
        ],
    )


def handle_describe_groups(ctx: RequestContext, req: Any) -> Any:
    resp = ctx.response
    group_cls = resp.DescribedGroup
    member_cls = group_cls.DescribedGroupMember
    out = []
    access = ctx.conn.access
    for group_id in req.groups:
        refused = None
        if not access.allowed(DESCRIBE, GROUP, group_id):
            refused = ErrorCode.GROUP_AUTHORIZATION_FAILED
        elif not ctx.server.owns_group(group_id):
            refused = ErrorCode.NOT_COORDINATOR
        if refused is not None:
            out.append(
                group_cls(
                    error_code=refused,
                    group_id=group_id,
                    group_state="",
                    protocol_type="",
                    protocol_data="",
                    members=[],
                    authorized_operations=_OPS_OMITTED,
                )
            )
            continue
        group = ctx.tenant.coordinator.describe(group_id)
        if group is None:
            out.append(
                group_cls(
                    error_code=ErrorCode.NONE,
                    group_id=group_id,
                    group_state=GroupState.DEAD.value,
                    protocol_type="",
                    protocol_data="",
                    members=[],
                    authorized_operations=_OPS_OMITTED,
                )
            )
            continue
        settled = group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE)
        members = [
            member_cls(
                member_id=m.member_id,
                group_instance_id=m.group_instance_id,
                client_id=m.client_id,
                client_host=m.client_host,
                member_metadata=m.metadata_for(group.protocol) if settled else b"",
                member_assignment=m.assignment if group.state is GroupState.STABLE else b"",
            )
            for m in group.members.values()
        ]
        out.append(
            group_cls(
                error_code=ErrorCode.NONE,
                group_id=group_id,
                group_state=group.state.value,
                protocol_type=group.protocol_type or "",
                protocol_data=(group.protocol or "") if settled else "",
                members=members,
                authorized_operations=_OPS_OMITTED,
            )
        )
    return resp(throttle_time_ms=0, groups=out)


async def handle_list_groups(ctx: RequestContext, req: Any) -> Any:
    resp = ctx.response
    server = ctx.server
    listed: dict[str, tuple[str, str]] = {}
    for group_id, group in ctx.tenant.coordinator.groups.items():
        listed[group_id] = (group.protocol_type or "consumer", group.state.value)
    # Groups known only by their committed offsets are Empty consumer groups, as in Kafka.
    try:
        stored = await server.offsets.groups(ctx.tenant.namespace)
    except Exception as exc:
        log.warning("kafka: cannot list the groups with offsets: %s", exc)
        stored = []
    for group_id in stored:
        if group_id not in listed and server.owns_group(group_id):
            listed[group_id] = ("consumer", GroupState.EMPTY.value)
    access = ctx.conn.access
    if not access.allowed(DESCRIBE, NAMESPACE):  # as Kafka: only the groups it may describe
        listed = {g: v for g, v in listed.items() if access.allowed(DESCRIBE, GROUP, g)}
    wanted = set(req.states_filter or ()) if ctx.version >= 4 else set()
    return resp(
        throttle_time_ms=0,
        error_code=ErrorCode.NONE,
        groups=[
            resp.ListedGroup(
                group_id=group_id, protocol_type=ptype, group_state=state, group_type="classic"
            )
            for group_id, (ptype, state) in sorted(listed.items())
            if not wanted or state in wanted
        ],
    )


async def handle_delete_groups(ctx: RequestContext, req: Any) -> Any:
    """Delete groups without members, committed offsets and stored generation included; a
    group is known by its coordinator, its offsets or its generation."""
    resp = ctx.response
    server = ctx.server
    results = []
    stored: set[str] | None = None  # groups with offsets: read once, on first need
    for group_id in req.groups_names:
        if not ctx.conn.access.allowed(DELETE, GROUP, group_id):
            code = ErrorCode.GROUP_AUTHORIZATION_FAILED
        elif not server.owns_group(group_id):
            code = ErrorCode.NOT_COORDINATOR
        else:
            group = ctx.tenant.coordinator.describe(group_id)
            if group is None and stored is None:
                stored = set(await server.offsets.groups(ctx.tenant.namespace))
            known = group is not None or group_id in stored  # type: ignore[operator]
            if not known:  # formed once (a coordinator since restarted), never committed
                known = await server.offsets.has_generation(ctx.tenant.namespace, group_id)
            if group is not None and group.members:
                code = ErrorCode.NON_EMPTY_GROUP
            elif not known:
                code = ErrorCode.GROUP_ID_NOT_FOUND
            else:
                ctx.tenant.coordinator.forget(group_id)
                try:
                    await server.offsets.delete_group(ctx.tenant.namespace, group_id)
                    code = ErrorCode.NONE
                    if stored is not None:
                        stored.discard(group_id)
                except Exception as exc:
                    log.warning("kafka: cannot delete the offsets of group %s: %s", group_id, exc)
                    code = ErrorCode.COORDINATOR_NOT_AVAILABLE
        results.append(resp.DeletableGroupResult(group_id=group_id, error_code=code))
    return resp(throttle_time_ms=0, results=results)


__all__ = [
    "handle_delete_groups",
    "handle_describe_groups",
    "handle_heartbeat",
    "handle_join_group",
    "handle_leave_group",
    "handle_list_groups",
    "handle_sync_group",
]
