"""Errors of the shared write path.  Their codes keep the ``kas3_`` prefix they were
published with."""

from __future__ import annotations

from flowmq_core.errors import FlowMQError


class CommitError(FlowMQError):
    code = "commit_error"


class IntentLost(CommitError):
    """The to-delete entry that protected a freshly written object was claimed by GC or has
    expired, so committing index entries to that object could leave them dangling.  The
    write is failed (nothing acknowledged) and retried under a new object key."""

    code = "kas3_intent_lost"


class BatcherClosed(CommitError):
    code = "kas3_batcher_closed"


class StoreUnavailable(CommitError):
    """The object store or the meta store failed a flush: nothing of it was acknowledged.
    For a short window after a failure, new writes get this at once instead of waiting for
    the store's timeouts (DESIGN.md §13: fail fast, recover by itself); the cause is chained."""

    code = "store_unavailable"


__all__ = ["BatcherClosed", "CommitError", "IntentLost", "StoreUnavailable"]
