"""CONNECT, assigned client identifiers, keep alive, session takeover, DISCONNECT."""

from __future__ import annotations

import time

import pytest

from flowmq_wire.mqtt.codec import encode
from flowmq_wire.mqtt.packets import (
    Connack,
    Connect,
    Disconnect,
    Pingreq,
    Pingresp,
    Publish,
    Subscribe,
    SubscriptionOptions,
)

from .conftest import Closed, RawClient, connected


# --- CONNECT ---------------------------------------------------------------------------------
@pytest.mark.parametrize("v5", [False, True], ids=["v311", "v5"])
def test_connect_and_roundtrip(paho, uid, v5):
    c = paho(f"c-{uid}", v5=v5)
    session_present, code, props = c.connect()
    assert (session_present, code) == (False, 0)
    if v5:
        # A v5 CONNACK tells the client the server's limits.
        assert props.ReceiveMaximum > 0
        assert props.MaximumPacketSize == 1024 * 1024
        assert props.TopicAliasMaximum > 0
    assert c.subscribe(f"conn/{uid}", 1) == [1]
    c.publish(f"conn/{uid}", b"hello", 1)
    m = c.get()
    assert (m.topic, m.payload, m.qos) == (f"conn/{uid}", b"hello", 1)


def test_v5_empty_client_id_gets_assigned_identifier(paho, uid):
    a, b = paho("", v5=True), paho("", v5=True)
    _, _, props_a = a.connect()
    _, _, props_b = b.connect()
    assigned_a = props_a.AssignedClientIdentifier
    assigned_b = props_b.AssignedClientIdentifier
    assert assigned_a and assigned_b and assigned_a != assigned_b
    # The assigned identifier is the session's: a subscription made on it works.
    assert a.subscribe(f"assigned/{uid}", 0) == [0]
    b.publish(f"assigned/{uid}", b"x")
    assert a.get().payload == b"x"


def test_v5_assigned_identifier_names_a_persistent_session(paho, uid):
    first = paho("", v5=True)
    _, _, props = first.connect(clean_start=False, properties={"SessionExpiryInterval": 60})
    assigned = props.AssignedClientIdentifier
    first.subscribe(f"assignedp/{uid}", 1)
    first.close()
    again = paho(assigned, v5=True)
    present, _, props = again.connect(clean_start=False, properties={"SessionExpiryInterval": 60})
    assert present is True
    assert not hasattr(props, "AssignedClientIdentifier")


def test_v5_client_id_given_is_not_reassigned(paho, uid):
    c = paho(f"given-{uid}", v5=True)
    _, _, props = c.connect()
    assert not hasattr(props, "AssignedClientIdentifier")


def test_v311_empty_client_id_with_clean_session_is_accepted(raw, uid):
    c = raw(4)
    ack = c.connect("", clean_start=True)
    assert ack.reason_code == 0 and ack.session_present is False
    assert c.subscribe(f"anon/{uid}") == [0]
    c.publish(f"anon/{uid}", b"p")
    assert c.expect(Publish).payload == b"p"


def test_v311_empty_client_id_without_clean_session_is_rejected(raw):
    c = raw(4)
    ack = c.connect("", clean_start=False, expect_success=False)
    assert ack.reason_code == 2  # identifier rejected
    assert ack.session_present is False
    c.wait_closed()


# --- keep alive ----------------------------------------------------------------------------
def test_keep_alive_timeout_v5_sends_disconnect_0x8d(raw, uid):
    c = raw(5)
    c.connect(f"ka5-{uid}", keep_alive=1)
    start = time.monotonic()
    got = c.wait_closed(timeout=5)
    elapsed = time.monotonic() - start
    assert [type(p) for p in got] == [Disconnect], got
    assert got[0].reason_code == 0x8D
    assert 1.2 <= elapsed <= 3.0, elapsed  # 1.5 x keep alive


def test_keep_alive_timeout_v311_closes(raw, uid):
    c = raw(4)
    c.connect(f"ka4-{uid}", keep_alive=1)
    start = time.monotonic()
    assert c.wait_closed(timeout=5) == []
    elapsed = time.monotonic() - start
    assert 1.2 <= elapsed <= 3.0, elapsed


def test_keep_alive_is_kept_by_pingreq(raw, uid):
    """A client that pings within the keep alive stays connected well past 1.5 x keep alive."""
    c = raw(5)
    c.connect(f"kaping-{uid}", keep_alive=1)
    start = time.monotonic()
    while time.monotonic() - start < 2.5:
        time.sleep(0.5)  # the client's own pacing, not synchronisation
        c.send(Pingreq())
        assert isinstance(c.recv(), Pingresp)
    # …and is still served.
    assert c.subscribe(f"kaping/{uid}") == [0]


