"""The Grafana dashboard asks only for metrics the broker exports, and Compose provisions it.

Every PromQL ``expr`` of every panel is reduced to the metric names it selects (functions,
keywords, label matchers, ``by (...)`` label lists, ranges and numbers removed) and each name
must be one the metric registry exposes: a counter or gauge by its exact name (counters have
no ``_total`` suffix), a histogram only as ``<name>_bucket``, ``_sum`` or ``_count``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

import flowmq_metrics.metrics  # noqa: F401  (registers the catalogue)
from flowmq_metrics import REGISTRY

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = ROOT / "deploy" / "grafana" / "flowmq.json"
PROVISIONING = ROOT / "deploy" / "grafana" / "provisioning"
COMPOSE = ROOT / "docker-compose.yml"

# PromQL functions, aggregations and keywords (not metric names).
PROMQL_WORDS = {
    *"abs absent absent_over_time avg avg_over_time bottomk ceil changes clamp clamp_max "
    "clamp_min count count_over_time count_values deriv delta exp floor group "
    "histogram_quantile holt_winters idelta increase irate label_join label_replace "
    "last_over_time ln log2 log10 max max_over_time min min_over_time predict_linear "
    "quantile quantile_over_time rate resets round scalar sgn sort sort_desc sqrt stddev "
    "stddev_over_time stdvar sum sum_over_time time timestamp topk vector".split(),
    *"and or unless by without on ignoring group_left group_right bool offset inf nan".split(),
}
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_LABEL_LIST = re.compile(
    r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", re.IGNORECASE
)
_VARIABLE = re.compile(r"\$\{?\w+\}?")
_IDENT = re.compile(r"(?<![\w.])[A-Za-z_:][A-Za-z0-9_:]*")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects."""
    text = _STRING.sub(" ", expr)
    text = _MATCHERS.sub(" ", text)  # label matchers (strings already gone)
    text = _RANGE.sub(" ", text)
    text = _LABEL_LIST.sub(" ", text)
    text = _VARIABLE.sub(" ", text)
    names = set()
    for match in _IDENT.finditer(text):
        word = match.group(0)
        if word.lower() in PROMQL_WORDS:
            continue
        if re.match(r"\s*\(", text[match.end() :]):
            raise AssertionError(f"unknown PromQL function {word!r} in {expr!r}")
        names.add(word)
    return names


def exported_names() -> set[str]:
    """Every sample name the broker's registry exposes on /metrics."""
    names = set()
    for family in REGISTRY.collect():
        if family.type == "histogram":
            names.update(f"{family.name}{suffix}" for suffix in ("_bucket", "_sum", "_count"))
        else:
            names.add(family.name)
    return names


def panels(node: dict) -> Iterator[dict]:
    for panel in node.get("panels", []):
        yield panel
        yield from panels(panel)  # rows nest their panels


def unknown_metrics(dashboard: dict) -> dict[str, set[str]]:
    """Per panel title, the metric names its queries select that the broker does not export."""
    known = exported_names()
    unknown: dict[str, set[str]] = {}
    for panel in panels(dashboard):
        for target in panel.get("targets", []):
            missing = metric_names(target["expr"]) - known
            if missing:
                unknown.setdefault(panel["title"], set()).update(missing)
    return unknown


def load_dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


# --- the extractor itself -----------------------------------------------------------------
@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("sum(rate(mqtt_messages_in_count[$__rate_interval]))", {"mqtt_messages_in_count"}),
        (
            'sum(rate(s3_request_count{type="put", job=~"flow.*"}[5m])) '
            "/ sum(rate(kas3_segment_size_count[5m]))",
            {"s3_request_count", "kas3_segment_size_count"},
        ),
        (
            "histogram_quantile(0.99, sum by (le, type) (rate(s3_request_size_bucket[1m])))",
            {"s3_request_size_bucket"},
        ),
        ("gossip_cluster_size offset 5m > bool 2", {"gossip_cluster_size"}),
        ("sum without (instance) (queue_depth) * 1e3", {"queue_depth"}),
    ],
)
def test_metric_names_are_extracted_from_promql(expr, names):
    assert metric_names(expr) == names


