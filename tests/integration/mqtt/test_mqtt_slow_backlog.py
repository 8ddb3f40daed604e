"""A persistent session whose stored backlog is slow to read still gets connected, and gets
all of it.  The chaos run on S3 (issue #11) lost 795-969 acknowledged messages this way: a
reconnect read the session's whole backlog (a ranged GET per stored object) before CONNACK,
gave up after 5 s, and sent CONNACK then; the subscriber (paho, keep alive 5 s) had given up
on it already and reconnected, to the same read, for good.  Here the object store is moto's
S3 server behind a proxy that holds every GET back, so reading the backlog takes longer than
the client waits for CONNACK; writes are not held back."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest

from tests.fixtures.broker_process import BrokerProcess
from tests.fixtures.s3 import S3_REGION, s3_client, s3_server  # noqa: F401
from tests.fixtures.slow_proxy import SlowGets

from .conftest import Paho, broker_with

pytestmark = pytest.mark.timeout(180)

# Each stored alone (published one at a time): one object, so one GET, per message.  With
# the GETs held back this long, reading them all takes about 10 s (10 at a time).
STORED = 200
GET_DELAY_S = 0.5
KEEP_ALIVE_S = 5


@pytest.fixture
def slow_store(s3_server, s3_client) -> Iterator[SlowGets]:  # noqa: F811
    proxy = SlowGets(int(s3_server.rsplit(":", 1)[1]))
    yield proxy
    proxy.close()


@pytest.fixture
def s3_broker(tmp_path, slow_store, s3_client) -> Iterator[BrokerProcess]:  # noqa: F811
    bucket = f"test-{uuid.uuid4().hex[:20]}"
    s3_client.create_bucket(Bucket=bucket)
    url = f"s3://{bucket}?endpoint={slow_store.endpoint}&region={S3_REGION}"
    yield from broker_with(tmp_path / "data", "--objects", url)


def test_a_session_with_a_backlog_slow_to_read_gets_connected_and_all_of_it(
    s3_broker, slow_store
) -> None:
    # 3.1.1, as the chaos run's stuck subscriber (v5 takes the same path).
    port = s3_broker.ports["mqtt"]
    subscriber = Paho(port, "slow-backlog", v5=False, clean=False, keepalive=KEEP_ALIVE_S)
    publisher = Paho(port, "slow-backlog-pub")
    try:
        subscriber.connect()
        assert subscriber.subscribe("backlog/#", 1) == [1]
        subscriber.close()
        publisher.connect()
        for i in range(STORED):
            assert publisher.publish(f"backlog/{i}", str(i), 1) == 0
        slow_store.get_delay = GET_DELAY_S
        # paho gives up on a CONNACK that does not come within its keep alive.
        session_present, _, _ = subscriber.connect()
        assert session_present
        got = {m.payload.decode() for m in subscriber.expect(STORED, timeout=90)}
        assert got == {str(i) for i in range(STORED)}
    finally:
        subscriber.close()
        publisher.close()


def test_connack_does_not_wait_for_the_backlog_to_be_read(s3_broker, slow_store) -> None:
    """CONNACK goes out before any of the backlog is read: here no GET can come back for
    seconds, and the client is connected at once (before, the reconnect read for up to 2 s
    first), then gets the backlog in order once the store answers."""
    port = s3_broker.ports["mqtt"]
    subscriber = Paho(port, "prompt-connack", v5=True, clean=False)
    publisher = Paho(port, "prompt-connack-pub")
    stored = 40
    try:
        subscriber.connect(properties={"SessionExpiryInterval": 300})
        assert subscriber.subscribe("prompt/#", 1) == [1]
        subscriber.close()
        publisher.connect()
        for i in range(stored):
            assert publisher.publish(f"prompt/{i % 4}", str(i), 1) == 0
        slow_store.get_delay = 4.0
        began = time.monotonic()
        session_present, _, _ = subscriber.connect(properties={"SessionExpiryInterval": 300})
        waited = time.monotonic() - began
        assert session_present
        assert waited < 1.5, f"CONNACK after {waited:.1f} s"
        slow_store.get_delay = 0.0
        got = [m.payload.decode() for m in subscriber.expect(stored, timeout=60)]
        assert got == [str(i) for i in range(stored)]
    finally:
        subscriber.close()
        publisher.close()
