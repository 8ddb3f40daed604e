"""The session expiry cap (``mqtt_max_session_expiry``, DESIGN.md §13): a v5 client asking
for longer is told the capped Session Expiry Interval in CONNACK (MQTT 5 §3.2.2.3.2) and
counted; 3.1.1 persistent sessions (clean session 0 asks for "never") get the cap too.  Once
it has passed with the client away, the session and its stored messages are gone, while other
clients keep being served."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from flowmq_wire.mqtt.packets import SubscriptionOptions
from tests.fixtures.broker_process import BrokerProcess

from .conftest import RawClient, broker_with, http, rejections, roundtrip, wait_until

CAP = 2  # seconds


@pytest.fixture(scope="module")
def capped_broker(tmp_path_factory) -> Iterator[BrokerProcess]:
    data_dir = tmp_path_factory.mktemp("expiry-cap") / "data"
    yield from broker_with(data_dir, "--mqtt-max-session-expiry", str(CAP))


def _has_session(broker: BrokerProcess, client_id: str) -> bool:
    """The broker holds a session (online or not) of ``client_id``: it lists its filters."""
    status, body = http(broker.http, "GET", "/api/v1/subscriptions", broker.token)
    assert status == 200, body
    return any(row["client_id"] == client_id for row in body["data"])


@pytest.mark.parametrize(
    ("asked", "told"), [(3600, CAP), (0xFFFFFFFF, CAP), (CAP, None), (None, None)]
)
def test_connack_tells_a_v5_client_the_capped_expiry(capped_broker, uid, asked, told):
    before = rejections(capped_broker, "session_expiry")
    c = RawClient(capped_broker.ports["mqtt"], 5)
    props = {} if asked is None else {"session_expiry_interval": asked}
    ack = c.connect(f"cap-{uid}", clean_start=False, properties=props)
    assert ack.properties.get("session_expiry_interval") == told
    assert rejections(capped_broker, "session_expiry") == before + (told is not None)
    c.close()


@pytest.mark.parametrize("level", [5, 4])
def test_a_session_away_past_the_cap_is_removed_with_its_messages(capped_broker, uid, level):
    broker = capped_broker
    port = broker.ports["mqtt"]
    client_id, topic = f"away-{uid}", f"away/{uid}"
    bystander = RawClient(port, 5)
    bystander.connect(f"bystander-{uid}")
    c = RawClient(port, level)
    props = {"session_expiry_interval": 3600} if level == 5 else {}
    c.connect(client_id, clean_start=False, properties=props)
    c.subscribe((topic, SubscriptionOptions(qos=1)))
    c.disconnect()
    bystander.publish(topic, b"stored while away", 1)
    assert _has_session(broker, client_id)  # kept while the cap runs…
    wait_until(lambda: not _has_session(broker, client_id), timeout=CAP + 4)  # …then removed
    back = RawClient(port, level)
    assert not back.connect(client_id, clean_start=False, properties=props).session_present
    back.expect_nothing()  # the stored message went with the session
    back.close()
    bystander.publish(f"other/{uid}", b"x", 1)  # still served
    roundtrip(port)
    bystander.close()
