"""Lingering close over TLS: a TLS transport cannot half-close, so the broker only delays
the close, reading and discarding (and the TLS shutdown then waits for the client's
close_notify); a client that sent more than the broker read still reads the DISCONNECT that
says why instead of a reset."""

from __future__ import annotations

import socket

from flowmq_wire.mqtt import reason_codes as rc
from flowmq_wire.mqtt.codec import encode
from flowmq_wire.mqtt.packets import Disconnect, Publish, Pubrec
from tests.integration.mqtt.conftest import RawClient
from tests.integration.tls.conftest import HOST, TIMEOUT, client_context


def test_receive_maximum_exceeded_over_tls_is_read_not_reset(tls_broker, pki, uid):
    plain = socket.create_connection((HOST, tls_broker.ports["mqtt_tls"]), timeout=TIMEOUT)
    c = RawClient(0, 5, sock=client_context(pki).wrap_socket(plain, server_hostname="localhost"))
    receive_maximum = c.connect(f"rm-{uid}").properties["receive_maximum"]
    # Far more QoS 2 PUBLISHes than announced, all in one write, none PUBRELed.
    c.send_raw(
        b"".join(
            encode(Publish(f"t/{uid}", b"x" * 64, 2, packet_id=i), 5)
            for i in range(1, 2 * receive_maximum + 1)
        )
    )
    got = []
    while not got or not isinstance(got[-1], Disconnect):
        data = c.sock.recv(1 << 20)  # ConnectionResetError here is the bug
        assert data, f"closed after {got[-3:]}"
        got.extend(c.decoder.feed(data))
    assert sum(isinstance(p, Pubrec) for p in got) == receive_maximum
    assert got[-1].reason_code == rc.RECEIVE_MAXIMUM_EXCEEDED
    c.close()
