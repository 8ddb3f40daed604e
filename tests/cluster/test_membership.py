"""Brokers as separate processes find each other by gossip (SWIM) and see each other go."""

from __future__ import annotations

import time

import pytest

from tests.fixtures.broker_process import start_broker
from tests.fixtures.cluster import cluster_size, http, wait_for

TOKEN = "cluster"


def get(url: str) -> dict:
    return http("GET", url, token=TOKEN)


@pytest.fixture
def two_brokers(tmp_path):
    first = start_broker(tmp_path / "a", "--admin-token", TOKEN, "--node-id", "a")
    seed = f"127.0.0.1:{first.ports['gossip']}"
    second = start_broker(tmp_path / "b", "--admin-token", TOKEN, "--node-id", "b", "--seeds", seed)
    yield first, second
    second.stop()
    first.stop()


def test_brokers_join_by_seed_and_report_each_other(two_brokers):
    first, second = two_brokers
    wait_for(lambda: cluster_size(first) == 2 and cluster_size(second) == 2, timeout=10)
    nodes = {n["node_id"]: n for n in get(f"{first.http}/api/v1/cluster/nodes")["data"]}
    # Separate data dirs, so separate node tables: "b" is known to "a" through gossip alone.
    assert nodes["b"]["status"] == "up" and nodes["b"]["gossip"] == "alive"
    assert nodes["a"]["self"] is True


def test_a_stopped_broker_leaves_and_a_killed_one_is_detected(two_brokers, tmp_path):
    first, second = two_brokers
    wait_for(lambda: cluster_size(first) == 2, timeout=10)
    second.stop()  # SIGTERM: graceful leave, gone at once
    wait_for(lambda: cluster_size(first) == 1, timeout=3)

    third = start_broker(
        tmp_path / "c", "--admin-token", TOKEN, "--node-id", "c",
        "--seeds", f"127.0.0.1:{first.ports['gossip']}",
    )  # fmt: skip
    wait_for(lambda: cluster_size(first) == 2, timeout=10)
    third.proc.kill()  # SIGKILL: no goodbye; SWIM suspects it, then declares it dead
    third.proc.wait(10)
    started = time.monotonic()
    wait_for(lambda: cluster_size(first) == 1, timeout=12)  # bound for N=2: 4.8 s + probes
    detected_after = time.monotonic() - started
    nodes = {n["node_id"]: n for n in get(f"{first.http}/api/v1/cluster/nodes")["data"]}
    assert nodes["c"]["gossip"] == "dead" and nodes["c"]["status"] == "down"
    assert detected_after < 12
