"""flowmq_meta."""
