"""Bad input on raw sockets: each ends that connection the way the spec says (DISCONNECT with a
v5 reason code, or a plain close for 3.1.1), and the broker keeps serving everybody else."""

from __future__ import annotations

import pytest

from flowmq_wire.mqtt.codec import encode
from flowmq_wire.mqtt.packets import (
    Connack,
    Connect,
    Disconnect,
    Pingreq,
    Publish,
    Subscribe,
    SubscriptionOptions,
    Will,
)

from .conftest import subscribed


def _assert_closed_for(got: list, level: int, reason_code: int) -> None:
    """What the broker sent before closing: v5, one DISCONNECT with ``reason_code``; 3.1.1,
    nothing (it has no DISCONNECT from the server)."""
    if level == 5:
        assert [type(p) for p in got] == [Disconnect] and got[0].reason_code == reason_code, got
    else:
        assert got == [], got


def _topic_bytes_publish(topic: bytes, level: int, payload: bytes = b"p") -> bytes:
    """A QoS 0 PUBLISH whose topic is the given raw bytes (possibly not UTF-8)."""
    body = len(topic).to_bytes(2, "big") + topic + (b"\x00" if level == 5 else b"") + payload
    assert len(body) < 128
    return bytes([0x30, len(body)]) + body


def test_garbage_bytes(raw, still_serves):
    c = raw(5)
    c.send_raw(b"\xde\xad\xbe\xef" * 64)
    assert c.wait_closed() == []
    still_serves()


