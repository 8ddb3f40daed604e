"""The metric catalogue.  Names are FlowMQ's documented ones (DESIGN.md §9); AMQP and Queue
metrics follow the same style.  Label sets are kept small: Prometheus adds ``instance``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from prometheus_client import Gauge, Histogram

from flowmq_metrics.registry import REGISTRY, Counter

_SIZE_BUCKETS = (
    1_024,
    16_384,
    65_536,
    262_144,
    1_048_576,
    4_194_304,
    16_777_216,
    67_108_864,
    float("inf"),
)

# Seconds, from a fsync-bound local write (sub-millisecond) to an S3 PUT under load.
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)

# --- routing engine -------------------------------------------------------------------
broker_messages_published_count = Counter(
    "broker_messages_published_count",
    "Messages accepted from publishers of any protocol.",
    ("namespace",),
)
broker_messages_dispatched_count = Counter(
    "broker_messages_dispatched_count",
    "Deliveries to destinations; exceeds published when one message matches several "
    "destinations (write amplification).",
    ("namespace",),
)
broker_messages_forwarded_count = Counter(
    "broker_messages_forwarded_count",
    "Messages forwarded to another broker node for its local subscribers.",
    ("namespace",),
)
broker_destinations = Gauge(
    "broker_destinations",
    "Destinations known to this broker, by type.",
    ("type",),
    registry=REGISTRY,
)
broker_subscriptions = Gauge(
    "broker_subscriptions", "Subscription routes on this broker.", registry=REGISTRY
)
broker_stream_subscriptions = Gauge(
    "broker_stream_subscriptions",
    "Stream consumers (Kafka fetch sessions / group members) on this broker.",
    registry=REGISTRY,
)

# --- limits (DESIGN.md §13) -------------------------------------------------------------
limits_rejections_count = Counter(
    "limits_rejections_count",
    "Client input refused at the protocol edge for exceeding a limit (topic_bytes, "
    "topic_levels, name_bytes, client_id_bytes, ...).",
    ("limit",),
)


# --- per-protocol traffic ----------------------------------------------------------------
class _Traffic(NamedTuple):
    messages_in: Counter
    messages_out: Counter
    messages_in_bytes: Counter
    messages_out_bytes: Counter


def _traffic(protocol: str, received: str, sent: str, payload: str) -> _Traffic:
    """The message counters every protocol keeps by namespace, under the documented names
    ``<protocol>_messages_{in,out}_count`` and ``<protocol>_messages_{in,out}_bytes_count``:
    ``received`` and ``sent`` say what one message in and out is, ``payload`` which of its
    bytes the ``_bytes`` counters add up."""

    def counter(name: str, documentation: str) -> Counter:
        return Counter(f"{protocol}_messages_{name}_count", documentation, ("namespace",))

    return _Traffic(
        counter("in", f"{received}."),
        counter("out", f"{sent}."),
        counter("in_bytes", f"{received}: {payload}."),
        counter("out_bytes", f"{sent}: {payload}."),
    )


# --- MQTT ------------------------------------------------------------------------------
mqtt_connections = Gauge(
    "mqtt_connections", "Open MQTT connections.", ("namespace",), registry=REGISTRY
)
mqtt_messages_dropped_count = Counter(
    "mqtt_messages_dropped_count",
    "Messages dropped (slow QoS 0 subscriber, expired, queue full).",
    ("namespace",),
)
_mqtt = _traffic("mqtt", "PUBLISH packets received", "PUBLISH packets sent", "payload bytes")
mqtt_messages_in_count = _mqtt.messages_in
mqtt_messages_out_count = _mqtt.messages_out
mqtt_messages_in_bytes_count = _mqtt.messages_in_bytes
mqtt_messages_out_bytes_count = _mqtt.messages_out_bytes

# --- Kafka -----------------------------------------------------------------------------
kafka_requests_count = Counter("kafka_requests_count", "Kafka requests handled.", ("api",))
_kafka = _traffic("kafka", "Records produced", "Records fetched", "record-batch bytes")
kafka_messages_in_count = _kafka.messages_in
kafka_messages_out_count = _kafka.messages_out
kafka_messages_in_bytes_count = _kafka.messages_in_bytes
kafka_messages_out_bytes_count = _kafka.messages_out_bytes

# --- AMQP ------------------------------------------------------------------------------
amqp_connections = Gauge(
    "amqp_connections", "Open AMQP connections.", ("namespace",), registry=REGISTRY
)
_amqp = _traffic(
    "amqp",
    "Basic.Publish messages received",
    "Basic.Deliver / Basic.GetOk messages sent",
    "body bytes",
)
amqp_messages_in_count = _amqp.messages_in
amqp_messages_out_count = _amqp.messages_out
amqp_messages_in_bytes_count = _amqp.messages_in_bytes
amqp_messages_out_bytes_count = _amqp.messages_out_bytes

# --- Queues ----------------------------------------------------------------------------
queue_messages_enqueued_count = Counter(
    "queue_messages_enqueued_count", "Messages durably enqueued.", ("namespace", "queue")
)
queue_messages_acked_count = Counter(
    "queue_messages_acked_count", "Messages acknowledged and deleted.", ("namespace", "queue")
)
queue_messages_redelivered_count = Counter(
    "queue_messages_redelivered_count",
    "Messages returned to ready by nack, reject or an expired lease.",
    ("namespace", "queue"),
)
queue_messages_dead_lettered_count = Counter(
    "queue_messages_dead_lettered_count",
    "Messages moved to the dead-letter topic after max_retries.",
    ("namespace", "queue"),
)
queue_depth = Gauge(
    "queue_depth", "Ready messages in a queue.", ("namespace", "queue"), registry=REGISTRY
)
queue_messages_in_flight = Gauge(
    "queue_messages_in_flight",
    "Messages leased to consumers and not yet acknowledged.",
    ("namespace", "queue"),
    registry=REGISTRY,
)

# --- object store / KaS3 -----------------------------------------------------------------
s3_request_count = Counter(
    "s3_request_count", "Object-store requests by type (put, get, delete, list).", ("type",)
)
s3_request_size = Histogram(
    "s3_request_size",
    "Bytes transferred per object-store request.",
    ("type",),
    buckets=_SIZE_BUCKETS,
    registry=REGISTRY,
)
kas3_segment_size = Histogram(
    "kas3_segment_size",
    "Bytes per flushed segment object.",
    buckets=_SIZE_BUCKETS,
    registry=REGISTRY,
)
kas3_flush_latency = Histogram(
    "kas3_flush_latency",
    "Seconds per shared flush, by stage: put (the segment object), commit (the meta "
    "transaction that indexes it), total (intent, put and commit: the wait it adds to an ack).",
    ("stage",),
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
kas3_page_cache_hit_count = Counter("kas3_page_cache_hit_count", "Page-cache hits.")
kas3_page_cache_miss_count = Counter("kas3_page_cache_miss_count", "Page-cache misses.")
kas3_online_running_tasks = Gauge(
    "kas3_online_running_tasks",
    "Flush, fetch and maintenance tasks running now.",
    registry=REGISTRY,
)

kafka_consumer_group_lag = Gauge(
    "kafka_consumer_group_lag",
    "Records not yet consumed by a consumer group (end offsets minus committed offsets, "
    "summed over its partitions), exported by the group's coordinator.",
    ("namespace", "group"),
    registry=REGISTRY,
)

# --- cluster -----------------------------------------------------------------------------
gossip_cluster_size = Gauge(
    "gossip_cluster_size", "Live members seen by this node.", registry=REGISTRY
)
gossip_events_originated_count = Counter(
    "gossip_events_originated_count", "Events this node originated."
)
gossip_event_propagation_hops_count = Counter(
    "gossip_event_propagation_hops_count", "Sum of hop counts of events received."
)
anti_entropy_syncs_completed_count = Counter(
    "anti_entropy_syncs_completed_count", "Anti-entropy rounds completed."
)
anti_entropy_missing_events_detected_count = Counter(
    "anti_entropy_missing_events_detected_count",
    "Change-log entries anti-entropy found that gossip had not delivered.",
)
cluster_auth_failures_count = Counter(
    "cluster_auth_failures_count",
    "Gossip datagrams (bad MAC, stale timestamp) and inter-broker link connections (failed "
    "or skipped handshake) rejected by the closed cluster plane.",
    ("plane",),
)
for _plane in ("gossip", "link"):  # exposed at zero: an alert can watch for any increase
    cluster_auth_failures_count.labels(_plane)


def record_limit_refusal(details: Mapping[str, Any]) -> None:
    """Count a refusal whose error ``details`` name the limit it passed (flowmq_core.limits
    errors carry ``limit``); other refusals are not limits and are not counted."""
    limit = details.get("limit")
    if limit is not None:
        limits_rejections_count.labels(limit).inc()


def record_object_request(kind: str, size: int) -> None:
    """Hook for object-store backends: one call per request."""
    s3_request_count.labels(kind).inc()
    s3_request_size.labels(kind).observe(size)


__all__ = [
    name
    for name in dir()
    if not name.startswith("_")
    and name
    not in {
        "Gauge",
        "Histogram",
        "Counter",
        "REGISTRY",
        "annotations",
        "Any",
        "Mapping",
        "NamedTuple",
    }
]
