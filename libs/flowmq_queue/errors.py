"""Errors of the Queue store; each carries the stable ``code`` clients and the admin API see."""

from __future__ import annotations

from flowmq_core.errors import FlowMQError


class QueueError(FlowMQError):
    code = "queue_error"


class QueueFull(QueueError):
    """Publishing would take the queue past ``max_size_mb`` (RabbitMQ's ``reject-publish``
    overflow: the publish is refused, nothing already queued is dropped)."""

    code = "queue_full"


class QueueGone(QueueError):
    """The queue was deleted while an operation on it was under way."""

    code = "queue_gone"
