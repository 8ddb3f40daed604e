"""A flush's meta transaction, shared by the broker and its flush process (``flush_process``).

It imports only what a transaction needs, so the flush process starts small.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from flowmq_commit import refs
from flowmq_meta import Transaction

RunCommit = Callable[[Transaction, str], tuple[list[Any], int]]
"""One run's commit bound to its group and chunks: ``(tr, object_key) -> (results, entries)``."""


def commit_flush(
    tr: Transaction,
    key: str,
    now: int,
    commits: Sequence[tuple[RunCommit, int]],
    next_keys: Sequence[str],
    next_deadline: int,
    node_id: str,
    abandoned: Sequence[str],
) -> list[list[Any]]:
    """Check the intent of ``key``, run every run's commit (``(commit, chunk count)``),
    turn the intent into the object's reference count, register the next flushes' intents
    and hand the keys of failed writes to GC.  Returns each run's results."""
    refs.check_intent(tr, key, now)
    for old in abandoned:
        refs.abandon_intent(tr, old, now)
    results = []
    total_refs = 0
    for commit, chunk_count in commits:
        run_results, n = commit(tr, key)
        if len(run_results) != chunk_count:
            raise ValueError(f"{commit!r} returned {len(run_results)} results for {chunk_count}")
        total_refs += n
        results.append(run_results)
    refs.resolve_intent(tr, key, total_refs, now)
    for next_key in next_keys:
        refs.register_intent(tr, next_key, next_deadline, node_id)
    return results
