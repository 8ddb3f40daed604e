"""The group coordinator's state machine: generations, leaders, protocol choice,
rebalances on join / leave / session timeout, and who may commit."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from flowmq_broker.kafka.coordinator import GroupCoordinator, GroupState, JoinResult
from flowmq_wire.kafka import ErrorCode

RANGE = ("range", b"r")
STICKY = ("cooperative-sticky", b"s")
ROBIN = ("roundrobin", b"o")


def join(c: GroupCoordinator, member: str = "", protocols=(RANGE,), session_ms: int = 10_000, **kw):
    return c.join(
        kw.get("group", "g"),
        member,
        None,
        kw.get("protocol_type", "consumer"),
        list(protocols),
        session_ms,
        kw.get("rebalance_ms", 5_000),
        "client",
        "/127.0.0.1",
        require_known_member_id=kw.get("require_known", False),
    )


async def joined(*futures) -> list[JoinResult]:
    return list(await asyncio.wait_for(asyncio.gather(*futures), 5))


async def synced(c: GroupCoordinator, generation: int, *members: str, leader: str) -> None:
    """Every member syncs, the leader first (later ones are answered at once)."""
    for member in sorted(members, key=lambda m: m != leader):
        result = c.sync("g", generation, member, None, None, [])
        if isinstance(result, asyncio.Future):
            result = await asyncio.wait_for(result, 5)
        assert result.error == ErrorCode.NONE


async def test_first_generation_elects_a_leader_and_shares_metadata() -> None:
    c = GroupCoordinator(initial_delay_s=0.05)
    a, b = join(c, protocols=(STICKY, RANGE)), join(c, protocols=(RANGE, STICKY))
    ra, rb = await joined(a, b)
    assert ra.error == rb.error == ErrorCode.NONE
    assert ra.generation == rb.generation == 1
    assert ra.leader == rb.leader == ra.member_id
    assert {m for m, _, _ in ra.members} == {ra.member_id, rb.member_id}
    assert not rb.members
    assert ra.protocol == "cooperative-sticky"  # a tie goes to the leader's preference
    assert c.groups["g"].state is GroupState.COMPLETING_REBALANCE

    follower = c.sync("g", 1, rb.member_id, None, None, [])
    leader = c.sync("g", 1, ra.member_id, None, None, [(ra.member_id, b"A"), (rb.member_id, b"B")])
    assert (await leader).assignment == b"A"
    assert (await follower).assignment == b"B"
    assert c.groups["g"].state is GroupState.STABLE
    assert c.heartbeat("g", 1, rb.member_id) == ErrorCode.NONE
    assert c.heartbeat("g", 0, rb.member_id) == ErrorCode.ILLEGAL_GENERATION
    # A member it never knew was given its id by another coordinator: rejoin under it.
    assert c.heartbeat("g", 1, "nobody") == ErrorCode.REBALANCE_IN_PROGRESS


async def test_a_leaving_member_triggers_a_rebalance() -> None:
    c = GroupCoordinator(initial_delay_s=0.01)
    ra, rb = await joined(join(c), join(c))
    await synced(c, 1, ra.member_id, rb.member_id, leader=ra.leader)
    assert c.leave("g", [rb.member_id]) == [ErrorCode.NONE]
    assert c.heartbeat("g", 1, ra.member_id) == ErrorCode.REBALANCE_IN_PROGRESS
    # Commits of the old generation still count while members rejoin.
    assert c.check_commit("g", 1, ra.member_id) == ErrorCode.NONE
    (again,) = await joined(join(c, ra.member_id))
    assert (again.error, again.generation, again.leader) == (0, 2, ra.member_id)
    assert c.check_commit("g", 2, ra.member_id) == ErrorCode.REBALANCE_IN_PROGRESS
    assert c.check_commit("g", 1, ra.member_id) == ErrorCode.REBALANCE_IN_PROGRESS


async def test_a_silent_member_times_out() -> None:
    c = GroupCoordinator(initial_delay_s=0.01)
    ra, rb = await joined(join(c, session_ms=1000), join(c, session_ms=1000))
    await synced(c, 1, ra.member_id, rb.member_id, leader=ra.leader)
    for _ in range(7):  # a keeps heartbeating, b goes quiet
        await asyncio.sleep(0.2)
        c.heartbeat("g", 1, ra.member_id)
    assert rb.member_id not in c.groups["g"].members
    assert c.groups["g"].state is GroupState.PREPARING_REBALANCE


async def test_protocols_must_overlap() -> None:
    c = GroupCoordinator(initial_delay_s=0.01)
    first = join(c, protocols=(RANGE,))
    refused = join(c, protocols=(ROBIN,))
    assert refused.error == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    other_type = join(c, protocol_type="connect")
    assert other_type.error == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    assert (await first).error == ErrorCode.NONE


async def test_member_id_required_then_accepted() -> None:
    c = GroupCoordinator(initial_delay_s=0.01)
    first = join(c, require_known=True)
    assert first.error == ErrorCode.MEMBER_ID_REQUIRED and first.member_id
    (result,) = await joined(join(c, first.member_id, require_known=True))
    assert (result.error, result.member_id) == (0, first.member_id)
    assert join(c, "x" * 2000).error == ErrorCode.UNKNOWN_MEMBER_ID  # past MAX_MEMBER_ID_BYTES


async def test_commits_without_a_generation_only_for_empty_groups() -> None:
    c = GroupCoordinator(initial_delay_s=0.01)
    assert c.check_commit("lonely", -1, "") == ErrorCode.NONE
    (r,) = await joined(join(c))
    assert c.check_commit("g", 1, r.member_id) == ErrorCode.REBALANCE_IN_PROGRESS
    await synced(c, 1, r.member_id, leader=r.member_id)
    assert c.check_commit("g", 1, r.member_id) == ErrorCode.NONE
    assert c.check_commit("g", -1, "") == ErrorCode.UNKNOWN_MEMBER_ID
    c.leave("g", [r.member_id])
    assert c.groups["g"].state is GroupState.EMPTY
    assert c.check_commit("g", -1, "") == ErrorCode.NONE


async def test_shutdown_sends_waiting_members_elsewhere() -> None:
    c = GroupCoordinator(initial_delay_s=10)
    pending = join(c)
    c.shutdown()
    assert (await pending).error == ErrorCode.NOT_COORDINATOR


async def test_members_learn_a_generation_only_once_it_is_stored() -> None:
    """With a generation store (the meta store's), a completed join is answered only after
    the new generation is durable, and it continues from the stored one (another
    coordinator's), not from this coordinator's memory."""
    stored = {"g": 6}
    storing, release = asyncio.Event(), asyncio.Event()

    async def store_generation(group: str, current: int) -> int:
        storing.set()
        await release.wait()
        stored[group] = max(current, stored.get(group, 0)) + 1
        return stored[group]

    c = GroupCoordinator(initial_delay_s=0.01, store_generation=store_generation)
    pending = join(c)
    await asyncio.wait_for(storing.wait(), 5)  # the join completed: storing its generation
    assert not pending.done()
    assert c.groups["g"].state is GroupState.COMPLETING_REBALANCE
    assert c.check_commit("g", 0, "anyone") == ErrorCode.REBALANCE_IN_PROGRESS
    release.set()
    (result,) = await joined(pending)
    assert result.error == ErrorCode.NONE and result.generation == 7 == stored["g"]
    await synced(c, 7, result.member_id, leader=result.member_id)
    assert c.check_commit("g", 7, result.member_id) == ErrorCode.NONE


async def test_a_join_whose_generation_cannot_be_stored_is_refused() -> None:
    async def unreachable(group: str, current: int) -> int:
        raise RuntimeError("meta store down")

    c = GroupCoordinator(initial_delay_s=0.01, store_generation=unreachable)
    (result,) = await joined(join(c))
    assert result.error == ErrorCode.COORDINATOR_NOT_AVAILABLE
    assert c.groups["g"].state is GroupState.PREPARING_REBALANCE
    c.shutdown()


async def test_a_member_leaving_while_the_generation_is_stored_rebalances_the_rest_at_once():
    storing, release = asyncio.Event(), asyncio.Event()
    stored = 0

    async def store_generation(group: str, current: int) -> int:
        nonlocal stored
        storing.set()
        await release.wait()
        stored = max(current, stored) + 1
        return stored

    c = GroupCoordinator(initial_delay_s=0.01, store_generation=store_generation)
    first = join(c, rebalance_ms=60_000)
    await asyncio.wait_for(storing.wait(), 5)
    release.set()
    (ra,) = await joined(first)
    await synced(c, ra.generation, ra.member_id, leader=ra.member_id)
    release.clear()
    storing.clear()
    second = join(c, rebalance_ms=60_000)
    again = join(c, ra.member_id, rebalance_ms=60_000)
    await asyncio.wait_for(storing.wait(), 5)  # both joined: generation 2 being stored
    rb_id = next(m for m in c.groups["g"].members if m != ra.member_id)
    assert c.leave("g", [rb_id]) == [ErrorCode.NONE]
    release.set()
    (left, rejoined) = await asyncio.wait_for(asyncio.gather(second, again), 5)
    assert left.error == ErrorCode.UNKNOWN_MEMBER_ID
    assert rejoined.error == ErrorCode.NONE and rejoined.generation == 3  # not after 60 s
    c.shutdown()


def shared_generations() -> Callable[[str, int], Awaitable[int]]:
    """One stored generation per group, as the meta store keeps it for every coordinator."""
    stored: dict[str, int] = {}

    async def store_generation(group: str, current: int) -> int:
        stored[group] = max(current, stored.get(group, 0)) + 1
        return stored[group]

    return store_generation


async def stable_group(c: GroupCoordinator, *member_ids: str) -> tuple[int, list[str]]:
    """Members ``member_ids`` ("" for new ones) joined and synced: (generation, their ids)."""
    results = await joined(*(join(c, m, rebalance_ms=60_000) for m in member_ids))
    generation, leader = results[0].generation, results[0].leader
    ids = [r.member_id for r in results]
    await synced(c, generation, *ids, leader=leader)
    return generation, ids


async def test_members_keep_their_ids_on_a_coordinator_that_has_no_record_of_them() -> None:
    """Issue #11: the group moved to a coordinator without its members (the old one died or
    paused): they are told to rejoin, and are admitted, under the ids they had."""
    store = shared_generations()
    old = GroupCoordinator(initial_delay_s=0.01, store_generation=store)
    generation, (a, b) = await stable_group(old, "", "")
    new = GroupCoordinator(initial_delay_s=0.01, store_generation=store)
    assert new.heartbeat("g", generation, a) == ErrorCode.REBALANCE_IN_PROGRESS
    result = new.sync("g", generation, b, None, None, [])
    assert result.error == ErrorCode.REBALANCE_IN_PROGRESS
    assert new.check_commit("g", generation, a) == ErrorCode.REBALANCE_IN_PROGRESS
    moved, ids = await stable_group(new, a, b)
    assert ids == [a, b] and moved == generation + 1
    # A member this coordinator removed itself is told so, as in Kafka.
    assert new.leave("g", [b]) == [ErrorCode.NONE]
    assert new.heartbeat("g", moved, b) == ErrorCode.UNKNOWN_MEMBER_ID
    assert new.check_commit("g", moved, b) == ErrorCode.UNKNOWN_MEMBER_ID
    # ... unless it has been in a newer generation since, on another coordinator.
    assert new.heartbeat("g", moved + 2, b) == ErrorCode.REBALANCE_IN_PROGRESS
    old.shutdown()
    new.shutdown()


async def test_a_group_back_from_another_coordinator_rebalances_without_waiting() -> None:
    """The old coordinator kept its record of the group (it was paused) while the group ran
    elsewhere: the first member back, of a newer generation, makes it rebalance, and the
    rebalance ends as soon as both have rejoined, not after a session timeout."""
    store = shared_generations()
    paused = GroupCoordinator(initial_delay_s=0.01, store_generation=store)
    first, (a, b) = await stable_group(paused, "", "")
    elsewhere = GroupCoordinator(initial_delay_s=0.01, store_generation=store)
    newer, _ = await stable_group(elsewhere, a, b)
    assert paused.heartbeat("g", newer, a) == ErrorCode.REBALANCE_IN_PROGRESS
    assert paused.groups["g"].state is GroupState.PREPARING_REBALANCE
    back, ids = await stable_group(paused, a, b)  # joined() fails after 5 s; sessions are 10 s
    assert ids == [a, b] and back == newer + 1
    assert paused.heartbeat("g", first, a) == ErrorCode.ILLEGAL_GENERATION
    paused.shutdown()
    elsewhere.shutdown()


async def test_a_commit_refused_as_stale_by_the_store_rebalances_the_group() -> None:
    c = GroupCoordinator(initial_delay_s=0.01, store_generation=shared_generations())
    generation, (a,) = await stable_group(c, "")
    c.generation_superseded("g", generation - 1)  # an older generation's: nothing to learn
    assert c.groups["g"].state is GroupState.STABLE
    c.generation_superseded("g", generation)
    assert c.groups["g"].state is GroupState.PREPARING_REBALANCE
    assert c.heartbeat("g", generation, a) == ErrorCode.REBALANCE_IN_PROGRESS
    c.shutdown()
