"""Who holds a persistent MQTT session is its record in the meta store (``node`` and the
``process`` of it): brokers of one in-memory meta store, no sockets."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import pytest

from flowmq_broker.cluster import ClusterRouting
from flowmq_broker.mqtt.server import MqttServer
from flowmq_broker.mqtt.session import Session, Subscription
from flowmq_broker.routing import Router
from flowmq_meta.memory import MemoryMetaStore
from flowmq_wire.mqtt.packets import SubscriptionOptions

pytestmark = pytest.mark.timeout(30)
KEY = ("default", "k")


def broker(node_id: str, meta: MemoryMetaStore) -> MqttServer:
    """One broker process's MQTT state (its cluster routing names the process)."""
    cluster = ClusterRouting(node_id, meta)
    return MqttServer(Router(forwarder=cluster), meta, None, None, node_id=node_id, cluster=cluster)


async def persistent_session(server: MqttServer) -> None:
    session = Session("k", "default")
    session.expiry_interval = 300
    sub = Subscription("own/#", SubscriptionOptions(qos=1))
    session.subscriptions[sub.subscribed_filter] = sub
    assert await server.save_session(session)


async def test_a_survivor_adopts_no_session_of_a_node_that_restarted_meanwhile() -> None:
    """c dies and restarts while b, which took it for dead, is about to adopt its sessions:
    the restarted process reclaimed them, so b must not hold them beside it."""
    meta = MemoryMetaStore()
    c_before = broker("c", meta)
    await persistent_session(c_before)
    c_after, b = broker("c", meta), broker("b", meta)
    assert await c_after.restore_sessions() == 1  # the restart: the session is this process's
    assert await b.restore_sessions("c", c_before.process) == 0
    assert KEY in c_after.sessions and KEY not in b.sessions
    # The process that did die: its sessions are adopted, and then the record is b's.
    assert await b.restore_sessions("c", c_after.process) == 1
    assert KEY in b.sessions
    assert not await c_after.owns_session(*KEY)


async def test_a_node_whose_process_we_knew_before_is_not_gone() -> None:
    """b takes c for dead knowing c's process from before its last restart (a pause of the
    new process, its link not reconnected since): the session stays c's, and b says so, so
    that c's routes are kept (refusing) instead of cleared — a message published for the
    session meanwhile would otherwise match no route and be acknowledged, never stored."""
    meta = MemoryMetaStore()
    c_before = broker("c", meta)
    await persistent_session(c_before)
    c_after, b = broker("c", meta), broker("b", meta)
    await c_after.restore_sessions()
    assert not await b.adopt_sessions("c", c_before.process)
    assert KEY not in b.sessions and await c_after.owns_session(*KEY)
    assert await b.adopt_sessions("c", c_after.process)  # the process that did die
    assert KEY in b.sessions


async def test_a_node_does_not_store_a_session_record_another_node_adopted() -> None:
    """c was declared dead while paused and b adopted its session: c, resumed, must not
    write the record back as its own (it would hold the session beside b)."""
    meta = MemoryMetaStore()
    c, b = broker("c", meta), broker("b", meta)
    await persistent_session(c)
    assert await b.restore_sessions("c", c.process) == 1
    session = Session("k", "default")
    session.expiry_interval = 300
    assert not await c.save_session(session)
    assert await b.owns_session(*KEY) and not await c.owns_session(*KEY)


async def test_a_survivor_keeps_a_session_it_adopts_when_a_stale_kick_comes_meanwhile() -> None:
    """c, resumed after a pause, resumes its session because its record still names c (read
    just before b's adoption writes it) and kicks the others; the kick reaches b while b
    writes the record as its own, or just after.  b must keep the session: c finds the record
    b's when it stores its own and lets go, so if b dropped it too no node held it, and what
    was published meanwhile matched no route and was acknowledged without being stored (the
    pause test lost 5 messages so under load)."""
    meta = MemoryMetaStore()
    c, b = broker("c", meta), broker("b", meta)
    await persistent_session(c)
    kick = ["default", "k", False, False]  # ``MqttServer.kick``: no state wanted, not clean
    store_record = b._store_record

    async def kicked_while_storing(session: Session, **options: object) -> str | None:
        b._on_takeover(kick)  # c's kick arrives while b's adoption writes the record
        return await store_record(session, **options)

    b._store_record = kicked_while_storing  # type: ignore[method-assign]
    assert await b.restore_sessions("c", c.process) == 1
    b._on_takeover(kick)  # …or just after
    assert KEY in b.sessions and await b.owns_session(*KEY)
    resumed = Session("k", "default")
    resumed.expiry_interval = 300
    assert not await c.save_session(resumed)  # c lets go: the session is b's


