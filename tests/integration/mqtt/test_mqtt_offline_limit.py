"""An offline persistent session keeps at most ``mqtt_max_offline_bytes`` of QoS 1/2
messages (DESIGN.md §13): past it, a publish for that session is refused with v5 PUBACK
0x97 Quota exceeded (3.1.1: the connection is closed, so the client resends later), what was
stored before is kept, and other sessions are not affected."""

from __future__ import annotations

import pytest

from flowmq_wire.mqtt.packets import Publish, SubscriptionOptions
from tests.fixtures.broker_process import start_broker

from .conftest import ROLES, Closed, RawClient, http, wait_until

LIMIT = 4096
PAYLOAD = b"p" * 1000


@pytest.fixture(scope="module")
def small_queue_broker(tmp_path_factory):
    proc = start_broker(
        tmp_path_factory.mktemp("offline") / "data",
        *ROLES,
        "--mqtt-max-offline-bytes",
        str(LIMIT),
    )
    yield proc
    proc.stop()


def _away(broker, client_id: str, topic: str) -> None:
    """A persistent session with a QoS 1 subscription, once its client is gone."""
    c = RawClient(broker.ports["mqtt"], 5)
    c.connect(client_id, clean_start=False, properties={"session_expiry_interval": 300})
    c.subscribe((topic, SubscriptionOptions(qos=1)))
    c.disconnect()

    def offline() -> bool:
        status, body = http(broker.http, "GET", "/api/v1/clients", broker.token)
        assert status == 200, body
        return all(row.get("client_id") != client_id for row in body["data"])

    wait_until(offline)


def test_a_full_offline_queue_refuses_with_quota_exceeded(small_queue_broker, uid):
    port = small_queue_broker.ports["mqtt"]
    _away(small_queue_broker, f"full-{uid}", f"full/{uid}")
    _away(small_queue_broker, f"other-{uid}", f"other/{uid}")
    publisher = RawClient(port, 5)
    publisher.connect(f"pub-{uid}")
    codes = [publisher.publish(f"full/{uid}", PAYLOAD, 1).reason_code for _ in range(8)]
    accepted = [c for c in codes if c == 0]
    assert 1 <= len(accepted) <= LIMIT // len(PAYLOAD), codes
    assert codes[len(accepted) :] == [0x97] * (8 - len(accepted)), codes
    # Another offline session still takes messages.
    assert publisher.publish(f"other/{uid}", PAYLOAD, 1).reason_code == 0
    publisher.close()
    # What was accepted is delivered when the session comes back, in order.
    back = RawClient(port, 5)
    assert back.connect(f"full-{uid}", clean_start=False).session_present
    got = [back.expect(Publish) for _ in accepted]
    assert [p.payload for p in got] == [PAYLOAD] * len(accepted)
    back.expect_nothing()
    back.close()


def test_a_full_offline_queue_closes_a_3_1_1_publisher(small_queue_broker, uid):
    port = small_queue_broker.ports["mqtt"]
    _away(small_queue_broker, f"full4-{uid}", f"full4/{uid}")
    publisher = RawClient(port, 4)
    publisher.connect(f"pub4-{uid}")
    acked = 0
    with pytest.raises(Closed):  # PUBACKs until the queue is full, then the connection ends
        for _ in range(8):
            publisher.publish(f"full4/{uid}", PAYLOAD, 1)
            acked += 1
    assert 1 <= acked <= LIMIT // len(PAYLOAD)
