"""flowmq_cluster."""
