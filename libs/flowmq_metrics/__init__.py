"""flowmq_metrics."""
