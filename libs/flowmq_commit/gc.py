"""Object GC: delete the objects listed in ``OBJECTS_TO_DELETE`` once they are due.

Three steps per page, each crash-safe (see ``refs.py`` for the invariants):

1. claim (one transaction): due entries — unreferenced objects past their grace, intents past
   their lease — are marked ``claimed``; from then on no writer can commit index entries to
   them (the commit's intent check fails);
2. delete the claimed objects (idempotent: a crash here just means they are deleted again);
3. clear (one transaction) the entries whose objects are gone.

A claimed entry stays due, so a pass after a crash finishes the job.
"""

from __future__ import annotations

import asyncio
import logging
from typing import NamedTuple

from flowmq_commit import refs
from flowmq_commit.tasks import DEFAULT_MAINTENANCE, MaintenanceOptions, fault, running_task
from flowmq_meta import MetaStore, Transaction
from flowmq_meta.keys import OBJECTS_TO_DELETE
from flowmq_objstore import ObjectStore, ObjectStoreError

log = logging.getLogger(__name__)

DEFAULT_PAGE = 200
DEFAULT_CONCURRENCY = 16


class GcResult(NamedTuple):
    deleted: int
    not_due: int
    failed: int


async def collect_garbage(
    meta: MetaStore,
    objects: ObjectStore,
    options: MaintenanceOptions = DEFAULT_MAINTENANCE,
    *,
    page: int = DEFAULT_PAGE,
    concurrency: int = DEFAULT_CONCURRENCY,
) -> GcResult:
    """One pass over the to-delete list (``options.grace_ms`` is not used: the grace was
    added to each entry's deadline when it was listed)."""
    begin, end = OBJECTS_TO_DELETE.range()
    deleted = not_due = failed = 0
    semaphore = asyncio.Semaphore(concurrency)
    # The deletes that failed this pass: logged once at its end (an object store that refuses
    # deletes refuses them all, and a line each was thousands a minute).
    failures: list[tuple[str, Exception]] = []

    def claim(tr: Transaction, cursor: bytes) -> tuple[list[str], int, bytes | None]:
        now = options.clock()
        rows = tr.get_range(cursor, end, limit=page)
        claimed: list[str] = []
        waiting = 0
        for key, value in rows:
            listing = refs.decode_listing(value)
            if listing.state == refs.CLAIMED or listing.deadline_ms <= now:
                if listing.state != refs.CLAIMED:
                    tr.set(key, listing._replace(state=refs.CLAIMED).encode())
                claimed.append(OBJECTS_TO_DELETE.unpack(key)[0])
            else:
                waiting += 1
        next_cursor = rows[-1][0] + b"\x00" if len(rows) == page else None
        return claimed, waiting, next_cursor

    def clear(tr: Transaction, keys: list[str]) -> None:
        for object_key in keys:
            listing = refs.get_listing(tr, object_key)
            if listing is not None and listing.state == refs.CLAIMED:
                tr.clear(refs.listing_key(object_key))

    async def delete(object_key: str) -> bool:
        async with semaphore:
            try:
                await objects.delete(object_key)
                return True
            except Exception as exc:
                failures.append((object_key, exc))
                return False

    cursor: bytes | None = begin
    with running_task():
        while cursor is not None:
            claimed, waiting, next_cursor = await meta.transact(lambda tr, c=cursor: claim(tr, c))
            not_due += waiting
            fault(options.faults, "gc.after_claim")
            if claimed:
                ok = await asyncio.gather(*(delete(k) for k in claimed))
                done = [k for k, success in zip(claimed, ok, strict=True) if success]
                failed += len(claimed) - len(done)
                fault(options.faults, "gc.after_delete")
                if done:
                    await meta.transact(lambda tr, d=done: clear(tr, d))
                    fault(options.faults, "gc.after_clear")
                deleted += len(done)
            cursor = next_cursor
    if failures:
        object_key, exc = failures[0]
        log.warning(
            "GC could not delete %d object(s) (the first, %r: %s); retrying next pass",
            len(failures),
            object_key,
            exc,
            # A store's refusal says enough in its text; anything else is a bug to trace.
            exc_info=None if isinstance(exc, ObjectStoreError) else exc,
        )
    return GcResult(deleted, not_due, failed)
