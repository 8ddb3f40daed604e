"""flowmq_wire."""
