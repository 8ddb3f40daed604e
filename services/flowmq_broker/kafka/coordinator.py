"""The classic Kafka group coordinator, in memory on the coordinating broker.

States as in Kafka's ``GroupCoordinator``: Empty → PreparingRebalance (members (re)join)
→ CompletingRebalance (JoinGroup answered: the leader got every member's metadata and
computes the assignment) → Stable (the leader's SyncGroup handed each member its share).
A member joining or leaving, changing its protocols, or missing its session timeout moves
the group back to PreparingRebalance; members that do not rejoin within the rebalance
timeout are dropped.  The coordinator only picks a protocol every member supports (range,
roundrobin, cooperative-sticky … whatever the clients propose) and a leader; assignments are
opaque bytes it passes on.  Committed offsets are not kept here (``GroupOffsetStore``).

Generations come from the meta store (``store_generation``): a completed join stores the
group's next generation there — above any another coordinator of the group handed out
before it took over — and only then answers the JoinGroups, so no member of the new
generation can read the committed offsets before a commit of an older generation (from a
member that missed the rebalance, or from a deposed coordinator whose write was delayed) is
refused by the commit's own transaction.

Groups move between coordinators (a broker dies, pauses, or the brokers' views of who is
alive differ for a moment) and their members and assignments, unlike Kafka's, are not
stored: a coordinator meets members it has no record of, and may get a group back whose
record it kept while the group ran elsewhere.  So that a group that moved, even back and
forth, rebalances within one round of rejoins (issue #11):

- a member keeps its id across coordinators: JoinGroup with an id this coordinator does not
  know admits it under that id, and a Heartbeat, SyncGroup or OffsetCommit from such a
  member gets REBALANCE_IN_PROGRESS (it rejoins under its id) rather than UNKNOWN_MEMBER_ID,
  which makes clients drop their id and join as new members — leaving their old id behind,
  at a coordinator the group may return to, as a member whose session timeout that
  coordinator's next rebalance waits for.  UNKNOWN_MEMBER_ID stays the answer to a member
  this coordinator removed (left, timed out), unless it has been in a newer generation since
  (removed here while the group ran elsewhere);
- a member of a generation newer than the coordinator's own shows that the group ran on
  another coordinator since: the record here is stale, and the group rebalances (so does a
  commit the meta store refused as of an older generation than the stored one).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import flowmq_metrics as metrics
from flowmq_core.limits import MAX_NAME_BYTES, utf8_size
from flowmq_wire.kafka import ErrorCode

log = logging.getLogger(__name__)

# A new group waits this long for more members before its first generation (Kafka's
# group.initial.rebalance.delay.ms is 3 s; clients starting together still land in one).
INITIAL_REBALANCE_DELAY_S = 0.3
MIN_SESSION_TIMEOUT_MS = 1_000
MAX_SESSION_TIMEOUT_MS = 1_800_000
# The longest member id a JoinGroup may bring from another coordinator (ids are made as
# ``<client id>-<uuid>``): a bound on what a client can make this coordinator keep.
MAX_MEMBER_ID_BYTES = 1024
# Removed members remembered per group (the oldest forgotten first).
KEEP_REMOVED = 1000


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    assignment: bytes = b""
    join_future: asyncio.Future[JoinResult] | None = None
    sync_future: asyncio.Future[SyncResult] | None = None
    last_seen: float = 0.0
    expiry: asyncio.TimerHandle | None = None

    def metadata_for(self, protocol: str | None) -> bytes:
        for name, metadata in self.protocols:
            if name == protocol:
                return metadata
        return b""


@dataclass
class Group:
    group_id: str
    state: GroupState = GroupState.EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol: str | None = None
    leader: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    pending_members: set[str] = field(default_factory=set)
    # Members this coordinator removed (left, timed out), with the generation they were
    # removed in: what tells a removed member from one of another coordinator (``_stranger``).
    removed: dict[str, int] = field(default_factory=dict)
    timer: asyncio.TimerHandle | None = None
    delay_until: float = 0.0
    # The task storing the group's next generation (a newer one supersedes it and waits
    # for it first, so stores of one group run in order and numbers only grow).
    advancing: asyncio.Task[None] | None = None


@dataclass(frozen=True)
class JoinResult:
    error: int
    generation: int = -1
    protocol_type: str | None = None
    protocol: str | None = None
    leader: str = ""
    member_id: str = ""
    members: Sequence[tuple[str, str | None, bytes]] = ()


@dataclass(frozen=True)
class SyncResult:
    error: int
    protocol_type: str | None = None
    protocol: str | None = None
    assignment: bytes = b""


def valid_group_id(group_id: str) -> bool:
    """A group id the broker accepts: non-empty and within the name limit (it becomes part
    of the meta-store keys of the group's committed offsets)."""
    if not group_id:
        return False
    if utf8_size(group_id) > MAX_NAME_BYTES:
        metrics.limits_rejections_count.labels("name_bytes").inc()
        return False
    return True


# (group id, its current generation) -> the next generation, once stored durably.
StoreGeneration = Callable[[str, int], Awaitable[int]]


class GroupCoordinator:
    def __init__(
        self,
        *,
        initial_delay_s: float = INITIAL_REBALANCE_DELAY_S,
        store_generation: StoreGeneration | None = None,
    ) -> None:
        self.initial_delay_s = initial_delay_s
        # None: generations counted in memory only (unit tests of the state machine).
        self.store_generation = store_generation
        self.groups: dict[str, Group] = {}
        self._storing: set[asyncio.Task[None]] = set()

    # -- JoinGroup ----------------------------------------------------------------------------

    def join(
        self,
        group_id: str,
        member_id: str,
        group_instance_id: str | None,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        client_id: str,
        client_host: str,
        *,
        require_known_member_id: bool,
    ) -> JoinResult | asyncio.Future[JoinResult]:
        if not valid_group_id(group_id):
            return JoinResult(ErrorCode.INVALID_GROUP_ID)
        if not MIN_SESSION_TIMEOUT_MS <= session_timeout_ms <= MAX_SESSION_TIMEOUT_MS:
            return JoinResult(ErrorCode.INVALID_SESSION_TIMEOUT)
        if not protocol_type or not protocols:
            return JoinResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
        if utf8_size(member_id) > MAX_MEMBER_ID_BYTES:
            return JoinResult(ErrorCode.UNKNOWN_MEMBER_ID)
        group = self.groups.get(group_id)
        if group is None:
            group = self.groups[group_id] = Group(group_id)
        if not self._protocols_fit(group, member_id, protocol_type, protocols):
            return JoinResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
        if not member_id:
            member_id = f"{client_id or 'member'}-{uuid.uuid4()}"
            if require_known_member_id:
                # KIP-394: the member comes back with this id, so a retried JoinGroup
                # cannot leave a ghost member behind.
                group.pending_members.add(member_id)
                return JoinResult(ErrorCode.MEMBER_ID_REQUIRED, member_id=member_id)
        else:
            # An id this coordinator does not know is admitted as it is: the member was given
            # it by another coordinator of the group (module docstring), or was removed here
            # and rejoins (Kafka would make it take a new id, to the same effect).
            group.pending_members.discard(member_id)
            group.removed.pop(member_id, None)
        loop = asyncio.get_running_loop()
        member = group.members.get(member_id)
        changed = member is None or member.protocols != protocols
        if member is None:
            member = Member(
                member_id,
                group_instance_id,
                client_id,
                client_host,
                session_timeout_ms,
                rebalance_timeout_ms,
                protocol_type,
                protocols,
            )
            group.members[member_id] = member
        else:
            member.protocols = protocols
            member.session_timeout_ms = session_timeout_ms
            member.rebalance_timeout_ms = rebalance_timeout_ms
        if group.protocol_type is None:
            group.protocol_type = protocol_type
        if member.join_future is not None and not member.join_future.done():
            member.join_future.set_result(JoinResult(ErrorCode.REBALANCE_IN_PROGRESS))
        self._touch(group, member)
        if group.state is GroupState.STABLE and not changed and member_id != group.leader:
            # A follower rejoining with nothing new: tell it the current generation.
            return self._join_result(group, member)
        future: asyncio.Future[JoinResult] = loop.create_future()
        member.join_future = future
        if group.state is not GroupState.PREPARING_REBALANCE:
            self._prepare_rebalance(group, f"member {member_id} joined")
        self._maybe_complete_join(group)
        return future

    def _protocols_fit(
        self, group: Group, member_id: str, protocol_type: str, protocols: list[tuple[str, bytes]]
    ) -> bool:
        others = [m for mid, m in group.members.items() if mid != member_id]
        if not others:
            return True
        if group.protocol_type is not None and protocol_type != group.protocol_type:
            return False
        names = {name for name, _ in protocols}
        common = set.intersection(names, *({n for n, _ in m.protocols} for m in others))
        return bool(common)

    def _join_result(self, group: Group, member: Member) -> JoinResult:
        members: list[tuple[str, str | None, bytes]] = []
        if member.member_id == group.leader:
            members = [
                (m.member_id, m.group_instance_id, m.metadata_for(group.protocol))
                for m in group.members.values()
            ]
        return JoinResult(
            ErrorCode.NONE,
            group.generation,
            group.protocol_type,
            group.protocol,
            group.leader or "",
            member.member_id,
            members,
        )

    def _prepare_rebalance(self, group: Group, reason: str) -> None:
        loop = asyncio.get_running_loop()
        log.debug("group %s: rebalance (%s)", group.group_id, reason)
        if group.state is GroupState.COMPLETING_REBALANCE:
            for m in group.members.values():
                m.assignment = b""
                if m.sync_future is not None and not m.sync_future.done():
                    m.sync_future.set_result(SyncResult(ErrorCode.REBALANCE_IN_PROGRESS))
                m.sync_future = None
        initial = group.state is GroupState.EMPTY
        group.state = GroupState.PREPARING_REBALANCE
        if group.timer is not None:
            group.timer.cancel()
        if initial:
            group.delay_until = loop.time() + self.initial_delay_s
            group.timer = loop.call_later(self.initial_delay_s, self._initial_delay_over, group)
        else:
            group.delay_until = 0.0
            timeout = max((m.rebalance_timeout_ms for m in group.members.values()), default=0)
            group.timer = loop.call_later(timeout / 1000, self._rebalance_timeout, group)

    def _initial_delay_over(self, group: Group) -> None:
        group.timer = None
        group.delay_until = 0.0
        self._maybe_complete_join(group)
        if group.state is GroupState.PREPARING_REBALANCE and group.timer is None:
            timeout = max((m.rebalance_timeout_ms for m in group.members.values()), default=0)
            loop = asyncio.get_running_loop()
            group.timer = loop.call_later(timeout / 1000, self._rebalance_timeout, group)

    def _rebalance_timeout(self, group: Group) -> None:
        self._maybe_complete_join(group, force=True)

    def _maybe_complete_join(self, group: Group, *, force: bool = False) -> None:
        if group.state is not GroupState.PREPARING_REBALANCE:
            return
        loop = asyncio.get_running_loop()
        if not force and loop.time() < group.delay_until:
            return
        missing = [m for m in group.members.values() if m.join_future is None]
        if missing and not force:
            return
        for m in missing:
            self._remove(group, m, "did not rejoin in time")
        if group.timer is not None:
            group.timer.cancel()
            group.timer = None
        if not group.members:
            self._new_generation(group)
            group.state = GroupState.EMPTY
            group.protocol = group.leader = None
            group.protocol_type = None
            return
        group.protocol = self._select_protocol(group)
        if group.leader not in group.members:
            group.leader = next(iter(group.members))
        group.state = GroupState.COMPLETING_REBALANCE
        self._new_generation(group, self._answer_joins)

    def _answer_joins(self, group: Group) -> None:
        for m in group.members.values():
            fut, m.join_future = m.join_future, None
            self._touch(group, m)
            if fut is not None and not fut.done():
                fut.set_result(self._join_result(group, m))

    def _new_generation(self, group: Group, then: Callable[[Group], None] | None = None) -> None:
        """Move ``group`` to its next generation, then call ``then`` (if the group is still
        completing that rebalance).  With a generation store the number is stored first."""
        if self.store_generation is None:
            group.generation += 1
            if then is not None:
                then(group)
            return
        task = asyncio.get_running_loop().create_task(
            self._store_next_generation(group, group.advancing, then),
            name=f"group-generation-{group.group_id}",
        )
        group.advancing = task
        self._storing.add(task)
        task.add_done_callback(self._storing.discard)

    async def _store_next_generation(
        self,
        group: Group,
        previous: asyncio.Task[None] | None,
        then: Callable[[Group], None] | None,
    ) -> None:
        assert self.store_generation is not None
        if previous is not None:
            await asyncio.wait([previous])  # its number first: ours must be above it
        try:
            generation = await self.store_generation(group.group_id, group.generation)
        except Exception as exc:
            log.warning("group %s: cannot store its next generation: %s", group.group_id, exc)
            generation = None
        if self.groups.get(group.group_id) is not group:
            return  # forgotten or shut down meanwhile
        if generation is not None:
            group.generation = max(group.generation, generation)
        if group.advancing is not asyncio.current_task():
            return  # a newer rebalance stores its own generation
        group.advancing = None
        if then is None or group.state is not GroupState.COMPLETING_REBALANCE:
            return
        if generation is not None:
            then(group)
            return
        # Not stored (meta store unreachable): the members must join again.
        for m in group.members.values():
            fut, m.join_future = m.join_future, None
            if fut is not None and not fut.done():
                fut.set_result(JoinResult(ErrorCode.COORDINATOR_NOT_AVAILABLE))
        self._prepare_rebalance(group, "its generation could not be stored")

    @staticmethod
    def _select_protocol(group: Group) -> str:
        members = list(group.members.values())
        common = set.intersection(*({n for n, _ in m.protocols} for m in members))
        votes: dict[str, int] = {}
        for m in members:
            for name, _ in m.protocols:
                if name in common:
                    votes[name] = votes.get(name, 0) + 1
                    break
        # Most first choices wins; ties go to the leader-to-be's preference order.
        order = [n for n, _ in members[0].protocols if n in common]
        return max(order, key=lambda n: (votes.get(n, 0), -order.index(n)))

    # -- SyncGroup ---------------------------------------------------------------------------

    def sync(
        self,
        group_id: str,
        generation: int,
        member_id: str,
        protocol_type: str | None,
        protocol: str | None,
        assignments: list[tuple[str, bytes]],
    ) -> SyncResult | asyncio.Future[SyncResult]:
        group = self.groups.get(group_id)
        member = group.members.get(member_id) if group is not None else None
        if group is None or member is None:
            return SyncResult(
                self._stranger(group, member_id, generation, ErrorCode.UNKNOWN_MEMBER_ID)
            )
        if group.advancing is not None:
            return SyncResult(ErrorCode.REBALANCE_IN_PROGRESS)
        if generation != group.generation:
            return SyncResult(self._other_generation(group, generation))
        if (protocol_type is not None and protocol_type != group.protocol_type) or (
            protocol is not None and protocol != group.protocol
        ):
            return SyncResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
        self._touch(group, member)
        if group.state is GroupState.PREPARING_REBALANCE:
            return SyncResult(ErrorCode.REBALANCE_IN_PROGRESS)
        if group.state is GroupState.STABLE:
            return SyncResult(
                ErrorCode.NONE, group.protocol_type, group.protocol, member.assignment
            )
        if group.state is not GroupState.COMPLETING_REBALANCE:
            return SyncResult(ErrorCode.UNKNOWN_MEMBER_ID)
        future: asyncio.Future[SyncResult] = asyncio.get_running_loop().create_future()
        if member.sync_future is not None and not member.sync_future.done():
            member.sync_future.set_result(SyncResult(ErrorCode.REBALANCE_IN_PROGRESS))
        member.sync_future = future
        if member_id == group.leader:
            given = dict(assignments)
            group.state = GroupState.STABLE
            for m in group.members.values():
                m.assignment = given.get(m.member_id, b"")
                fut, m.sync_future = m.sync_future, None
                if fut is not None and not fut.done():
                    fut.set_result(
                        SyncResult(
                            ErrorCode.NONE, group.protocol_type, group.protocol, m.assignment
                        )
                    )
        return future

    # -- Heartbeat / LeaveGroup --------------------------------------------------------------

    def heartbeat(self, group_id: str, generation: int, member_id: str) -> int:
        group = self.groups.get(group_id)
        member = group.members.get(member_id) if group is not None else None
        if group is None or member is None:
            return self._stranger(group, member_id, generation, ErrorCode.UNKNOWN_MEMBER_ID)
        if generation != group.generation:
            return self._other_generation(group, generation)
        self._touch(group, member)
        if group.state is GroupState.PREPARING_REBALANCE or group.advancing is not None:
            return ErrorCode.REBALANCE_IN_PROGRESS
        return ErrorCode.NONE

    def leave(self, group_id: str, member_ids: Sequence[str]) -> list[int]:
        group = self.groups.get(group_id)
        if group is None:
            return [ErrorCode.UNKNOWN_MEMBER_ID for _ in member_ids]
        codes: list[int] = []
        left = False
        for member_id in member_ids:
            member = group.members.get(member_id)
            if member is None:
                codes.append(
                    ErrorCode.NONE
                    if member_id in group.pending_members
                    else ErrorCode.UNKNOWN_MEMBER_ID
                )
                group.pending_members.discard(member_id)
                continue
            self._remove(group, member, "left the group")
            codes.append(ErrorCode.NONE)
            left = True
        if left:
            self._after_departure(group, "members left")
        return codes

    def _remove(self, group: Group, member: Member, why: str) -> None:
        log.info("group %s: member %s %s", group.group_id, member.member_id, why)
        group.members.pop(member.member_id, None)
        group.removed[member.member_id] = group.generation
        if len(group.removed) > KEEP_REMOVED:
            del group.removed[next(iter(group.removed))]
        if member.expiry is not None:
            member.expiry.cancel()
            member.expiry = None
        if member.join_future is not None and not member.join_future.done():
            member.join_future.set_result(JoinResult(ErrorCode.UNKNOWN_MEMBER_ID))
        if member.sync_future is not None and not member.sync_future.done():
            member.sync_future.set_result(SyncResult(ErrorCode.UNKNOWN_MEMBER_ID))
        member.join_future = member.sync_future = None
        if group.leader == member.member_id:
            group.leader = None

    def _after_departure(self, group: Group, reason: str) -> None:
        if not group.members:
            if group.timer is not None:
                group.timer.cancel()
                group.timer = None
            if group.state is not GroupState.EMPTY:
                self._new_generation(group)
            group.state = GroupState.EMPTY
            group.protocol = group.leader = group.protocol_type = None
            return
        if group.state is not GroupState.PREPARING_REBALANCE:
            self._prepare_rebalance(group, reason)
        # Members still waiting in JoinGroup (their generation was being stored) count as
        # rejoined: with no one else missing, the rebalance completes now.
        self._maybe_complete_join(group)

    # -- sessions ----------------------------------------------------------------------------

    def _touch(self, group: Group, member: Member) -> None:
        loop = asyncio.get_running_loop()
        member.last_seen = loop.time()
        if member.expiry is None:
            member.expiry = loop.call_later(
                member.session_timeout_ms / 1000, self._check_session, group, member
            )

    def _check_session(self, group: Group, member: Member) -> None:
        member.expiry = None
        if group.members.get(member.member_id) is not member:
            return
        loop = asyncio.get_running_loop()
        due = member.last_seen + member.session_timeout_ms / 1000
        awaiting_join = member.join_future is not None and not member.join_future.done()
        if awaiting_join or loop.time() < due:
            # A member waiting in JoinGroup is covered by the rebalance timeout instead.
            delay = member.session_timeout_ms / 1000 if awaiting_join else due - loop.time()
            member.expiry = loop.call_later(max(delay, 0.001), self._check_session, group, member)
            return
        self._remove(group, member, "missed its session timeout")
        self._after_departure(group, f"member {member.member_id} timed out")

    # -- offsets and views -------------------------------------------------------------------

    def check_commit(self, group_id: str, generation: int, member_id: str) -> int:
        """May this member commit offsets for the group now (Kafka's rules, and members of
        other coordinators' generations told to rejoin: module docstring)?"""
        group = self.groups.get(group_id)
        if group is None or (group.state is GroupState.EMPTY and not group.members):
            if generation < 0:
                return ErrorCode.NONE
            refusal = ErrorCode.ILLEGAL_GENERATION if group is None else ErrorCode.UNKNOWN_MEMBER_ID
            return self._stranger(group, member_id, generation, refusal)
        if group.state is GroupState.COMPLETING_REBALANCE or group.advancing is not None:
            return ErrorCode.REBALANCE_IN_PROGRESS
        member = group.members.get(member_id)
        if member is None:
            return self._stranger(group, member_id, generation, ErrorCode.UNKNOWN_MEMBER_ID)
        if generation != group.generation:
            return self._other_generation(group, generation)
        self._touch(group, member)
        return ErrorCode.NONE

    def generation_superseded(self, group_id: str, generation: int) -> None:
        """The meta store refused a commit of ``generation``, which this coordinator holds
        for the group's current one: another coordinator handed out a newer one since, so
        the members and assignments here are stale.  Rebalance (the members rejoin)."""
        group = self.groups.get(group_id)
        if group is not None and group.generation == generation:
            self._superseded(group)

    # -- members of other coordinators ---------------------------------------------------------

    @staticmethod
    def _stranger(group: Group | None, member_id: str, generation: int, refusal: int) -> int:
        """The answer to a member this coordinator has no record of.  One it removed itself
        gets ``refusal`` (Kafka's), unless it has been in a newer generation since (it was
        removed here while the group ran elsewhere); any other was given its id by another
        coordinator of the group, and rejoins under it (REBALANCE_IN_PROGRESS)."""
        if not member_id or generation < 0:
            return refusal  # no member of any generation (a simple consumer's commit)
        removed_in = group.removed.get(member_id) if group is not None else None
        if removed_in is not None and generation <= removed_in:
            return refusal
        return ErrorCode.REBALANCE_IN_PROGRESS

    def _other_generation(self, group: Group, generation: int) -> int:
        """The answer to a member whose generation is not the group's: ILLEGAL_GENERATION
        for an old one; a newer one means the group ran on another coordinator since this
        one last rebalanced it, and it rebalances."""
        if generation < group.generation:
            return ErrorCode.ILLEGAL_GENERATION
        self._superseded(group)
        return ErrorCode.REBALANCE_IN_PROGRESS

    def _superseded(self, group: Group) -> None:
        if group.advancing is None and group.state in (
            GroupState.STABLE,
            GroupState.COMPLETING_REBALANCE,
        ):
            self._prepare_rebalance(group, "another coordinator handed out a newer generation")

    def forget(self, group_id: str) -> None:
        """Drop a group without members (DeleteGroups)."""
        group = self.groups.get(group_id)
        if group is not None and not group.members:
            if group.timer is not None:
                group.timer.cancel()
            del self.groups[group_id]

    def describe(self, group_id: str) -> Group | None:
        return self.groups.get(group_id)

    def shutdown(self) -> None:
        """Stop timers; members waiting in Join/Sync are told to find the coordinator
        again (another broker takes over)."""
        for task in self._storing:
            task.cancel()
        for group in self.groups.values():
            if group.timer is not None:
                group.timer.cancel()
            for m in group.members.values():
                if m.expiry is not None:
                    m.expiry.cancel()
                if m.join_future is not None and not m.join_future.done():
                    m.join_future.set_result(JoinResult(ErrorCode.NOT_COORDINATOR))
                if m.sync_future is not None and not m.sync_future.done():
                    m.sync_future.set_result(SyncResult(ErrorCode.NOT_COORDINATOR))
        self.groups.clear()


__all__ = [
    "GroupCoordinator",
    "GroupState",
    "JoinResult",
    "Member",
    "SyncResult",
]
