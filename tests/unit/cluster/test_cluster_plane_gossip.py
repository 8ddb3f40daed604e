"""The closed cluster plane on gossip (DESIGN.md §12): every datagram carries a timestamp and
an HMAC-SHA256; one that does not verify, or is out of the time window, is dropped before
its JSON is read, counted in cluster_auth_failures_count{plane="gossip"} and logged once per
source address.  Real UDP on 127.0.0.1; forged datagrams come from a raw socket."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from typing import Any

import pytest

import flowmq_metrics as metrics
from flowmq_cluster import ClusterSecret, Gossip, GossipConfig
from flowmq_cluster.auth import AuthFailure, FailureLog, GossipSeal
from flowmq_cluster.link import Links

SECRET = ClusterSecret("unit-test-cluster-secret-one")
OTHER = ClusterSecret("unit-test-cluster-secret-two")


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def announce(node_id: str, port: int, meta: dict[str, Any] | None = None) -> bytes:
    """A well-formed push-pull datagram saying ``node_id`` is alive at 127.0.0.1:``port``."""
    state = {"k": "a", "n": node_id, "i": 1, "h": "127.0.0.1", "p": port, "m": meta or {}}
    return dumps({"t": "pp", "f": node_id, "r": 0, "s": [state]})


@pytest.fixture
def raw():
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.setblocking(False)
    yield sock
    sock.close()


def gossip_failures() -> float:
    return metrics.cluster_auth_failures_count.value("gossip")


def test_a_sealed_datagram_opens_only_intact_fresh_and_under_the_same_secret():
    seal = GossipSeal(SECRET)
    body = b'{"t":"ping","q":1,"to":"a","f":"b"}'
    now = 1_700_000_000_000
    packet = seal.seal(body, now_ms=now)
    assert len(packet) == len(body) + seal.overhead
    assert seal.open(packet, now_ms=now) == body
    assert seal.open(packet, now_ms=now + 29_000) == body  # within the 30 s window
    forged = {
        "unsealed": body,
        "empty": b"",
        "body changed": packet[:-1] + bytes([packet[-1] ^ 1]),
        "timestamp changed": packet[:8] + bytes([packet[8] ^ 1]) + packet[9:],
        "mac changed": packet[:20] + bytes([packet[20] ^ 1]) + packet[21:],
        "other secret": GossipSeal(OTHER).seal(body, now_ms=now),
    }
    for what, packet_ in forged.items():
        with pytest.raises(AuthFailure):
            seal.open(packet_, now_ms=now)
            pytest.fail(f"{what} was accepted")
    for skew in (-31_000, 31_000):  # replayed late, or stamped ahead
        with pytest.raises(AuthFailure, match="off our clock"):
            seal.open(packet, now_ms=now + skew)


def test_the_secret_is_long_enough_and_never_shown():
    with pytest.raises(ValueError, match="at least 16 bytes"):
        ClusterSecret("short")
    text = "a-long-enough-cluster-secret"
    secret = ClusterSecret(text)
    assert text not in repr(secret) and secret.gossip_key.hex()[:8] not in repr(secret)


def test_an_open_plane_may_only_bind_loopback():
    for host in ("0.0.0.0", "10.1.2.3", "::"):
        with pytest.raises(ValueError, match="needs a secret"):
            Gossip("a", bind=(host, 0))
        with pytest.raises(ValueError, match="needs a secret"):
            Links("a", lambda link, frame: None, host=host)
        Gossip("a", bind=(host, 0), secret=SECRET)  # with a secret any address will do
        Links("a", lambda link, frame: None, host=host, secret=SECRET)
    Gossip("a", bind=("127.0.0.1", 0))
    Links("a", lambda link, frame: None, host="::1")


async def test_members_with_another_secret_do_not_join_those_with_the_same_do(harness):
    before = gossip_failures()
    a = await harness.start("a", secret=SECRET)
    b = await harness.start("b", seeds=[a.address], secret=OTHER)
    c = await harness.start("c", seeds=[a.address], secret=SECRET)
    await harness.wait(lambda: harness.converged([a, c]), 5)  # the same secret joins
    # b retries its seed every probe interval while alone; a drops each attempt
    await harness.wait(lambda: a.auth_failures.count >= 3, 5)
    assert a.cluster_size == 2 and c.cluster_size == 2 and b.cluster_size == 1
    assert a.member("b") is None and c.member("b") is None and b.member("a") is None
    assert gossip_failures() - before >= 3


async def test_a_forged_datagram_is_dropped_and_counted_and_changes_nothing(harness, raw):
    a = await harness.start("a", secret=SECRET)
    body = announce("intruder", raw.getsockname()[1])
    before = gossip_failures()
    stale = GossipSeal(SECRET).seal(body, now_ms=time.time_ns() // 1_000_000 - 60_000)
    for packet in (GossipSeal(OTHER).seal(body), body, stale):  # wrong MAC, none, replayed
        raw.sendto(packet, a.address)
    await harness.wait(lambda: a.auth_failures.count == 3, 5)
    assert a.member("intruder") is None and a.cluster_size == 1
    assert gossip_failures() - before == 3
    assert a.bad_messages == 0  # dropped before its JSON was read
    # Positive control: the same datagram sealed with the secret is taken.
    raw.sendto(GossipSeal(SECRET).seal(body), a.address)
    await harness.wait(lambda: a.member("intruder") is not None, 5)
    assert a.auth_failures.count == 3


async def test_failures_are_logged_once_per_source_address(harness, raw, caplog):
    caplog.set_level(logging.WARNING, logger="flowmq.cluster.auth")
    a = await harness.start("a", secret=SECRET)
    forged = GossipSeal(OTHER).seal(announce("intruder", raw.getsockname()[1]))
    for _ in range(20):
        raw.sendto(forged, a.address)
    await harness.wait(lambda: a.auth_failures.count == 20, 5)
    lines = [r for r in caplog.records if "127.0.0.1" in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert "gossip" in lines[0].getMessage()


def test_a_flood_from_many_addresses_is_counted_but_not_logged_without_bound(caplog):
    caplog.set_level(logging.WARNING, logger="flowmq.cluster.auth")
    failures = FailureLog("gossip")
    for i in range(3000):
        failures(f"10.0.{i // 256}.{i % 256}", "a gossip datagram with a bad MAC")
        failures(f"10.0.{i // 256}.{i % 256}", "a gossip datagram with a bad MAC")
    assert failures.count == 6000
    assert 1000 <= len(caplog.records) <= 1100


async def test_sealed_datagrams_stay_within_max_datagram(harness, raw):
    """The seal's header counts in ``max_datagram``: an ack carrying as many piggybacked
    updates as fit, and a full-state reply, both stay within it."""
    quiet = GossipConfig(  # no gossip rounds or probes: the updates stay queued
        gossip_interval=30.0,
        probe_interval=30.0,
        probe_timeout=1.0,
        push_pull_interval=30.0,
        max_datagram=512,
    )
    a = await harness.start("a", secret=SECRET, config=quiet)
    seal = GossipSeal(SECRET)
    for i in range(12):
        raw.sendto(seal.seal(announce(f"member-{i:02}", 9, {"pad": "x" * 60})), a.address)
    await harness.wait(lambda: a.cluster_size == 13, 5)
    loop = asyncio.get_running_loop()
    raw.sendto(seal.seal(dumps({"t": "ping", "q": 7, "to": "a", "f": "raw"})), a.address)
    ack = await asyncio.wait_for(loop.sock_recv(raw, 65536), 5)
    assert 400 < len(ack) <= 512  # filled with updates, and still within the limit
    assert json.loads(seal.open(ack))["t"] == "ack"
    raw.sendto(seal.seal(dumps({"t": "pp", "f": "raw", "r": 1, "s": []})), a.address)
    seen: set[str] = set()
    while len(seen) < 13:
        packet = await asyncio.wait_for(loop.sock_recv(raw, 65536), 5)
        assert len(packet) <= 512
        seen.update(state["n"] for state in json.loads(seal.open(packet))["s"])