def test_registry_names_follow_the_exposition():
    known = exported_names()
    assert "kas3_page_cache_hit_count" in known  # a counter, exact name, no _total
    assert "kas3_page_cache_hit_count_total" not in known
    assert {"kas3_segment_size_bucket", "kas3_segment_size_count"} <= known
    assert "kas3_segment_size" not in known  # a histogram has no bare sample


def test_a_panel_naming_a_metric_the_broker_does_not_export_is_reported():
    dashboard = load_dashboard()
    dashboard["panels"].append(
        {
            "title": "Partition skew",
            "targets": [{"expr": "max by (stream) (kafka_partition_skew)"}],
        }
    )
    dashboard["panels"].append(
        {"title": "Bare histogram", "targets": [{"expr": "rate(kas3_segment_size[1m])"}]}
    )
    assert unknown_metrics(dashboard) == {
        "Partition skew": {"kafka_partition_skew"},
        "Bare histogram": {"kas3_segment_size"},
    }


# --- the dashboard ------------------------------------------------------------------------
def test_every_dashboard_query_names_a_metric_the_broker_exports():
    dashboard = load_dashboard()
    exprs = [t["expr"] for p in panels(dashboard) for t in p.get("targets", [])]
    assert len(exprs) > 20
    assert all(metric_names(expr) for expr in exprs), "a query selects no metric"
    assert unknown_metrics(dashboard) == {}


def test_the_dashboard_covers_the_operator_topics():
    dashboard = load_dashboard()
    used = {
        name
        for panel in panels(dashboard)
        for target in panel.get("targets", [])
        for name in metric_names(target["expr"])
    }
    for protocol in ("mqtt", "kafka", "amqp"):
        assert f"{protocol}_messages_in_count" in used
        assert f"{protocol}_messages_out_count" in used
    assert {
        "kas3_segment_size_count",  # flushes
        "kas3_segment_size_bucket",
        "s3_request_count",  # PUTs
        "s3_request_size_bucket",
        "kas3_page_cache_hit_count",
        "kas3_page_cache_miss_count",
        "gossip_cluster_size",
        "anti_entropy_syncs_completed_count",
        "anti_entropy_missing_events_detected_count",
        "queue_depth",
    } <= used


def test_panels_use_the_provisioned_data_source_and_unique_ids():
    dashboard = load_dashboard()
    datasource = yaml.safe_load((PROVISIONING / "datasources" / "prometheus.yml").read_text())
    (source,) = datasource["datasources"]
    assert source["type"] == "prometheus"
    assert source["url"] == "http://prometheus:9090"
    all_panels = list(panels(dashboard))
    ids = [panel["id"] for panel in all_panels]
    assert len(ids) == len(set(ids))
    for panel in all_panels:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == source["uid"], panel["title"]


# --- provisioning and Compose -------------------------------------------------------------
def _grafana_service() -> dict:
    return yaml.safe_load(COMPOSE.read_text())["services"]["grafana"]


def _mounts(service: dict) -> dict[str, str]:
    """Container path -> host path of a service's bind mounts."""
    mounts = {}
    for volume in service.get("volumes", []):
        host, container = volume.split(":")[:2]
        mounts[container] = host
    return mounts


def test_compose_provisions_grafana_with_the_dashboard():
    grafana = _grafana_service()
    assert grafana["image"].startswith("grafana/grafana-oss")
    assert "3000:3000" in grafana["ports"]
    assert "prometheus" in grafana["depends_on"]
    mounts = _mounts(grafana)
    assert (ROOT / mounts["/etc/grafana/provisioning"]).resolve() == PROVISIONING
    dashboard_in_container = next(c for c, h in mounts.items() if h.endswith("flowmq.json"))
    assert (ROOT / mounts[dashboard_in_container]).resolve() == DASHBOARD

    provider = yaml.safe_load((PROVISIONING / "dashboards" / "flowmq.yml").read_text())
    (entry,) = provider["providers"]
    assert entry["type"] == "file"
    assert Path(dashboard_in_container).parent == Path(entry["options"]["path"])
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == dashboard_in_container