def test_http_request_on_mqtt_port(raw, still_serves):
    c = raw(5)
    c.send_raw(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert c.wait_closed() == []
    still_serves()


def test_truncated_packet_then_close(raw, uid, still_serves):
    data = encode(Connect(f"trunc-{uid}", protocol_level=5), 5)
    c = raw(5)
    c.send_raw(data[: len(data) // 2])
    c.close()
    c = raw(5)
    c.connect(f"trunc2-{uid}")
    c.send_raw(encode(Publish(f"t/{uid}", b"x" * 100, 1, packet_id=1), 5)[:20])
    c.close()
    still_serves()


def test_truncated_remaining_length_then_close(raw, uid, still_serves):
    c = raw(4)
    c.connect(f"trlen-{uid}")
    c.send_raw(b"\x30\xff\xff")  # remaining length continues past the data
    c.close()
    still_serves()


def test_malformed_remaining_length(raw, uid, still_serves):
    c = raw(5)
    c.connect(f"badlen-{uid}")
    c.send_raw(b"\x30\xff\xff\xff\xff\x01")  # five-byte variable byte integer
    _assert_closed_for(c.wait_closed(), 5, 0x81)
    still_serves()


@pytest.mark.parametrize("level", [4, 5])
@pytest.mark.parametrize(
    ("tag", "bad"), [("utf8", b"bad/\xc3\x28/"), ("nul", b"bad/\x00/")], ids=["utf8", "nul"]
)
def test_invalid_topic_bytes(raw, uid, still_serves, level, tag, bad):
    """A topic that is not valid UTF-8, or holds U+0000, is a malformed packet."""
    c = raw(level)
    c.connect(f"{tag}-{uid}")
    c.send_raw(_topic_bytes_publish(bad + uid.encode(), level))
    _assert_closed_for(c.wait_closed(), level, 0x81)
    still_serves()


@pytest.mark.parametrize("level", [4, 5])
@pytest.mark.parametrize("topic", ["a/+/b", "a/#", "#", "+"])
def test_wildcard_in_publish_topic(raw, paho, uid, still_serves, level, topic):
    """Refused and routed nowhere: a spy on ``#`` (which would match each of these topics
    taken as a name) gets its own later marker, and nothing of the refused publish before it."""
    spy = subscribed(paho, f"spy-{uid}", "#", 1, v5=True)
    wild = f"wild-{uid}".encode()
    c = raw(level)
    c.connect(f"wild-{uid}")
    c.send(Publish(topic, wild, 1, packet_id=1))
    _assert_closed_for(c.wait_closed(), level, 0x90)
    marker = f"wild-done/{uid}"
    spy.publish(marker, b"done", 1)
    seen = []
    while not seen or seen[-1].topic != marker:
        seen.append(spy.get())
    assert [m.topic for m in seen if m.payload == wild] == []
    still_serves()


@pytest.mark.parametrize("level", [4, 5])
def test_publish_before_connect(raw, uid, still_serves, level):
    c = raw(level)
    c.send(Publish(f"early/{uid}", b"x"))
    assert c.wait_closed() == []
    still_serves()


@pytest.mark.parametrize("level", [4, 5])
def test_subscribe_and_ping_before_connect(raw, uid, still_serves, level):
    c = raw(level)
    c.send(Subscribe(1, [(f"early/{uid}", SubscriptionOptions())]))
    assert c.wait_closed() == []
    c = raw(level)
    c.send(Pingreq())
    assert c.wait_closed() == []
    still_serves()


@pytest.mark.parametrize("level", [4, 5])
def test_second_connect(raw, uid, still_serves, level):
    c = raw(level)
    c.connect(f"twice-{uid}")
    c.send(Connect(f"twice-{uid}", protocol_level=level))
    _assert_closed_for(c.wait_closed(), level, 0x82)
    still_serves()


def _connect_bytes(name: bytes, level: int, client_id: bytes = b"x") -> bytes:
    body = (
        len(name).to_bytes(2, "big")
        + name
        + bytes([level, 0x02])
        + (60).to_bytes(2, "big")
        + (b"\x00" if level == 5 else b"")
        + len(client_id).to_bytes(2, "big")
        + client_id
    )
    return bytes([0x10, len(body)]) + body


@pytest.mark.parametrize(("name", "level"), [(b"MQIsdp", 3), (b"MQTT", 3), (b"MQTT", 6)])
def test_unsupported_protocol_level(raw, still_serves, name, level):
    c = raw(4)  # decode the answer as 3.1.1 first; a v5 CONNACK has one more byte
    c.send_raw(_connect_bytes(name, level))
    c.sock.settimeout(5)
    data = b""
    while True:
        chunk = c.sock.recv(64)
        if not chunk:
            break
        data += chunk
    # 3.1.1 §3.2.2.3: CONNACK return code 1 (unacceptable protocol level), then close.
    # MQTT 5 §3.1.2.2 allows CONNACK 0x84 (Unsupported Protocol Version) instead.
    assert data in (b"\x20\x02\x00\x01", b"\x20\x03\x00\x84\x00"), data
    still_serves()


def test_wrong_protocol_name(raw, still_serves):
    c = raw(4)
    c.send_raw(_connect_bytes(b"HTTP", 4))
    got = c.wait_closed()
    assert all(isinstance(p, Connack) and p.reason_code != 0 for p in got), got
    still_serves()


@pytest.mark.parametrize("level", [4, 5])
def test_invalid_utf8_client_id(raw, still_serves, level):
    c = raw(level)
    c.send_raw(_connect_bytes(b"MQTT", level, b"\xff\xfe"))
    got = c.wait_closed()
    # The CONNECT is malformed: a CONNACK refusing it (v5: 0x81/0x85) at most, then close.
    assert all(isinstance(p, Connack) and p.reason_code >= (0x80 if level == 5 else 1) for p in got)
    still_serves()


@pytest.mark.parametrize("level", [4, 5])
def test_reserved_connect_flag(raw, still_serves, level):
    data = bytearray(_connect_bytes(b"MQTT", level))
    data[2 + 2 + 4 + 1] |= 0x01  # the reserved bit of the connect flags
    c = raw(level)
    c.send_raw(bytes(data))
    got = c.wait_closed()
    assert all(isinstance(p, Connack) and p.reason_code != 0 for p in got), got
    still_serves()


@pytest.mark.parametrize("level", [4, 5])
def test_qos3_publish(raw, uid, still_serves, level):
    c = raw(level)
    c.connect(f"qos3-{uid}")
    body = b"\x00\x01t\x00\x01" + (b"\x00" if level == 5 else b"")
    c.send_raw(bytes([0x36, len(body)]) + body)
    _assert_closed_for(c.wait_closed(), level, 0x81)
    still_serves()


@pytest.mark.parametrize("level", [4, 5])
def test_invalid_fixed_header_flags(raw, uid, still_serves, level):
    c = raw(level)
    c.connect(f"flags-{uid}")
    sub = encode(Subscribe(1, [(f"f/{uid}", SubscriptionOptions())]), level)
    c.send_raw(bytes([0x80]) + sub[1:])  # SUBSCRIBE must carry flags 0b0010
    _assert_closed_for(c.wait_closed(), level, 0x81)
    still_serves()


def test_subscribe_without_filters_v5(raw, uid, still_serves):
    c = raw(5)
    c.connect(f"nofilters-{uid}")
    c.send_raw(b"\x82\x03\x00\x01\x00")  # SUBSCRIBE, packet id 1, no properties, no filters
    got = c.wait_closed()
    assert [type(p) for p in got] == [Disconnect]
    assert got[0].reason_code in (0x81, 0x82)  # malformed / protocol error (§3.8.3)
    still_serves()


def test_server_only_packet_from_client(raw, uid, still_serves):
    c = raw(5)
    c.connect(f"connack-{uid}")
    c.send_raw(b"\x20\x03\x00\x00\x00")  # a CONNACK sent to the server
    got = c.wait_closed()
    assert [type(p) for p in got] == [Disconnect] and got[0].reason_code in (0x81, 0x82)
    still_serves()


def test_qos_publish_with_packet_id_zero(raw, uid, still_serves):
    c = raw(5)
    c.connect(f"pid0-{uid}")
    c.send_raw(b"\x32\x06\x00\x01t\x00\x00\x00")
    got = c.wait_closed()
    assert [type(p) for p in got] == [Disconnect] and got[0].reason_code in (0x81, 0x82)
    still_serves()


def test_many_bad_clients_do_not_disturb_a_good_one(raw, broker, paho, uid):
    good = paho(f"good-{uid}", v5=True)
    good.connect()
    good.subscribe(f"good/{uid}", 1)
    for i in range(30):
        c = raw(5 if i % 2 else 4)
        if i % 3 == 0:
            c.send_raw(b"\x10\xff")
        elif i % 3 == 1:
            c.connect(f"bad{i}-{uid}")
            c.send(Publish("x/#", b"x"))
        else:
            c.send_raw(bytes(range(256)))
        c.close()
        good.publish(f"good/{uid}", str(i).encode(), 1)
    assert [m.payload for m in good.expect(30)] == [str(i).encode() for i in range(30)]


def test_wildcard_in_response_topic_is_a_protocol_error(raw, uid, still_serves):
    c = raw(5)
    c.connect(f"resp-{uid}")
    c.send(Publish(f"req/{uid}", b"q", 1, packet_id=1, properties={"response_topic": "reply/+"}))
    got = c.wait_closed()
    assert [type(p) for p in got] == [Disconnect] and got[0].reason_code == 0x82
    still_serves()


@pytest.mark.parametrize("level", [4, 5])
def test_will_with_a_wildcard_topic_is_refused(raw, uid, still_serves, level):
    c = raw(level)
    c.send(Connect(f"will-{uid}", True, 60, Will("gone/#", b"x"), protocol_level=level))
    got = c.wait_closed()
    if level == 5:
        assert [type(p) for p in got] == [Connack] and got[0].reason_code == 0x90
    else:
        assert got == []
    still_serves()
