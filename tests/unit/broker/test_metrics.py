import re

from prometheus_client import Gauge, Histogram

import flowmq_metrics as metrics

DOCUMENTED = """
broker_messages_published_count broker_messages_dispatched_count broker_messages_forwarded_count
broker_destinations broker_subscriptions broker_stream_subscriptions mqtt_connections
mqtt_messages_in_count mqtt_messages_out_count mqtt_messages_in_bytes_count
mqtt_messages_out_bytes_count mqtt_messages_dropped_count kafka_requests_count
kafka_messages_in_count kafka_messages_out_count kafka_messages_in_bytes_count
kafka_messages_out_bytes_count s3_request_count s3_request_size gossip_cluster_size
gossip_events_originated_count gossip_event_propagation_hops_count
anti_entropy_syncs_completed_count anti_entropy_missing_events_detected_count
kas3_segment_size kas3_page_cache_hit_count kas3_page_cache_miss_count kas3_online_running_tasks
""".split()


def _families(text: str) -> dict[str, str]:
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))


def test_every_documented_metric_is_exposed_under_its_exact_name():
    families = _families(metrics.exposition().decode())
    missing = [name for name in DOCUMENTED if name not in families]
    assert not missing
    assert not [name for name in families if name.endswith("_total")]


def test_counters_are_counter_typed_and_count():
    before = metrics.broker_messages_published_count.value("ns-metrics-test")
    metrics.broker_messages_published_count.labels("ns-metrics-test").inc(3)
    text = metrics.exposition().decode()
    assert _families(text)["broker_messages_published_count"] == "counter"
    line = f'broker_messages_published_count{{namespace="ns-metrics-test"}} {before + 3:.1f}'
    assert line in text.splitlines()


def test_object_store_hook_counts_requests_by_type():
    before = metrics.s3_request_count.value("put")
    metrics.record_object_request("put", 2048)
    assert metrics.s3_request_count.value("put") == before + 1
    assert 's3_request_size_bucket{le="16384.0",type="put"}' in metrics.exposition().decode()


def test_label_values_are_escaped():
    metrics.broker_messages_dispatched_count.labels('we"ird\\ns').inc()
    assert 'namespace="we\\"ird\\\\ns"' in metrics.exposition().decode()


def test_every_metric_object_is_exported_under_its_own_name():
    # The per-protocol traffic counters are declared by one function and bound to their
    # module names afterwards: a binding to the wrong counter would count under another name.
    bound = {
        name: getattr(metric, "name", None) or getattr(metric, "_name", None)
        for name in metrics.__all__
        if isinstance(metric := getattr(metrics, name), metrics.Counter | Gauge | Histogram)
    }
    assert {"amqp_messages_out_bytes_count", "kafka_messages_in_count"} <= bound.keys()
    assert {name: exposed for name, exposed in bound.items() if exposed != name} == {}