def pause_at_takeover(c: MqttServer, b: MqttServer, *, answered: bool) -> asyncio.Event:
    """c has b for its peer, and is paused (for good) once it asks the others to hand over
    a session: after b let go if ``answered``, else before b heard of it.  Set once paused."""
    paused = asyncio.Event()

    async def request_all(frame: list[Any], timeout: float) -> list[Any]:
        if frame[0] != "mqtt.takeover":
            return []  # route versions: b applies them (nothing to check here)
        if answered:
            handed = b._on_takeover(frame[1:])
            if inspect.isawaitable(handed):
                await handed
        paused.set()
        await asyncio.Event().wait()
        return []

    c.cluster._live = {"b": ("127.0.0.1", 1)}  # type: ignore[union-attr]
    c.cluster.request_all = request_all  # type: ignore[method-assign, union-attr]
    return paused


@pytest.mark.parametrize("answered", [True, False], ids=["after b let go", "before b knew"])
async def test_a_session_whose_taker_dies_during_the_takeover_is_adopted(answered) -> None:
    """A client reconnects to c without a clean start while b holds its session; c dies (or
    is paused past the failure detector) in the middle of the takeover.  b, adopting c's
    sessions, must hold it: when b had let go, the record still named b, so b adopted
    nothing, c's routes were cleared, and the session was on no node — what was published
    meanwhile matched no route and was acknowledged without being stored (the pause test
    lost 174 messages so under load).  When b had not heard of it, b keeps it and its record
    names b again."""
    meta = MemoryMetaStore()
    b, c = broker("b", meta), broker("c", meta)
    await persistent_session(b)
    assert await b.restore_sessions() == 1
    paused = pause_at_takeover(c, b, answered=answered)
    fetching = asyncio.create_task(c.fetch_session(*KEY))
    await paused.wait()
    assert (KEY in b.sessions) is not answered
    fetching.cancel()  # c is gone
    await asyncio.gather(fetching, return_exceptions=True)
    assert await b.adopt_sessions("c", c.process)
    assert KEY in b.sessions and await b.owns_session(*KEY)
    assert [sub.topic_filter for sub in b.sessions[KEY].subscriptions.values()] == ["own/#"]


async def test_an_adopted_sessions_routes_are_out_before_its_record_names_the_adopter() -> None:
    """c was declared dead while paused, and resumes holding the session b adopts: c lets it
    go once it finds the record b's, and its route goes.  b's route must be out before: the
    record written first (b's route write slow, the meta store under load), no node routed
    the session for a moment, and a publisher window was acknowledged without being stored
    (the pause test lost 20 messages so)."""
    meta = MemoryMetaStore()
    c, b = broker("c", meta), broker("b", meta)
    await persistent_session(c)
    await b.cluster.start(0, b.router)
    holders_at_push: list[str | None] = []

    async def request_all(frame: list[Any], timeout: float) -> list[Any]:
        if frame[0] == "route":  # b's route version going out to its peers
            holders_at_push.append(await b.session_holder(*KEY))
        return []

    b.cluster._live = {"c": ("127.0.0.1", 1)}  # c is alive to b again by the time it pushes
    b.cluster.request_all = request_all  # type: ignore[method-assign]
    try:
        assert await b.restore_sessions("c", c.process) == 1
    finally:
        b.cluster._live = {}
        await b.cluster.stop()
    assert holders_at_push and holders_at_push[0] == "c"
    assert await b.owns_session(*KEY)
