"""The audit trail (docs/security.md "Audit"): one logger, ``flowmq.audit``, for what an
operator must be able to reconstruct after the fact.

- every change through the admin API (POST, PUT, DELETE), made or refused: who (the admin
  token's id, or ``admin`` for the cluster token), what (method, path, status), when (the
  record's time);
- every refused login or connection on every client protocol (MQTT, AMQP, Kafka): address,
  reason and the user name given, never a password or token.

Records are ordinary ``logging`` records at info, so they reach the broker's log with the
rest; route or filter them by the logger name.  Nothing here holds state.
"""

from __future__ import annotations

import logging

AUDIT_LOGGER = "flowmq.audit"

audit_log = logging.getLogger(AUDIT_LOGGER)

__all__ = ["AUDIT_LOGGER", "audit_log"]
