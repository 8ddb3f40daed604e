"""flowmq_admin."""
