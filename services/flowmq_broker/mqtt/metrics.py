"""The MQTT adapter's Prometheus metrics, per namespace (defined in ``flowmq_metrics``)."""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import flowmq_metrics


class MqttMetrics(NamedTuple):
    """One namespace's labelled metric children, looked up once instead of per message."""

    connections: Any
    messages_in: Any
    bytes_in: Any
    messages_out: Any
    bytes_out: Any
    dropped: Any


@functools.cache
def mqtt_metrics(namespace: str) -> MqttMetrics:
    return MqttMetrics(
        flowmq_metrics.mqtt_connections.labels(namespace),
        flowmq_metrics.mqtt_messages_in_count.labels(namespace),
        flowmq_metrics.mqtt_messages_in_bytes_count.labels(namespace),
        flowmq_metrics.mqtt_messages_out_count.labels(namespace),
        flowmq_metrics.mqtt_messages_out_bytes_count.labels(namespace),
        flowmq_metrics.mqtt_messages_dropped_count.labels(namespace),
    )
