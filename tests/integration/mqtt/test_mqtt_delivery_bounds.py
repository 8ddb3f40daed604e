"""Two bounds of the MQTT delivery path (DESIGN.md §13):

- ``mqtt_max_inflight_bytes``: the payload bytes of QoS 1/2 messages in flight to one
  subscriber are bounded besides its receive maximum; the rest wait in its session and go out
  as acknowledgements free room, in order;
- ``mqtt_max_held_packets``: a client may send only so many packets while its CONNECT waits
  (here: the password check); past it the connection is closed and the refusal counted."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from flowmq_wire.mqtt.packets import (
    Connack,
    Connect,
    Pingreq,
    Pingresp,
    Puback,
    Publish,
    SubscriptionOptions,
)
from tests.fixtures.broker_process import BrokerProcess, start_broker
from tests.fixtures.cli import flowmq_user

from .conftest import ROLES, RawClient, scrape

INFLIGHT_BYTES = 2500
HELD_PACKETS = 20
PAYLOAD = b"x" * 1000


@pytest.fixture(scope="module")
def bounded_broker(tmp_path_factory) -> Iterator[BrokerProcess]:
    data = tmp_path_factory.mktemp("bounds") / "data"
    data.mkdir(parents=True)
    done = flowmq_user(data, "add", "alice", "--password", "wonderland")
    assert done.returncode == 0, done.stdout + done.stderr
    proc = start_broker(
        data,
        *ROLES,
        "--mqtt-max-inflight-bytes",
        str(INFLIGHT_BYTES),
        "--mqtt-max-held-packets",
        str(HELD_PACKETS),
    )
    yield proc
    proc.stop()


def test_qos1_bytes_in_flight_are_bounded_per_subscriber(bounded_broker, uid):
    port = bounded_broker.ports["mqtt"]
    topic = f"bounds/{uid}"
    sub = RawClient(port, 5)
    sub.connect(f"sub-{uid}")  # receive maximum 65535: only the byte bound holds it back
    sub.subscribe((topic, SubscriptionOptions(qos=1)))
    pub = RawClient(port, 5)
    pub.connect(f"pub-{uid}")
    for i in range(6):
        assert pub.publish(topic, bytes([48 + i]) + PAYLOAD, 1).reason_code == 0
    # 0, 1000 and 2000 bytes in flight are under the bound: three go out, then it is full.
    first = [sub.expect(Publish) for _ in range(3)]
    sub.expect_nothing()
    # One acknowledgement frees room for one more.
    sub.send(Puback(first[0].packet_id))
    fourth = sub.expect(Publish)
    sub.expect_nothing()
    for p in (*first[1:], fourth):
        sub.send(Puback(p.packet_id))
    rest = [sub.expect(Publish) for _ in range(2)]
    got = [p.payload[:1] for p in (*first, fourth, *rest)]
    assert got == [bytes([48 + i]) for i in range(6)]  # in order
    pub.close()
    sub.close()


def _held_refusals(broker: BrokerProcess) -> float:
    metrics = scrape(broker.http)
    return metrics.get('limits_rejections_count{limit="mqtt_max_held_packets"}', 0.0)


def _connect_then(port: int, pings: int) -> RawClient:
    """A client that sends CONNECT with a password (checked off the event loop, so the
    broker holds what follows) and ``pings`` PINGREQ in the same write."""
    c = RawClient(port, 5)
    c.send(Connect(f"held-{pings}", True, 60, None, "alice", b"wonderland"), *[Pingreq()] * pings)
    return c


def test_packets_sent_while_connect_waits_are_bounded(bounded_broker):
    port = bounded_broker.ports["mqtt"]
    before = _held_refusals(bounded_broker)
    within = _connect_then(port, HELD_PACKETS)
    assert within.expect(Connack).reason_code == 0
    for _ in range(HELD_PACKETS):  # held, then answered in order once CONNECT is done
        within.expect(Pingresp, skip=())
    within.close()
    assert _held_refusals(bounded_broker) == before

    over = _connect_then(port, HELD_PACKETS * 5)
    assert over.wait_closed() == []  # closed before any CONNACK
    assert _held_refusals(bounded_broker) == before + 1
