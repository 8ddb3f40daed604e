"""``flowmq tail FILTER``: a live MQTT subscription, printed one message per line.

A minimal MQTT 3.1.1 client over a blocking socket, on our own codec (``flowmq_wire.mqtt``):
CONNECT (clean session), SUBSCRIBE, then PUBLISH in (QoS 1 acknowledged with PUBACK, QoS 2
with PUBREC/PUBCOMP), PINGREQ while idle.  The broker's MQTT port comes from ``--mqtt``, else
``./data/ports.json``, else 1883, on the admin URL's host.
"""

from __future__ import annotations

import argparse
import base64
import secrets
import socket
import time
from typing import Any

from flowmq_ctl.client import CliError, Refused, Unreachable, UsageError
from flowmq_ctl.context import Context
from flowmq_ctl.output import emit_line
from flowmq_wire import mqtt as wire

LEVEL = 4  # MQTT 3.1.1
KEEP_ALIVE_S = 30
CONNECT_TIMEOUT_S = 10.0
DEFAULT_MQTT_PORT = 1883


def _address(args: argparse.Namespace, ctx: Context) -> tuple[str, int]:
    if args.mqtt:
        host, sep, port = args.mqtt.rpartition(":")
        if not sep:
            host, port = args.mqtt, str(DEFAULT_MQTT_PORT)
        try:
            return host or ctx.target.host, int(port)
        except ValueError:
            raise UsageError(f"--mqtt takes HOST:PORT; got {args.mqtt!r}") from None
    return ctx.target.host, ctx.target.mqtt_port or DEFAULT_MQTT_PORT


class _Session:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.decoder = wire.MqttDecoder(server=False, protocol_level=LEVEL)
        self.pending: list[Any] = []
        self.last_sent = time.monotonic()

    def send(self, packet: Any) -> None:
        self.sock.sendall(wire.encode(packet, LEVEL))
        self.last_sent = time.monotonic()

    def next_packet(self, timeout: float) -> Any | None:
        """The next packet, or None if none arrived within ``timeout`` seconds."""
        while not self.pending:
            self.sock.settimeout(max(timeout, 0.01))
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                return None
            if not data:
                raise Unreachable("the broker closed the MQTT connection")
            self.pending.extend(self.decoder.feed(data))
        return self.pending.pop(0)


def tail(args: argparse.Namespace, ctx: Context) -> int:
    host, port = _address(args, ctx)
    try:
        sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise Unreachable(f"cannot reach the broker's MQTT port {host}:{port}: {reason}") from None
    session = _Session(sock)
    try:
        return _run(args, ctx, session)
    except wire.MqttCodecError as exc:
        raise CliError(f"bad MQTT packet from the broker: {exc}") from None
    except OSError as exc:
        raise Unreachable(f"MQTT connection to {host}:{port} failed: {exc}") from None
    except KeyboardInterrupt:
        return 0
    finally:
        try:
            session.send(wire.Disconnect())
        except OSError:
            pass
        sock.close()


def _run(args: argparse.Namespace, ctx: Context, session: _Session) -> int:
    password = args.password.encode() if args.password is not None else None
    client_id = args.client_id or f"flowmq-tail-{secrets.token_hex(4)}"
    session.send(wire.Connect(client_id, True, KEEP_ALIVE_S, None, args.username, password))
    ack = session.next_packet(CONNECT_TIMEOUT_S)
    if not isinstance(ack, wire.Connack):
        raise Unreachable("no CONNACK from the broker")
    if ack.reason_code != 0:
        raise Refused(f"MQTT CONNECT refused: return code {ack.reason_code}", 401, "refused")
    session.send(wire.Subscribe(1, [(args.filter, wire.SubscriptionOptions(args.qos))]))
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    while True:
        packet = session.next_packet(deadline - time.monotonic())
        if packet is None:
            raise Unreachable("no SUBACK from the broker")
        if isinstance(packet, wire.Suback):
            if packet.reason_codes and packet.reason_codes[0] >= 0x80:
                raise Refused(f"subscription to {args.filter!r} refused", 403, "refused")
            break
    left = args.num
    last_message = time.monotonic()
    while left is None or left > 0:
        now = time.monotonic()
        if args.timeout is not None and now - last_message >= args.timeout:
            return 0
        wait = KEEP_ALIVE_S / 2 - (now - session.last_sent)
        if args.timeout is not None:
            wait = min(wait, args.timeout - (now - last_message))
        packet = session.next_packet(wait)
        if packet is None:
            if time.monotonic() - session.last_sent >= KEEP_ALIVE_S / 2:
                session.send(wire.Pingreq())
            continue
        if isinstance(packet, wire.Publish):
            _acknowledge(session, packet)
            _show(ctx, packet, args.verbose)
            last_message = time.monotonic()
            if left is not None:
                left -= 1
        elif isinstance(packet, wire.Pubrel):
            session.send(wire.Pubcomp(packet.packet_id))
    return 0


def _acknowledge(session: _Session, packet: wire.Publish) -> None:
    if packet.qos == 1 and packet.packet_id is not None:
        session.send(wire.Puback(packet.packet_id))
    elif packet.qos == 2 and packet.packet_id is not None:
        session.send(wire.Pubrec(packet.packet_id))


def _show(ctx: Context, packet: wire.Publish, verbose: bool) -> None:
    payload = bytes(packet.payload)
    try:
        text, encoding = payload.decode("utf-8"), "utf8"
    except UnicodeDecodeError:
        text, encoding = base64.b64encode(payload).decode("ascii"), "base64"
    record = {
        "topic": packet.topic,
        "payload": text,
        "encoding": encoding,
        "qos": packet.qos,
        "retain": packet.retain,
    }
    emit_line(record, ctx.fmt, f"{packet.topic} {text}" if verbose else text, ctx.out)
