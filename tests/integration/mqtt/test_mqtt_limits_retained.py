"""Retained messages per namespace (``mqtt_max_retained_messages`` and ``..._bytes``,
DESIGN.md §13): a retained PUBLISH of a new topic past either limit gets PUBACK 0x97 Quota
exceeded in v5 at QoS 1 (and is not delivered); at QoS 0 and in 3.1.1, which cannot be told,
it is delivered but not retained.  Each is counted; replacing or clearing a retained topic is
always allowed; other clients keep being served."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from flowmq_wire.mqtt.packets import Publish
from tests.fixtures.broker_process import BrokerProcess

from .conftest import RawClient, broker_with, rejections, roundtrip

MAX_MESSAGES = 3
MAX_BYTES = 3000


@pytest.fixture
def retained_capped_broker(tmp_path) -> Iterator[BrokerProcess]:
    yield from broker_with(
        tmp_path / "data",
        "--mqtt-max-retained-messages",
        str(MAX_MESSAGES),
        "--mqtt-max-retained-bytes",
        str(MAX_BYTES),
    )


def _client(port: int, level: int, topic_filter: str | None = None) -> RawClient:
    """A connected client of MQTT ``level``, subscribed to ``topic_filter`` if given."""
    c = RawClient(port, level)
    c.connect("")
    if topic_filter is not None:
        c.subscribe(topic_filter)
    return c


def _retained(port: int, topic_filter: str) -> dict[str, bytes]:
    """What a new subscriber to ``topic_filter`` is sent as retained."""
    c = _client(port, 5, topic_filter)
    got = {}
    try:
        while True:
            p = c.expect(Publish, timeout=0.5)
            assert p.retain
            got[p.topic] = p.payload
    except TimeoutError:
        return got
    finally:
        c.close()


def test_new_retained_topics_past_the_count_are_not_retained(retained_capped_broker):
    broker = retained_capped_broker
    port = broker.ports["mqtt"]
    live, pub, pub4 = _client(port, 5, "r/#"), _client(port, 5), _client(port, 4)
    for i in (1, 2, 3):
        assert pub.publish(f"r/{i}", b"kept", 1, retain=True).reason_code == 0
    assert [live.expect(Publish).topic for _ in range(3)] == ["r/1", "r/2", "r/3"]
    # Full: a v5 QoS 1 publisher is told, and its message goes nowhere…
    assert pub.publish("r/4", b"refused", 1, retain=True).reason_code == 0x97
    live.expect_nothing()
    # …QoS 0 and 3.1.1 cannot be told: delivered, not retained.
    pub.publish("r/5", b"live only", 0, retain=True)
    assert pub4.publish("r/6", b"live only", 1, retain=True).reason_code == 0
    assert sorted(live.expect(Publish).topic for _ in range(2)) == ["r/5", "r/6"]
    assert rejections(broker, "retained_messages") == 3
    # Replacing and clearing always work; a cleared topic makes room.
    assert pub.publish("r/1", b"replaced", 1, retain=True).reason_code == 0
    assert pub.publish("r/2", b"", 1, retain=True).reason_code == 0
    assert pub.publish("r/7", b"in the freed place", 1, retain=True).reason_code == 0
    assert _retained(port, "r/#") == {
        "r/1": b"replaced",
        "r/3": b"kept",
        "r/7": b"in the freed place",
    }
    roundtrip(port)  # other clients are served throughout
    for c in (live, pub, pub4):
        c.close()


def test_new_retained_topics_past_the_bytes_are_not_retained(retained_capped_broker):
    broker = retained_capped_broker
    port = broker.ports["mqtt"]
    live, pub = _client(port, 5, "b/#"), _client(port, 5)
    assert pub.publish("b/1", b"x" * 2000, 1, retain=True).reason_code == 0
    assert pub.publish("b/2", b"x" * 1001, 1, retain=True).reason_code == 0x97
    assert pub.publish("b/3", b"x" * 1000, 1, retain=True).reason_code == 0  # exactly full
    assert rejections(broker, "retained_bytes") == 1
    # A retained topic may always be replaced, even by a larger payload.
    assert pub.publish("b/1", b"y" * 2500, 1, retain=True).reason_code == 0
    assert _retained(port, "b/#") == {"b/1": b"y" * 2500, "b/3": b"x" * 1000}
    assert [live.expect(Publish).topic for _ in range(3)] == ["b/1", "b/3", "b/1"]
    roundtrip(port)
    live.close()
    pub.close()
