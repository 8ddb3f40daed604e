"""The metric registry and a counter that keeps FlowMQ's documented names.

prometheus-client appends ``_total`` to every Counter it exposes, but FlowMQ's documented
names (``broker_messages_published_count`` …) have no such suffix, and dashboards written
against FlowMQ must work unchanged.  So counters are our own small class, collected as
``counter``-typed families whose samples carry the name exactly; gauges and histograms come
from prometheus-client, whose names are not altered.  Our counter is also cheaper on hot
paths: a label child is a plain object whose ``inc`` adds to an attribute (the GIL makes
that safe enough for a metric; the broker is single-threaded per process).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

REGISTRY = CollectorRegistry(auto_describe=True)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _CounterChild:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1) -> None:
        self.value += amount


class Counter:
    """A monotonically increasing counter exposed under exactly ``name``."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: tuple[str, ...] = (),
        registry: CollectorRegistry | None = REGISTRY,
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._children: dict[tuple[str, ...], _CounterChild] = {}
        if not self.labelnames:
            self._children[()] = _CounterChild()
        if registry is not None:
            registry.register(self)

    def labels(self, *values: str, **kwvalues: str) -> _CounterChild:
        if kwvalues:
            values = tuple(str(kwvalues[name]) for name in self.labelnames)
        else:
            values = tuple(str(v) for v in values)
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}, got {values}")
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = _CounterChild()
        return child

    def inc(self, amount: float = 1) -> None:
        if self.labelnames:
            raise ValueError(f"{self.name} has labels {self.labelnames}: use .labels(...)")
        self._children[()].value += amount

    def value(self, *values: str, **kwvalues: str) -> float:
        """Current value (0 for a label set never incremented); for tests and the admin API."""
        if kwvalues:
            values = tuple(str(kwvalues[name]) for name in self.labelnames)
        child = self._children.get(tuple(values))
        return 0.0 if child is None else child.value

    def collect(self) -> Iterator[Metric]:
        family = Metric(self.name, self.documentation, "counter")
        for values, child in list(self._children.items()):
            family.samples.append(
                Sample(self.name, dict(zip(self.labelnames, values, strict=True)), child.value)
            )
        yield family

    def describe(self) -> Iterator[Metric]:
        yield Metric(self.name, self.documentation, "counter")


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def _escape_label(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def exposition(registry: CollectorRegistry = REGISTRY) -> bytes:
    """The Prometheus text format (0.0.4) of every metric, names exactly as defined.

    prometheus-client's ``generate_latest`` renames every counter family to ``<name>_total``;
    this writer does not, and is otherwise the same format.
    """
    lines: list[str] = []
    for family in registry.collect():
        lines.append(f"# HELP {family.name} {_escape_help(family.documentation)}\n")
        lines.append(f"# TYPE {family.name} {family.type}\n")
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue  # OpenMetrics-only sample; the 0.0.4 format has no place for it
            labels = ""
            if sample.labels:
                labels = ",".join(
                    f'{key}="{_escape_label(str(val))}"'
                    for key, val in sorted(sample.labels.items())
                )
                labels = "{" + labels + "}"
            lines.append(f"{sample.name}{labels} {floatToGoString(sample.value)}\n")
    return "".join(lines).encode()
