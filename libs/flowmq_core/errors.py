"""Error types shared by every layer.

Each error carries a stable machine-readable ``code`` so that adapters and the admin API can
report it (JSON envelope ``{"code", "message", "details"}``, protocol reason codes) without
matching on message text.
"""

from __future__ import annotations

from typing import Any


class FlowMQError(Exception):
    """Base of all FlowMQ errors; ``code`` is what clients see and may branch on."""

    code: str = "flowmq_error"

    def __init__(self, message: str, *, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = dict(details) if details else {}

    def to_dict(self) -> dict[str, Any]:
        """The ``error`` member of the admin API envelope."""
        return {"code": self.code, "message": self.message, "details": self.details}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, details={self.details!r})"


# The Invalid* errors are also ValueErrors so generic input-handling code keeps working.


class InvalidTopic(FlowMQError, ValueError):
    code = "invalid_topic"


class InvalidFilter(FlowMQError, ValueError):
    code = "invalid_filter"


class InvalidName(FlowMQError, ValueError):
    code = "invalid_name"


class NameCollision(FlowMQError):
    code = "name_collision"


class QuotaExceeded(FlowMQError):
    """Something a client adds would pass a limit of what may be held (DESIGN.md §13);
    ``details["limit"]`` names it (the ``limits_rejections_count`` label)."""

    code = "quota_exceeded"


class NotFound(FlowMQError):
    code = "not_found"


class AlreadyExists(FlowMQError):
    code = "already_exists"


class Overloaded(FlowMQError):
    """Durable writes lag behind (DESIGN.md §13 backpressure): try again in ``retry_after``
    seconds (HTTP 503 with ``Retry-After``)."""

    code = "overloaded"
    retry_after = 1


__all__ = [
    "AlreadyExists",
    "FlowMQError",
    "InvalidFilter",
    "InvalidName",
    "InvalidTopic",
    "NameCollision",
    "NotFound",
    "Overloaded",
    "QuotaExceeded",
]
