"""SWIM membership: join, failure detection, leave, refutation, rejoin."""

from __future__ import annotations

import math
import time

import pytest

from flowmq_cluster import Gossip, GossipConfig, Member, Status


def test_default_parameters_follow_memberlist_lan():
    cfg = GossipConfig()
    assert (cfg.gossip_interval, cfg.gossip_nodes) == (0.2, 3)
    assert (cfg.probe_interval, cfg.probe_timeout, cfg.indirect_checks) == (1.0, 0.5, 3)
    assert (cfg.suspicion_mult, cfg.push_pull_interval) == (4, 30.0)
    assert cfg.suspicion_timeout(3) == 4.0  # floor of 1 on log10(N+1), as memberlist
    assert cfg.suspicion_timeout(99) == pytest.approx(8.0)
    assert cfg.retransmit_limit(3) == 4 and cfg.retransmit_limit(100) == 12
    # crash of one node in a 3-node cluster: 3 s first probe + 1 s probe + 4 s suspicion
    # + 0.8 s gossip
    assert cfg.detection_bound(3) == pytest.approx(8.8)
    with pytest.raises(ValueError):
        GossipConfig(probe_timeout=2.0)
    with pytest.raises(ValueError):
        Gossip("x", meta={"blob": "x" * 2000})
    fast = GossipConfig(probe_interval=0.1, probe_timeout=0.05)
    assert math.isclose(fast.suspicion_timeout(4), 0.4)


async def test_five_nodes_converge_from_one_seed(harness):
    nodes = await harness.cluster(5)
    for g in nodes:
        assert g.cluster_size == 5
        metas = {m.node_id: m.meta for m in g.members()}
        assert metas == {f"n{i}": {"node": f"n{i}"} for i in range(5)}
        addrs = {m.node_id: m.addr for m in g.members()}
        assert addrs == {h.node_id: h.address for h in nodes}
    # every node reported the four others joining
    for g in nodes:
        joined = {n for obs, n, old, new in harness.changes if obs == g.node_id and old is None}
        assert joined == {h.node_id for h in nodes} - {g.node_id}


async def test_stopped_node_is_suspected_then_dead_within_bound(harness):
    nodes = await harness.cluster(4)
    victim, survivors = nodes[3], nodes[:3]
    await victim.stop(leave=False)
    bound = harness.config.detection_bound(4)
    elapsed = await harness.wait(
        lambda: all(harness.status(g, "n3") == Status.DEAD for g in survivors), bound
    )
    assert elapsed <= bound
    transitions = [(old, new) for obs, n, old, new in harness.changes if n == "n3" and obs != "n3"]
    assert (Status.ALIVE, Status.SUSPECT) in transitions
    for g in survivors:
        assert "n3" not in {m.node_id for m in g.members()}
        assert g.cluster_size == 3
        assert any(
            n == "n3" and new == Status.DEAD
            for obs, n, _, new in harness.changes
            if obs == g.node_id
        )


async def test_left_node_is_removed_promptly(harness):
    nodes = await harness.cluster(4)
    leaver, rest = nodes[1], [nodes[0], *nodes[2:]]
    start = time.monotonic()
    await leaver.stop(leave=True)
    await harness.wait(lambda: all(harness.status(g, "n1") == Status.LEFT for g in rest), 1.0)
    # prompt: well before the failure detector could have declared it dead
    assert time.monotonic() - start < harness.config.suspicion_timeout(4)
    assert not [
        c for c in harness.changes if c[1] == "n1" and c[3] in (Status.SUSPECT, Status.DEAD)
    ]
    for g in rest:
        assert {m.node_id for m in g.members()} == {"n0", "n2", "n3"}


async def test_suspected_live_node_refutes_and_stays_alive(harness):
    nodes = await harness.cluster(3)
    a, b, c = nodes
    blocked = True

    def drop_probes_to_c(addr, msg_type):
        return blocked and addr == c.address and msg_type == "ping"

    a.drop = drop_probes_to_c
    b.drop = drop_probes_to_c
    # somebody suspects c, and c answers with a higher incarnation that clears it
    await harness.wait(
        lambda: any(
            n == "n2" and (old, new) == (Status.SUSPECT, Status.ALIVE)
            for _, n, old, new in harness.changes
        ),
        5,
    )
    assert c.incarnation >= 1
    blocked = False
    await harness.wait(lambda: all(harness.status(g, "n2") == Status.ALIVE for g in (a, b)), 2)
    refuted = c.incarnation
    for g in (a, b):
        assert g.member("n2").incarnation == refuted
    assert not [ch for ch in harness.changes if ch[1] == "n2" and ch[3] == Status.DEAD]
    assert harness.converged(nodes)


async def test_restarted_node_rejoins_with_same_id_and_new_port(harness):
    nodes = await harness.cluster(3)
    a, b, old = nodes
    old_addr = old.address
    await old.stop(leave=False)
    await harness.wait(
        lambda: all(harness.status(g, "n2") == Status.DEAD for g in (a, b)),
        harness.config.detection_bound(3),
    )
    new = await harness.start("n2", seeds=[f"127.0.0.1:{b.address[1]}"])
    new_addr = new.address
    await harness.wait(lambda: harness.converged([a, b, new]), 5)
    for g in (a, b):
        assert g.member("n2").addr == new_addr
    if new_addr != old_addr:
        assert old_addr not in {m.addr for m in a.members()}
    assert any(
        n == "n2" and (old_s, new_s) == (Status.DEAD, Status.ALIVE)
        for _, n, old_s, new_s in harness.changes
    )


async def test_node_without_reachable_seed_keeps_retrying(harness):
    b = await harness.start("b", seeds=[("127.0.0.1", 9)])  # nobody listens there
    assert b.members()[0].node_id == "b" and b.cluster_size == 1
    a = await harness.start("a", seeds=[b.address])
    await harness.wait(lambda: harness.converged([a, b]), 3)


async def test_push_pull_sends_large_state_in_datagrams_under_the_cap(harness):
    a = await harness.start("a")
    for i in range(40):  # a big table: about 40 * 120 bytes of state
        fake = Member(f"ghost-{i:02d}", ("127.0.0.1", 9), 0, Status.ALIVE, {"pad": "x" * 60})
        a._members[fake.node_id] = fake
    sizes: list[int] = []
    real = a._transport.sendto
    a._transport.sendto = lambda data, addr=None: (sizes.append(len(data)), real(data, addr))
    b = await harness.start("b", seeds=[a.address])
    await harness.wait(lambda: len(b.all_members()) == 42, 2)
    assert max(sizes) <= a.config.max_datagram
    assert sum(1 for n in sizes if n > 1000) >= 3  # the state really was split


async def test_metadata_update_reaches_every_member(harness):
    nodes = await harness.cluster(3)
    nodes[0].update_meta({"roles": ["mqtt"], "mqtt_port": 1883})
    await harness.wait(
        lambda: all(g.member("n0").meta == {"roles": ["mqtt"], "mqtt_port": 1883} for g in nodes),
        2,
    )
    assert all(g.member("n0").incarnation == nodes[0].incarnation == 1 for g in nodes[1:])


async def test_join_after_start_merges_two_clusters(harness):
    a = await harness.start("a")
    b = await harness.start("b", seeds=[a.address])
    c = await harness.start("c")
    d = await harness.start("d", seeds=[c.address])
    await harness.wait(lambda: harness.converged([a, b]) and harness.converged([c, d]), 3)
    await d.join([b.address])
    await harness.wait(lambda: harness.converged([a, b, c, d]), 3)
