"""flowmq_broker."""
