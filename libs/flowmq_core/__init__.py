"""flowmq_core."""
