"""Persistent sessions per namespace (``mqtt_max_sessions``, DESIGN.md §13, issue #11): a
CONNECT that would start one more is refused with CONNACK 0x97 Quota exceeded (v5) / 0x03
Server unavailable (3.1.1) and counted; resuming a session and clean sessions still connect,
and a session that ends frees its place.  Without it, offline sessions with client ids of a
client's choosing would pile up in memory for their whole expiry."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from flowmq_wire.mqtt.packets import Publish, SubscriptionOptions
from tests.fixtures.broker_process import BrokerProcess

from .conftest import RawClient, broker_with, rejections, roundtrip

LIMIT = 3
AWAY = {"session_expiry_interval": 300}


@pytest.fixture
def few_sessions_broker(tmp_path) -> Iterator[BrokerProcess]:
    yield from broker_with(tmp_path / "data", "--mqtt-max-sessions", str(LIMIT))


def _persistent(port: int, client_id: str, level: int = 5) -> RawClient:
    c = RawClient(port, level)
    c.connect(client_id, clean_start=False, properties=AWAY if level == 5 else None)
    return c


def test_a_new_persistent_session_past_the_limit_is_refused(few_sessions_broker, uid):
    broker = few_sessions_broker
    port = broker.ports["mqtt"]
    # A persistent subscriber that stays connected and keeps working throughout.
    worker = _persistent(port, f"worker-{uid}")
    worker.subscribe((f"work/{uid}", SubscriptionOptions(qos=1)))
    for i in range(LIMIT - 1):  # offline ones fill the rest
        _persistent(port, f"away{i}-{uid}").disconnect()
    before = rejections(broker, "mqtt_max_sessions")
    for level, code in ((5, 0x97), (4, 0x03)):
        refused = RawClient(port, level)
        ack = refused.connect(
            f"one-more-{level}-{uid}",
            clean_start=False,
            properties=AWAY if level == 5 else None,
            expect_success=False,
        )
        assert (ack.reason_code, ack.session_present) == (code, False)
        refused.wait_closed()
    assert rejections(broker, "mqtt_max_sessions") == before + 2

    # Resuming an offline one and clean sessions still connect; the worker is served.
    resumed = _persistent(port, f"away0-{uid}")
    clean = RawClient(port, 5)
    clean.connect(f"clean-{uid}")
    clean.publish(f"work/{uid}", b"job", 1)
    assert worker.expect(Publish).payload == b"job"
    roundtrip(port)

    # A session that ends frees its place.
    ended = RawClient(port, 5)
    ended.connect(f"away1-{uid}", clean_start=True)
    newcomer = _persistent(port, f"newcomer-{uid}")
    for c in (newcomer, ended, clean, resumed, worker):
        c.close()
