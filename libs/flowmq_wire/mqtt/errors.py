"""Errors raised by the MQTT codec.

Every error carries the MQTT 5 reason code the broker should answer with (in a CONNACK if the
CONNECT itself failed, else in a DISCONNECT; a 3.1.1 connection is simply closed), and the
packets that were decoded completely before the bad one, so none of them is lost.
"""

from __future__ import annotations

from typing import Any

from flowmq_wire.mqtt import reason_codes as rc


class MqttCodecError(Exception):
    """A byte stream that violates MQTT; ``reason_code`` is the v5 reason code to report."""

    reason_code: int
    message: str
    packets: list[Any]
    """Packets decoded completely from the same ``feed()`` call before the error."""
    packet_type: int | None
    """Control packet type (1-15) of the offending packet, when known."""

    def __init__(self, reason_code: int, message: str) -> None:
        super().__init__(message)
        self.reason_code = reason_code
        self.message = message
        self.packets = []
        self.packet_type = None

    def __str__(self) -> str:
        return f"{self.message} (reason 0x{self.reason_code:02X} {rc.reason_code_name(self.reason_code)})"


class MalformedPacket(MqttCodecError):
    """The bytes cannot be parsed as the spec lays them out (reason 0x81)."""

    def __init__(self, message: str) -> None:
        super().__init__(rc.MALFORMED_PACKET, message)


class ProtocolViolation(MqttCodecError):
    """Well-formed bytes that break a protocol rule (reason 0x82 unless a narrower code fits)."""

    def __init__(self, message: str, reason_code: int = rc.PROTOCOL_ERROR) -> None:
        super().__init__(reason_code, message)


class PacketTooLarge(MqttCodecError):
    """A packet larger than the decoder's ``max_packet_size`` (reason 0x95)."""

    size: int
    limit: int

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(
            rc.PACKET_TOO_LARGE, f"packet of {size} bytes exceeds the limit of {limit}"
        )
        self.size = size
        self.limit = limit


class UnsupportedProtocolVersion(MqttCodecError):
    """CONNECT with a protocol name/level other than MQTT 4 (3.1.1) or 5.

    Answer a v5 client with CONNACK 0x84, anything else with the 3.1.1 CONNACK return code 1
    (``return_code``), then close.
    """

    protocol_name: str
    protocol_level: int
    return_code: int = rc.CONNACK_UNACCEPTABLE_PROTOCOL_VERSION

    def __init__(self, protocol_name: str, protocol_level: int) -> None:
        super().__init__(
            rc.UNSUPPORTED_PROTOCOL_VERSION,
            f"unsupported protocol {protocol_name!r} level {protocol_level}",
        )
        self.protocol_name = protocol_name
        self.protocol_level = protocol_level
