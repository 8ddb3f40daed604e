"""The protocol-neutral message every adapter produces and every destination consumes."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


def now_ms() -> int:
    """Wall-clock milliseconds since the epoch (Kafka's timestamp unit)."""
    return time.time_ns() // 1_000_000


@dataclass(slots=True)
class Message:
    """One routed message.

    ``topic`` is the canonical (MQTT-style) topic. ``headers`` are MQTT 5 user properties /
    Kafka record headers / AMQP headers, kept as an ordered list because all three protocols
    allow repeated keys. ``expiry_ms`` is an absolute wall-clock deadline (epoch ms), not an
    interval, so it survives storage and forwarding unchanged. ``properties`` holds
    protocol-specific extras (e.g. MQTT response topic) that routing never looks at.
    """

    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    timestamp_ms: int = field(default_factory=now_ms)
    key: bytes | None = None
    content_type: str | None = None
    expiry_ms: int | None = None
    source_protocol: str = ""
    properties: dict[str, Any] = field(default_factory=dict)

    def is_expired(self, now: int | None = None) -> bool:
        """Whether delivery must be skipped (MQTT 5 message expiry, AMQP TTL)."""
        if self.expiry_ms is None:
            return False
        return (now_ms() if now is None else now) >= self.expiry_ms


__all__ = ["Message", "now_ms"]
