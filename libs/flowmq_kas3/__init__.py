"""flowmq_kas3."""
