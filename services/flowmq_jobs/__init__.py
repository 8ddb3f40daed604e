"""flowmq_jobs."""
