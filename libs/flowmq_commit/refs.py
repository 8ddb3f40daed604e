"""Object life cycle in the meta store: write intents, reference counts, the to-delete list.

An object may be deleted only when nothing references it, and no object may exist that is
neither referenced nor listed for deletion.  Both hold at every instant, crash or not:

1. Before an object is PUT, its key is listed in ``OBJECTS_TO_DELETE`` as an *intent* with a
   lease deadline (the batcher registers the next flush's key in the previous flush's
   transaction, so steady-state flushes still cost one transaction).  A crash after the PUT
   leaves a listed object, which GC deletes once the lease has expired.
2. The transaction that writes index entries to the object first checks that its intent is
   still there, unexpired and unclaimed, then replaces it by a reference count
   (``OBJECT_REFS``, atomic add).  GC claims an entry in a transaction before deleting the
   object, so either the commit sees the claim and fails (nothing acknowledged) or GC sees
   the intent gone and leaves the object alone.
3. Whoever removes index entries (retention, compaction, queue acks) decrements the count in
   the same transaction; at zero the object is listed as *delete* with a grace deadline that
   lets fetches which already read the old index entry finish their GET.

``OBJECTS_TO_DELETE(object key)`` -> tuple-packed ``(state, deadline_ms, owner)``, state one
of ``intent``, ``delete``, ``claimed``.  All functions run inside a meta transaction.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import fdb.tuple as fdbtuple

from flowmq_commit.errors import IntentLost
from flowmq_meta import Transaction, decode_int, encode_int
from flowmq_meta.keys import OBJECT_REFS, OBJECTS_TO_DELETE

INTENT = "intent"
DELETE = "delete"
CLAIMED = "claimed"

# A transaction that passed its intent check commits within FoundationDB's 5 s limit, so an
# intent must still have this much lease left when checked.
COMMIT_MARGIN_MS = 5_000
# A PUT reported as failed (a timeout) may still land on S3 a little later; deleting its
# object only after this delay keeps such a late write from outliving the deletion.
ABANDON_GRACE_MS = 60_000


class Listing(NamedTuple):
    state: str
    deadline_ms: int
    owner: str

    def encode(self) -> bytes:
        return fdbtuple.pack((self.state, self.deadline_ms, self.owner))


def decode_listing(value: bytes) -> Listing:
    state, deadline, owner = fdbtuple.unpack(value)
    return Listing(state, deadline, owner)


def listing_key(object_key: str) -> bytes:
    return OBJECTS_TO_DELETE.pack(object_key)


def refs_key(object_key: str) -> bytes:
    return OBJECT_REFS.pack(object_key)


def get_listing(tr: Transaction, object_key: str) -> Listing | None:
    raw = tr.get(listing_key(object_key))
    return None if raw is None else decode_listing(raw)


def register_intent(tr: Transaction, object_key: str, deadline_ms: int, owner: str) -> None:
    tr.set(listing_key(object_key), Listing(INTENT, deadline_ms, owner).encode())


def check_intent(tr: Transaction, object_key: str, now_ms: int) -> None:
    """Raise ``IntentLost`` unless the object is still protected by a live intent."""
    listing = get_listing(tr, object_key)
    if listing is None or listing.state != INTENT:
        raise IntentLost(f"write intent of object {object_key!r} is gone ({listing})")
    if listing.deadline_ms <= now_ms + COMMIT_MARGIN_MS:
        raise IntentLost(f"write intent of object {object_key!r} expired")


def resolve_intent(tr: Transaction, object_key: str, refs: int, now_ms: int) -> None:
    """The object is committed with ``refs`` index entries pointing at it; with none (every
    writer declined) it is listed for deletion at once."""
    tr.clear(listing_key(object_key))
    if refs > 0:
        tr.add(refs_key(object_key), refs)
    else:
        mark_for_deletion(tr, object_key, now_ms, owner="unused")


def abandon_intent(tr: Transaction, object_key: str, now_ms: int) -> None:
    """A write under this key failed: let GC delete whatever the PUT may have left.

    Referenced (a commit whose outcome was in doubt did happen) or already listed for
    deletion: nothing to do.  Neither listed nor referenced: GC claimed and cleared the
    expired intent, possibly before a slow PUT landed, so list the key again."""
    deadline = now_ms + ABANDON_GRACE_MS
    listing = get_listing(tr, object_key)
    if listing is None:
        if ref_count(tr, object_key) <= 0:
            mark_for_deletion(tr, object_key, deadline, owner="abandoned")
    elif listing.state == INTENT:
        mark_for_deletion(tr, object_key, deadline, owner=listing.owner)


def mark_for_deletion(tr: Transaction, object_key: str, deadline_ms: int, owner: str = "") -> None:
    tr.set(listing_key(object_key), Listing(DELETE, deadline_ms, owner).encode())


def add_refs(tr: Transaction, object_key: str, n: int) -> None:
    tr.add(refs_key(object_key), n)


def unref(tr: Transaction, counts: Mapping[str, int], now_ms: int, grace_ms: int) -> list[str]:
    """Drop ``counts[key]`` references from each object; those left with none are listed for
    deletion after ``grace_ms``.  Returns the keys so listed."""
    released = []
    for object_key, n in counts.items():
        if n <= 0:
            continue
        key = refs_key(object_key)
        left = decode_int(tr.get(key)) - n
        if left > 0:
            tr.set(key, encode_int(left))
        else:
            tr.clear(key)
            mark_for_deletion(tr, object_key, now_ms + grace_ms, owner="unref")
            released.append(object_key)
    return released


def ref_count(tr: Transaction, object_key: str) -> int:
    return decode_int(tr.get(refs_key(object_key)))
