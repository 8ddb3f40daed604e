"""flowmq_queue."""
