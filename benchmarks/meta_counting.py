"""Counting a broker's meta-store transactions from inside its process (benchmarks only)."""

from __future__ import annotations

from typing import Any


def count_transactions(meta: Any) -> list[int]:
    """Wrap ``meta`` so that every transaction adds one to the returned counter's ``[0]``:
    those awaited on the loop (``transact``) and those the batcher's flush thread queues
    (``transact_from_thread``, where the store has it; from that one thread only)."""
    count = [0]
    transact = meta.transact

    async def counting(fn: Any) -> Any:
        count[0] += 1
        return await transact(fn)

    meta.transact = counting
    if getattr(meta, "transacts_from_threads", False):
        from_thread = meta.transact_from_thread

        def counting_from_thread(fn: Any, loop: Any, future: Any, *rest: Any) -> None:
            count[0] += 1
            from_thread(fn, loop, future, *rest)

        meta.transact_from_thread = counting_from_thread
    return count
