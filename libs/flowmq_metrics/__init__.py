"""Every Prometheus metric of FlowMQ-py, defined once (DESIGN.md §9).

Import the metric objects from here; never define a metric elsewhere.
"""

from flowmq_metrics.metrics import *  # noqa: F403
from flowmq_metrics.metrics import __all__ as _metric_names
from flowmq_metrics.registry import (
    CONTENT_TYPE,
    REGISTRY,
    Counter,
    exposition,
)

__all__ = ["CONTENT_TYPE", "REGISTRY", "Counter", "exposition", *_metric_names]