# --- session takeover ---------------------------------------------------------------------
def test_session_takeover_v5_disconnects_first_with_0x8e(paho, uid):
    first = connected(paho, f"same-{uid}", v5=True)
    second = connected(paho, f"same-{uid}", v5=True)
    code, _ = first.wait_disconnect()
    assert code == 0x8E  # session taken over
    # The new connection is the session's now.
    assert second.subscribe(f"takeover/{uid}", 1) == [1]
    second.publish(f"takeover/{uid}", b"mine", 1)
    assert second.get().payload == b"mine"
    first.expect_none()


def test_session_takeover_v5_raw_sees_disconnect_before_close(raw, uid):
    first = raw(5)
    first.connect(f"sameraw-{uid}")
    second = raw(5)
    second.connect(f"sameraw-{uid}")
    got = first.wait_closed()
    assert [type(p) for p in got] == [Disconnect] and got[0].reason_code == 0x8E


def test_session_takeover_v311_closes_first(raw, uid):
    first = raw(4)
    first.connect(f"same4-{uid}")
    second = raw(4)
    ack = second.connect(f"same4-{uid}")
    assert ack.reason_code == 0
    assert first.wait_closed() == []
    assert second.subscribe(f"takeover4/{uid}") == [0]


def test_session_takeover_keeps_persistent_session(paho, uid):
    first = paho(f"keep-{uid}", v5=True)
    first.connect(clean_start=False, properties={"SessionExpiryInterval": 60})
    assert first.subscribe(f"keep/{uid}", 1) == [1]
    second = paho(f"keep-{uid}", v5=True)
    session_present, _, _ = second.connect(
        clean_start=False, properties={"SessionExpiryInterval": 60}
    )
    assert session_present is True
    assert first.wait_disconnect()[0] == 0x8E
    pub = connected(paho, f"keep-pub-{uid}")
    pub.publish(f"keep/{uid}", b"after takeover", 1)
    assert second.get().payload == b"after takeover"


# --- DISCONNECT ----------------------------------------------------------------------------
def test_client_disconnect_closes_connection(raw, uid):
    c = raw(5)
    c.connect(f"bye-{uid}")
    c.send(Disconnect(0))
    assert c.wait_closed() == []


def test_disconnect_raising_session_expiry_from_zero_is_protocol_error(raw, uid):
    """MQTT 5 §3.14.2.2.2: Session Expiry 0 at CONNECT, non-zero at DISCONNECT → 0x82."""
    c = raw(5)
    c.connect(f"expiry0-{uid}")
    c.send(Disconnect(0, {"session_expiry_interval": 30}))
    got = c.wait_closed()
    assert [type(p) for p in got] == [Disconnect] and got[0].reason_code == 0x82


def test_disconnect_can_end_a_persistent_session(raw, uid):
    """Session expiry set to 0 in DISCONNECT ends the session at once."""
    c = raw(5)
    c.connect(f"endsess-{uid}", clean_start=False, properties={"session_expiry_interval": 60})
    assert c.subscribe(f"endsess/{uid}") == [0]
    c.send(Disconnect(0, {"session_expiry_interval": 0}))
    c.wait_closed()
    again = raw(5)
    ack = again.connect(f"endsess-{uid}", clean_start=False)
    assert ack.session_present is False


def test_server_shutdown_sends_disconnect_0x8b(fresh_broker, uid):
    c = RawClient(fresh_broker.ports["mqtt"], 5)
    c.connect(f"shutdown-{uid}")
    fresh_broker.stop()
    got = c.wait_closed()
    assert [type(p) for p in got] == [Disconnect] and got[0].reason_code == 0x8B


def test_ping_and_connack_before_anything_else(raw, uid):
    c = raw(5)
    ack = c.connect(f"ping-{uid}")
    assert isinstance(ack, Connack)
    c.send(Pingreq())
    assert isinstance(c.recv(), Pingresp)


def test_pipelined_connect_and_subscribe(raw, uid):
    """A client that pipelines CONNECT and SUBSCRIBE in one write is served in order."""
    c = raw(5)
    data = encode(Connect(f"pipe-{uid}", protocol_level=5), 5) + encode(
        Subscribe(1, [(f"pipe/{uid}", SubscriptionOptions(1))]), 5
    )
    c.send_raw(data)
    assert c.expect(Connack).reason_code == 0
    assert c.recv().reason_codes == [1]
    try:
        c.expect_nothing()
    except Closed:
        raise AssertionError("closed after a pipelined CONNECT + SUBSCRIBE") from None
