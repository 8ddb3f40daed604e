"""Lingering close: when the broker ends a connection with a reason (a v5 DISCONNECT), it
half-closes and drains what the client is still sending, so the client reads the reason
instead of a TCP reset — even a client that sent far more than the broker read."""

from __future__ import annotations

from flowmq_wire.mqtt import reason_codes as rc
from flowmq_wire.mqtt.codec import encode
from flowmq_wire.mqtt.packets import Disconnect, Publish, Pubrec


def _read_to_end(c) -> list:
    """Every packet until the broker's end of stream; a reset fails the test."""
    got = []
    c.sock.settimeout(5.0)
    while True:
        data = c.sock.recv(1 << 20)  # ConnectionResetError here is the bug
        if not data:
            return got
        got.extend(c.decoder.feed(data))


def test_receive_maximum_exceeded_is_read_not_reset(raw, uid, still_serves):
    c = raw(5)
    ack = c.connect(f"rm-{uid}")
    receive_maximum = ack.properties["receive_maximum"]
    # Far more QoS 2 PUBLISHes than announced, all in one write, none PUBRELed.
    burst = b"".join(
        encode(Publish(f"t/{uid}", b"x" * 64, 2, packet_id=i), 5)
        for i in range(1, 2 * receive_maximum + 1)
    )
    c.send_raw(burst)
    got = _read_to_end(c)
    assert sum(isinstance(p, Pubrec) for p in got) == receive_maximum
    assert isinstance(got[-1], Disconnect), got[-3:]
    assert got[-1].reason_code == rc.RECEIVE_MAXIMUM_EXCEEDED
    still_serves()
