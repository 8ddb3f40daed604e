"""flowmq_objstore."""
