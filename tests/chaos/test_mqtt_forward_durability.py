"""A QoS 1 message PUBACKed to a publisher on one node reaches a persistent subscriber on
another node although that node is SIGKILLed and restarted (issue #11: one message lost per
round with a window of 1, the whole window of 20 with 20)."""

from __future__ import annotations

import threading
import time

import pytest

from benchmarks import chaos
from tests.fixtures.waiting import wait_until

pytestmark = pytest.mark.timeout(180)


@pytest.mark.parametrize("level", [4, 5], ids=["3.1.1", "5"])
def test_acknowledged_messages_reach_a_subscriber_whose_node_restarts(tmp_path, level) -> None:
    cluster = chaos.ChaosCluster(tmp_path, chaos.FileObjects(tmp_path))
    stop_publishing, stop_receiving = threading.Event(), threading.Event()
    flow = chaos.Flow()
    try:
        for name in ("n1", "n2"):
            cluster.start(name)
        publishing, receiving = cluster.nodes["n1"], cluster.nodes["n2"]
        subscriber = chaos.MqttSubscriberLoad(receiving, flow, stop_receiving, "focus/#", level)
        publisher = chaos.MqttPublisherLoad(publishing, flow, stop_publishing, "focus/x", level)
        publisher.window = 20
        subscriber.start()
        wait_until(lambda: subscriber.subscribed, 15, what="subscribed")
        publisher.start()
        for _ in range(3):
            acked = len(flow.acked)
            wait_until(lambda n=acked: len(flow.acked) > n + 40, 30, what="acks")
            cluster.kill("n2")
            time.sleep(1.0)
            cluster.start("n2")
        acked = len(flow.acked)
        wait_until(lambda: len(flow.acked) > acked + 40, 30, what="acks after the kills")
        stop_publishing.set()
        publisher.join(60)
        deadline = time.monotonic() + 30
        while flow.acked - set(flow.received) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        stop_publishing.set()
        stop_receiving.set()
        cluster.stop()
        (tmp_path / "brokers.log").write_text(cluster.output())
    missing = sorted(flow.acked - set(flow.received))
    assert not missing, f"{len(missing)} of {len(flow.acked)} acknowledged never arrived"
