"""Lingering close: when the broker ends a connection with a reason (a Connection.Close the
client left unanswered, its own protocol header after a wrong one), it half-closes and drains
what the client still sends, so the client reads the reason instead of a TCP reset."""

from __future__ import annotations

import time

from pamqp import commands

from flowmq_broker.amqp.connection import CLOSE_TIMEOUT_S
from flowmq_wire.amqp.frames import HEARTBEAT_FRAME, PROTOCOL_HEADER


def _read_to_end(client) -> bytes:
    """Everything until the broker's end of stream; a reset fails the test."""
    got = client.buffer
    client.sock.settimeout(5.0)
    while data := client.sock.recv(65536):  # ConnectionResetError here is the bug
        got += data
    return got


def test_wrong_protocol_header_is_answered_even_to_a_client_still_sending(raw) -> None:
    client = raw()
    # An AMQP 1.0 header, and the client goes on without waiting for an answer.
    client.send_raw(b"AMQP\x00\x01\x00\x00" + b"\x00" * (256 * 1024))
    assert _read_to_end(client) == PROTOCOL_HEADER


def test_unanswered_connection_close_is_read_not_reset(raw) -> None:
    client = raw()
    client.handshake()
    # A method on a channel never opened: 504, Connection.Close.  The client goes on talking
    # (heartbeats) without reading for longer than the broker waits for Close-Ok.
    client.send((commands.Basic.Qos(prefetch_count=1), 5))
    until = time.monotonic() + CLOSE_TIMEOUT_S + 0.5
    while time.monotonic() < until:
        client.send_raw(HEARTBEAT_FRAME)
        time.sleep(0.05)  # pacing the talk, not waiting for the broker
    client.buffer = _read_to_end(client)
    close = client.expect(commands.Connection.Close)
    assert close.reply_code == 504
