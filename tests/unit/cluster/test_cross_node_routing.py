"""ClusterRouting between brokers in one process: real links on loopback, one shared
in-memory meta store, Routers with a recording memory destination type."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

import flowmq_metrics as metrics
from flowmq_broker.cluster import ClusterRouting, NotStored, decode_message, encode_message
from flowmq_broker.routing import Binding, DestinationType, Router
from flowmq_cluster.link import Links
from flowmq_core.message import Message
from flowmq_meta import keys
from flowmq_meta.memory import MemoryMetaStore
from tests.fixtures.waiting import wait_until_async


class Recorder(DestinationType):
    durable = False

    def __init__(self, name: str, one_member: bool = False) -> None:
        self.name = name
        self.one_member = one_member
        self.got: list[tuple[str, bytes]] = []
        self.arrived = asyncio.Event()
        self.stored: asyncio.Future | None = None  # returned as if an offline session stored it

    def accept(self, binding: Binding, message: Message) -> asyncio.Future | None:
        self.got.append((binding.name, message.payload))
        self.arrived.set()
        return self.stored


class Node:
    def __init__(self, node_id: str, meta: MemoryMetaStore) -> None:
        self.cluster = ClusterRouting(node_id, meta)
        self.router = Router(forwarder=self.cluster)
        self.plain = Recorder("subscription")
        self.shared = Recorder("shared", one_member=True)
        self.router.register_type(self.plain)
        self.router.register_type(self.shared)
        self.port = 0

    def subscribe(self, client: str, topic_filter: str) -> asyncio.Future | None:
        """Subscribe; returns what a SUBACK would wait for."""
        self.router.bind(Binding("subscription", "default", client), topic_filter)
        self.cluster.local_added("default", topic_filter)
        return self.cluster.routes_published()

    def join_group(self, group: str, topic_filter: str) -> asyncio.Future | None:
        name = f"$share/{group}/{topic_filter}"
        self.router.bind(Binding("shared", "default", name), topic_filter)
        self.cluster.local_added("default", name)
        return self.cluster.routes_published()


@pytest.fixture
async def nodes():
    meta = MemoryMetaStore()
    a, b, c = Node("a", meta), Node("b", meta), Node("c", meta)
    for node in (a, b, c):
        node.port = await node.cluster.start(0, node.router)
    everyone = [("a", "127.0.0.1", a.port), ("b", "127.0.0.1", b.port), ("c", "127.0.0.1", c.port)]
    for node in (a, b, c):
        node.cluster.set_members(everyone)
    yield a, b, c, meta
    for node in (a, b, c):
        await node.cluster.stop()


async def routed(*waiters: asyncio.Future | None) -> None:
    assert all(w is not None for w in waiters), "a route change with peers must be awaited"
    await asyncio.wait_for(asyncio.gather(*waiters), 5)


def publish(node: Node, topic: str, payload: bytes) -> None:
    node.router.dispatch("default", Message(topic, payload))


async def test_a_message_is_forwarded_once_per_node_with_subscribers(nodes):
    a, b, c, _ = nodes
    first = b.subscribe("b1", "x/#")
    second = b.subscribe("b2", "x/+")  # a second subscriber on b: still one forward to b
    await routed(first, second)
    # SUBACK waits for this: a and c have applied b's routes by now, no polling needed.
    assert a.cluster.nodes_matching("default", "x/1") == {"b"}
    before = metrics.broker_messages_forwarded_count.value("default")
    publish(a, "x/1", b"one")
    await asyncio.wait_for(b.plain.arrived.wait(), 5)
    assert sorted(b.plain.got) == [("b1", b"one"), ("b2", b"one")]
    assert metrics.broker_messages_forwarded_count.value("default") == before + 1
    assert c.plain.got == [] and a.plain.got == []


async def test_a_qos1_forward_is_confirmed_once_the_receiver_stored_it(nodes):
    a, b, _, _ = nodes
    b.plain.stored = asyncio.get_running_loop().create_future()
    await routed(b.subscribe("b1", "s/#"))
    _, pending = a.router.dispatch("default", Message("s/1", b"x", qos=1))
    assert len(pending) == 1  # the publisher's acknowledgement waits for b
    await asyncio.wait_for(b.plain.arrived.wait(), 5)
    await asyncio.sleep(0.1)  # asserting an absence: give a wrong early answer time to come
    assert not pending[0].done()
    b.plain.stored.set_result(None)
    await asyncio.wait_for(pending[0], 5)


async def test_a_forward_the_receiver_could_not_store_fails_the_publish(nodes):
    a, b, _, _ = nodes
    b.plain.stored = asyncio.get_running_loop().create_future()
    b.plain.stored.set_exception(OSError("disk full"))
    await routed(b.subscribe("b1", "f/#"))
    _, pending = a.router.dispatch("default", Message("f/1", b"x", qos=1))
    with pytest.raises(NotStored):
        await asyncio.wait_for(pending[0], 5)


async def test_a_qos0_forward_is_not_waited_for(nodes):
    a, b, _, _ = nodes
    await routed(b.subscribe("b1", "z/#"))
    _, pending = a.router.dispatch("default", Message("z/1", b"x"))
    assert pending == []


async def shared_deliveries(members: list[Node], count: int) -> list[bytes]:
    """Wait until ``members`` got ``count`` shared messages between them; their payloads."""
    deadline = asyncio.get_running_loop().time() + 5
    while sum(len(m.shared.got) for m in members) < count:
        assert asyncio.get_running_loop().time() < deadline, "messages missing"
        await asyncio.sleep(0.01)
    return sorted(payload for m in members for _, payload in m.shared.got)


async def test_a_shared_group_gets_each_message_on_one_node(nodes):
    a, b, c, _ = nodes
    await routed(b.join_group("g", "jobs/#"), c.join_group("g", "jobs/#"))
    for i in range(20):
        publish(a, "jobs/run", str(i).encode())
    assert await shared_deliveries([b, c], 20) == sorted(str(i).encode() for i in range(20))
    assert b.shared.got and c.shared.got  # spread over both nodes


async def test_a_local_member_shares_with_remote_members(nodes):
    a, b, _, _ = nodes
    await routed(a.join_group("g", "jobs/#"), b.join_group("g", "jobs/#"))
    for i in range(10):
        publish(a, "jobs/run", str(i).encode())
    assert await shared_deliveries([a, b], 10) == sorted(str(i).encode() for i in range(10))
    assert a.shared.got and b.shared.got


async def test_a_missed_route_update_is_repaired_and_counted(nodes):
    a, b, _, _ = nodes
    a.cluster.requests["route"] = lambda args: None  # a hears route updates but ignores them
    missed_before = metrics.anti_entropy_missing_events_detected_count.value()
    await routed(b.subscribe("b1", "late/#"))
    assert a.cluster.nodes_matching("default", "late/x") == set()
    await a.cluster.anti_entropy()
    assert a.cluster.nodes_matching("default", "late/x") == {"b"}
    assert metrics.anti_entropy_missing_events_detected_count.value() >= missed_before + 1


async def test_a_gap_in_route_versions_makes_the_peer_reload(nodes):
    a, b, _, _ = nodes
    await routed(b.subscribe("b1", "one/#"))
    b.cluster._seq += 5  # as if five updates had been lost on the way
    await routed(b.subscribe("b2", "two/#"))  # a answers after reading b's whole route set
    assert a.cluster.nodes_matching("default", "one/x") == {"b"}
    assert a.cluster.nodes_matching("default", "two/x") == {"b"}


async def test_unsubscribing_the_last_subscriber_removes_the_route(nodes):
    a, b, _, _ = nodes
    await routed(b.subscribe("b1", "u/#"))
    assert b.subscribe("b2", "u/#") is None  # the filter was routed here already
    b.cluster.local_removed("default", "u/#")
    assert b.cluster.routes_published() is None  # one subscriber left: nothing changed
    b.cluster.local_removed("default", "u/#")
    await routed(b.cluster.routes_published())
    assert a.cluster.nodes_matching("default", "u/x") == set()


async def test_a_dead_nodes_routes_go_everywhere_and_from_the_meta_store(nodes):
    a, b, c, meta = nodes
    await routed(c.subscribe("c1", "d/#"))
    begin, end = keys.ROUTES.range("c")
    assert await meta.transact(lambda tr: tr.get_range(begin, end))
    await c.cluster.links.stop()  # c dies without a word
    a.cluster.node_gone("c")
    b.cluster.node_gone("c")
    deadline = asyncio.get_running_loop().time() + 5
    while await meta.transact(lambda tr: tr.get_range(begin, end)):  # a, the lowest, clears
        assert asyncio.get_running_loop().time() < deadline, "dead node's routes stayed"
        await asyncio.sleep(0.01)
    # Once cleared from the meta store, the others forget them too (anti-entropy).
    while a.cluster.nodes_matching("default", "d/x") or b.cluster.nodes_matching("default", "d/x"):
        assert asyncio.get_running_loop().time() < deadline, "dead node's routes stayed"
        await asyncio.sleep(0.01)


async def test_a_qos1_message_for_a_dead_nodes_route_is_refused_until_it_is_adopted(nodes):
    """Between a node's death and the adoption of its sessions no node holds them: a QoS 1
    message for them is refused (the publisher sends it again), not acknowledged."""
    a, b, c, meta = nodes
    await routed(c.subscribe("c1", "d/#"))
    await c.cluster.links.stop()  # c dies without a word
    b.cluster.node_gone("c")  # b knows; a, the lowest, has not cleared c's routes yet
    _, confirmed = b.cluster.forward("default", Message("d/x", b"1", qos=1), frozenset())
    with pytest.raises(NotStored):
        await confirmed


async def test_a_dead_node_that_restarted_keeps_refusing_until_it_is_seen_alive(nodes):
    """c was declared dead and restarted: its new process's start token is in the meta store
    (with the routes it keeps while it restores its persistent sessions) before gossip tells
    b that c is alive again.  b's anti-entropy took the new token for "adopted and cleared
    by a survivor" and forgot c's routes: a QoS 1 message for a session c was restoring
    matched no route and was acknowledged without being stored on any node (the chaos run
    at 761f369 lost two publisher windows so, just after c's restart)."""
    a, b, c, meta = nodes
    await routed(c.subscribe("c1", "d/#"))
    await c.cluster.links.stop()  # c is killed
    b.cluster.node_gone("c")  # b knows; a, the lowest, adopts nothing: c restarts first
    restarted = Node("c", meta)
    restarted.port = await restarted.cluster.start(0, restarted.router)  # a new start token
    try:
        await b.cluster.anti_entropy()  # before gossip says c is alive again
        _, confirmed = b.cluster.forward("default", Message("d/x", b"1", qos=1), frozenset())
        assert confirmed is not None, "acknowledged without being stored anywhere"
        with pytest.raises(NotStored):
            await confirmed
        # Seen alive: its routes are read afresh, and forwards go to its new process.
        everyone = [("a", "127.0.0.1", a.port), ("b", "127.0.0.1", b.port)]
        b.cluster.set_members([*everyone, ("c", "127.0.0.1", restarted.port)])
        await b.cluster._reload_soon("c")
        assert b.cluster._applied["c"][0] == restarted.cluster.token
        assert b.cluster.nodes_matching("default", "d/x") == {"c"}
    finally:
        await restarted.cluster.stop()


def test_messages_survive_the_link_encoding():
    message = Message(
        "t/1",
        b"\x00payload",
        qos=1,
        retain=True,
        headers=[("k", b"v"), ("k", b"w")],
        key=b"key",
        content_type="text/plain",
        expiry_ms=123,
        source_protocol="mqtt",
        properties={"origin": "c1", "correlation_data": b"\x01", "subscription_identifier": [3]},
    )
    assert decode_message(encode_message(message)) == message


async def test_frames_sent_in_one_loop_iteration_arrive_in_order():
    got: list[int] = []
    done = asyncio.Event()

    def on_frame(link, frame):
        got.append(frame[1])
        if len(got) == 5000:
            done.set()

    server = Links("server", on_frame)
    client = Links("client", lambda link, frame: None)
    port = await server.start(port=0)
    client.set_peer("server", ("127.0.0.1", port))
    try:
        for i in range(5000):  # queued while connecting, then sent as one batch
            assert client.send("server", ["n", i])
        await asyncio.wait_for(done.wait(), 5)
        assert got == list(range(5000))
    finally:
        await client.stop()
        await server.stop()


async def test_a_message_can_be_handed_to_a_shared_group_on_another_node(nodes):
    a, b, _, _ = nodes
    await routed(b.join_group("g", "jobs/#"))
    assert not a.cluster.forward_to_group("default", Message("jobs/1", b"x"), "$share/h/jobs/#")
    assert a.cluster.forward_to_group("default", Message("jobs/1", b"x"), "$share/g/jobs/#")
    await asyncio.wait_for(b.shared.arrived.wait(), 5)
    assert b.shared.got == [("$share/g/jobs/#", b"x")]
    assert b.plain.got == []


async def test_a_forward_whose_receiver_goes_before_confirming_is_refused(nodes):
    """The receiver dies with the message unconfirmed: the publisher is refused (and sends it
    again), never acknowledged on a guess."""
    a, b, _, _ = nodes
    b.plain.stored = asyncio.get_running_loop().create_future()  # b holds its answer back
    await routed(b.subscribe("b1", "g/#"))
    _, pending = a.router.dispatch("default", Message("g/1", b"x", qos=1))
    await asyncio.wait_for(b.plain.arrived.wait(), 5)
    await b.cluster.links.stop()  # b dies: a's link to it is lost
    with pytest.raises(NotStored):
        await asyncio.wait_for(pending[0], 5)


async def test_frames_queued_for_a_peer_that_restarted_are_dropped_not_delivered():
    """A link carries no frame across a peer's restart: what was queued while the peer was
    down was for the process that died; the new one never sees it, and the sender is told."""
    got: list[tuple[str, Any]] = []
    first = Links("server", lambda link, frame: got.append(("first", frame)))
    port = await first.start(port=0)
    client = Links("client", lambda link, frame: None)
    lost: list[str] = []
    client.on_peer_lost = lost.append
    client.set_peer("server", ("127.0.0.1", port))
    second = Links("server", lambda link, frame: got.append(("second", frame)))
    try:
        client.send("server", ["n", 1])
        await wait_until_async(lambda: got == [("first", ["n", 1])])
        await first.stop()  # the peer's process ends
        await wait_until_async(lambda: lost == ["server"])
        client.send("server", ["n", 2])  # queued for it while it is down
        await second.start(port=port)  # a new process at the same address
        await wait_until_async(lambda: lost == ["server", "server"])  # the queued frame is dropped
        client.send("server", ["n", 3])
        await wait_until_async(lambda: ("second", ["n", 3]) in got)
        assert got == [("first", ["n", 1]), ("second", ["n", 3])]
    finally:
        await client.stop()
        await second.stop()


async def test_a_qos1_forward_matching_no_subscriber_at_the_receiver_is_refused(nodes):
    """Routes the receiver no longer holds (it restarted, or the subscriber just left): not
    confirmed as if delivered; the publisher is refused and sends it again."""
    a, b, _, _ = nodes
    await routed(b.subscribe("b1", "r/#"))
    b.router.unbind(Binding("subscription", "default", "b1"), "r/#")  # a still routes to b
    _, pending = a.router.dispatch("default", Message("r/1", b"x", qos=1))
    with pytest.raises(NotStored):
        await asyncio.wait_for(pending[0], 5)


async def test_a_node_declared_dead_meanwhile_finds_out_at_its_next_route_write(nodes):
    """A survivor cleared b's routes (b was declared dead while paused, its sessions adopted):
    b's next route write must not put its old routes back under its old start token, which
    would hide the fence; b ends the sessions it lost (on_fenced) and rejoins under a new
    token, with the new route."""
    a, b, _, meta = nodes
    fenced: list[str] = []
    b.cluster.on_fenced.append(lambda: fenced.append("b"))
    old_token = b.cluster.token
    assert await a.cluster._clear_node("b", old_token)
    await routed(b.subscribe("b1", "fence/#"))
    assert fenced == ["b"] and b.cluster.token != old_token
    raw = await meta.transact(lambda tr: tr.get(keys.ROUTE_VERSIONS.pack("b")))
    assert raw is not None and old_token not in raw.decode()
    await wait_until_async(lambda: a.cluster.nodes_matching("default", "fence/1") == {"b"})


def watch_routes(node: Node, topic: str) -> list[set[str]]:
    """The nodes ``topic`` is routed to from ``node`` after each change of its remote routes,
    from now on."""
    seen: list[set[str]] = []
    changed = node.router.remote_routes_changed

    def record() -> None:
        changed()
        seen.append(node.cluster.nodes_matching("default", topic))

    node.router.remote_routes_changed = record  # type: ignore[method-assign]
    return seen


async def test_a_session_handed_over_stays_routed_where_the_taker_is_not_seen_alive(nodes):
    """b hands a persistent session over to c (its client reconnected to c), and a has not
    seen c alive since c was declared dead (a pause; gossip has not told a yet), so c's
    routes are not a's to follow.  b's route must stay until a read c's routes, held as a
    dead node's (refusing): removed at once, the filter was routed nowhere from a, and a QoS
    1 message published there matched nothing and was acknowledged without being stored."""
    a, b, c, meta = nodes
    await routed(b.subscribe("s1", "h/#"))
    a.cluster.set_members([("a", "127.0.0.1", a.port), ("b", "127.0.0.1", b.port)])
    assert await a.cluster._clear_node("c", c.cluster.token)  # as a, the lowest, does
    await routed(c.subscribe("s1", "h/#"))  # the taker's route (it rejoins), before it asks
    assert a.cluster.nodes_matching("default", "h/1") == {"b"}
    seen = watch_routes(a, "h/1")
    b.router.unbind(Binding("subscription", "default", "s1"), "h/#")
    b.cluster.hand_over("default", "h/#", "c")
    await wait_until_async(
        lambda: "b" not in a.cluster.nodes_matching("default", "h/1"), 5, what="b's route gone"
    )
    assert seen and all(seen), f"h/1 was routed nowhere from a for a moment: {seen}"
    _, pending = a.router.dispatch("default", Message("h/1", b"x", qos=1))
    assert pending, "acknowledged without being stored anywhere"
    with pytest.raises(NotStored):  # refused until a sees c alive
        await asyncio.wait_for(pending[0], 5)
    a.cluster.set_members([("a", "127.0.0.1", a.port), ("b", "127.0.0.1", b.port),
                           ("c", "127.0.0.1", c.port)])  # fmt: skip
    await a.cluster._reload_soon("c")
    _, pending = a.router.dispatch("default", Message("h/1", b"y", qos=1))
    await asyncio.wait_for(pending[0], 5)
    assert (("s1", b"y")) in c.plain.got


async def test_a_survivors_routes_are_read_before_the_dead_nodes_are_forgotten(nodes):
    """c died; a adopted its session (its route for it written, the push to b not answered
    in time) and cleared c's routes.  b's anti-entropy must read a's routes before it
    forgets c's: the other way round, the filter was routed nowhere from b while the read
    took, and a QoS 1 message published there then was acknowledged without being stored."""
    a, b, c, meta = nodes
    await routed(c.subscribe("c1", "d/#"))
    await c.cluster.links.stop()  # c dies without a word
    b.cluster.node_gone("c")  # refusing c's routes until they are cleared
    token, seq = a.cluster.token, a.cluster._seq + 1
    adopted = json.dumps({"token": token, "seq": seq}).encode()

    def adopt(tr: Any) -> None:  # a's route write for the adopted session; b missed the push
        tr.set(keys.ROUTES.pack("a", "default", "d/#"), b"")
        tr.set(keys.ROUTE_VERSIONS.pack("a"), adopted)

    await meta.transact(adopt)
    assert await a.cluster._clear_node("c", c.cluster.token)
    seen = watch_routes(b, "d/x")
    await b.cluster.anti_entropy()
    assert seen and all(seen), f"d/x was routed nowhere from b for a moment: {seen}"
    assert b.cluster.nodes_matching("default", "d/x") == {"a"}


async def test_a_live_nodes_routes_cleared_by_a_survivor_stay_until_it_rejoins(nodes):
    """a took c for dead (c was paused) and cleared c's routes just after c resumed and took
    a session back.  b, reading c's routes afresh (a hand-over to c asks it to), must keep
    those it holds until c announces its routes again: forgotten, the session's filter was
    routed nowhere from b until c's rejoin, and the pause test lost 3 messages so."""
    a, b, c, meta = nodes
    await routed(c.subscribe("c1", "p/#"))
    assert await a.cluster._clear_node("c", c.cluster.token)  # c alive to b all along
    seen = watch_routes(b, "p/1")
    await b.cluster.routes_read("c")
    await b.cluster.anti_entropy()
    assert all(seen) and b.cluster.nodes_matching("default", "p/1") == {"c"}
    await c.cluster.anti_entropy()  # c finds its routes cleared and announces them afresh
    await b.cluster._reload_soon("c")
    assert b.cluster._applied["c"][0] == c.cluster.token
    assert all(seen) and b.cluster.nodes_matching("default", "p/1") == {"c"}


async def test_routes_read_while_a_reload_is_under_way_are_read_again(nodes):
    """A peer asked to read a node's routes (before a session is let go to that node) must
    apply a read that began after it was asked: the reload already under way read what was
    there before, and answered from it, the peer routed the session's topics nowhere once
    the holder let go (issue #11: acknowledged, not stored)."""
    _, b, c, meta = nodes
    reads: list[str] = []
    release = asyncio.Event()
    read_routes = c.cluster._read_routes

    async def slow_first_read(node: str) -> Any:
        found = await read_routes(node)  # read now…
        reads.append(node)
        if len(reads) == 1:
            await release.wait()  # …and slow to come back
        return found

    c.cluster._read_routes = slow_first_read
    under_way = c.cluster._reload_soon("b")
    await wait_until_async(lambda: reads == ["b"], 5)
    # b's session's route, written after that read began (its push did not reach c).
    seq = b.cluster._seq + 1
    await meta.transact(lambda tr: (
        tr.set(keys.ROUTES.pack("b", "default", "moved/#"), b""),
        tr.set(keys.ROUTE_VERSIONS.pack("b"),
               json.dumps({"token": b.cluster.token, "seq": seq}).encode()),
    ))  # fmt: skip
    asked = asyncio.ensure_future(c.cluster.routes_read("b"))
    # It asks for a reload while the first is under way: a second read is waited for.
    await wait_until_async(lambda: len(c.cluster._reloading.get("b", ())) == 2, 5)
    release.set()
    assert await asyncio.wait_for(asked, 5)
    assert c.cluster.nodes_matching("default", "moved/1") == {"b"}
    await under_way


async def test_a_reload_asked_for_first_is_done_without_waiting_for_later_ones(nodes):
    """Reads asked for while one is under way are served by one later read, and whoever
    asked before waits for no more than the read under way."""
    _, _, c, _ = nodes
    reads: list[asyncio.Event] = []
    read_routes = c.cluster._read_routes

    async def gated_read(node: str) -> Any:
        found = await read_routes(node)
        reads.append(gate := asyncio.Event())
        await gate.wait()
        return found

    c.cluster._read_routes = gated_read
    first = c.cluster._reload_soon("b")
    await wait_until_async(lambda: len(reads) == 1, 5)
    second, third = c.cluster._reload_soon("b"), c.cluster._reload_soon("b")
    assert second is third and second is not first  # one later read for both
    reads[0].set()
    await asyncio.wait_for(first, 5)
    await wait_until_async(lambda: len(reads) == 2, 5)  # the later read began…
    assert not second.done()  # …and they wait for it
    reads[1].set()
    await asyncio.wait_for(second, 5)
    assert len(reads) == 2
