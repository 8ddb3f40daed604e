"""Will messages: published on abnormal disconnect, not on a normal DISCONNECT, on DISCONNECT
0x04, after the will delay interval unless the client comes back."""

from __future__ import annotations

import time

import pytest

from flowmq_wire.mqtt.packets import Disconnect, Publish, Will

from .conftest import TIMEOUT, connected, subscribed


@pytest.fixture
def watcher(paho, uid):
    """A v5 subscriber on will/<uid>/# (QoS 2, retain as published)."""
    w = connected(paho, f"watch-{uid}", v5=True)
    w.subscribe(f"will/{uid}/#", 2, retain_as_published=True)
    return w


@pytest.mark.parametrize("level", [4, 5])
def test_will_published_on_abnormal_disconnect(raw, watcher, uid, level):
    c = raw(level)
    c.connect(f"dying-{uid}", will=Will(f"will/{uid}/gone", b"last words", 1))
    c.kill()
    m = watcher.get()
    assert (m.topic, m.payload, m.qos) == (f"will/{uid}/gone", b"last words", 1)
    watcher.expect_none()


def test_will_published_when_the_socket_is_closed_without_disconnect(raw, watcher, uid):
    c = raw(5)
    c.connect(f"fin-{uid}", will=Will(f"will/{uid}/fin", b"fin"))
    c.close()  # orderly TCP close, but no DISCONNECT packet
    assert watcher.get().payload == b"fin"


def test_will_published_on_keep_alive_timeout(raw, watcher, uid):
    c = raw(4)
    c.connect(f"silent-{uid}", keep_alive=1, will=Will(f"will/{uid}/silent", b"timed out"))
    assert watcher.get(timeout=4).payload == b"timed out"


def test_will_published_when_protocol_error_closes_the_connection(raw, watcher, uid):
    c = raw(5)
    c.connect(f"bad-{uid}", will=Will(f"will/{uid}/bad", b"violated"))
    c.send(Publish(f"bad/+/{uid}", b"wildcard"))  # → DISCONNECT 0x90
    c.wait_closed()
    assert watcher.get().payload == b"violated"


@pytest.mark.parametrize("level", [4, 5])
def test_no_will_on_normal_disconnect(raw, watcher, uid, level):
    c = raw(level)
    c.connect(f"polite-{uid}", will=Will(f"will/{uid}/polite", b"should not appear"))
    c.disconnect(0)
    watcher.expect_none()


def test_will_on_disconnect_with_will_message_0x04(raw, watcher, uid):
    c = raw(5)
    c.connect(f"w04-{uid}", will=Will(f"will/{uid}/w04", b"asked for"))
    c.disconnect(0x04)
    assert watcher.get().payload == b"asked for"


def test_will_properties_and_retain(paho, raw, watcher, uid):
    topic = f"will/{uid}/props"
    c = raw(5)
    c.connect(
        f"wprops-{uid}",
        will=Will(
            topic,
            b"{}",
            2,
            True,
            {
                "content_type": "application/json",
                "payload_format_indicator": 1,
                "response_topic": "r/t",
                "correlation_data": b"cd",
                "user_property": [("k", "v")],
                "message_expiry_interval": 60,
            },
        ),
    )
    c.kill()
    m = watcher.get()
    assert (m.payload, m.qos, m.retain) == (b"{}", 2, True)
    p = m.properties
    assert p.ContentType == "application/json"
    assert p.PayloadFormatIndicator == 1
    assert p.ResponseTopic == "r/t"
    assert p.CorrelationData == b"cd"
    assert p.UserProperty == [("k", "v")]
    assert 55 <= p.MessageExpiryInterval <= 60
    # A retained will is retained.
    late = subscribed(paho, f"late-{uid}", topic, 2, v5=True)
    m = late.get()
    assert (m.payload, m.retain) == (b"{}", True)


# --- will delay interval -----------------------------------------------------------------------
def _delayed(topic: str, payload: bytes, delay: int) -> Will:
    return Will(topic, payload, 1, False, {"will_delay_interval": delay})


def _with_delayed_will(
    raw, client_id: str, topic: str, payload: bytes, delay: int, session_expiry: int = 30
):
    """A v5 RawClient, connected (clean start 0) with a QoS 1 will of will delay ``delay``."""
    c = raw(5)
    c.connect(
        client_id,
        clean_start=False,
        properties={"session_expiry_interval": session_expiry},
        will=_delayed(topic, payload, delay),
    )
    return c


def test_will_delay_interval_delays_the_will(raw, watcher, uid):
    c = _with_delayed_will(raw, f"delay-{uid}", f"will/{uid}/delayed", b"late", 1)
    killed = time.monotonic()
    c.kill()
    m = watcher.get(timeout=TIMEOUT)
    elapsed = time.monotonic() - killed
    assert m.payload == b"late"
    assert 0.9 <= elapsed <= 3.0, elapsed


def test_reconnect_within_will_delay_cancels_the_will(raw, watcher, uid):
    c = _with_delayed_will(raw, f"back-{uid}", f"will/{uid}/cancelled", b"cancelled", 1)
    # A fence: another client with the same will delay, killed just after the first.  When
    # its will arrives, the first one's would have too, had it not been cancelled.
    fence = _with_delayed_will(raw, f"fence-{uid}", f"will/{uid}/fence", b"fence", 1)
    c.kill()
    fence.kill()
    back = raw(5)
    assert back.connect(
        f"back-{uid}", clean_start=False, properties={"session_expiry_interval": 30}
    ).session_present
    m = watcher.get()
    assert m.payload == b"fence", f"the cancelled will was published: {m.payload!r}"
    watcher.expect_none(0.3)


def test_will_published_at_session_end_when_shorter_than_will_delay(raw, watcher, uid):
    """MQTT 5 §3.1.3.2.2: the will is sent when the delay passes or the session ends,
    whichever is first."""
    c = _with_delayed_will(
        raw, f"short-{uid}", f"will/{uid}/sessionend", b"session ended", 30, session_expiry=1
    )
    killed = time.monotonic()
    c.kill()
    assert watcher.get(timeout=4).payload == b"session ended"
    assert time.monotonic() - killed <= 3.0


def test_will_delay_with_no_session_expiry_publishes_at_once(raw, watcher, uid):
    c = raw(5)
    c.connect(f"nosess-{uid}", will=_delayed(f"will/{uid}/nosess", b"now", 30))
    killed = time.monotonic()
    c.kill()
    assert watcher.get().payload == b"now"
    assert time.monotonic() - killed < 1.0


def test_takeover_publishes_will_of_the_old_connection(raw, watcher, uid):
    """MQTT 5 §3.1.4: the will of a taken-over connection is published (its will delay
    permitting) — the old connection ended without DISCONNECT from its client."""
    first = raw(5)
    first.connect(f"to-{uid}", will=Will(f"will/{uid}/takeover", b"taken over"))
    second = raw(5)
    second.connect(f"to-{uid}")
    got = first.wait_closed()
    assert [type(p) for p in got] == [Disconnect] and got[0].reason_code == 0x8E
    assert watcher.get().payload == b"taken over"
