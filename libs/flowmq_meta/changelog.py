"""The global metadata version and its change log (DESIGN.md §1, §6).

Every metadata change calls ``record_change`` inside the transaction that makes the change, so
the version, the log entry and the change commit or vanish together.  Nodes broadcast changes
by gossip; anti-entropy compares its applied version with ``read_version`` and replays
``changes_since`` to repair whatever gossip missed.

The version is read and rewritten (not an atomic ``add``) because the caller needs the new
number, and the read makes concurrent metadata changes conflict: versions stay gap-free and
commit order equals version order.  Metadata changes are rare, so the hot key is fine.
"""

from __future__ import annotations

import json
from typing import Any

from flowmq_meta.api import Transaction, decode_int, encode_int
from flowmq_meta.keys import CHANGELOG, META_VERSION


def read_version(tr: Transaction) -> int:
    """The current global metadata version (0 before the first change)."""
    return decode_int(tr.get(META_VERSION))


def record_change(tr: Transaction, kind: str, payload: dict[str, Any]) -> int:
    """Bump the metadata version and log ``{"kind", "payload", "version"}`` under it, in the
    caller's transaction; return the new version."""
    version = read_version(tr) + 1
    entry = {"kind": kind, "payload": payload, "version": version}
    tr.set(META_VERSION, encode_int(version))
    tr.set(CHANGELOG.pack(version), json.dumps(entry, separators=(",", ":")).encode())
    return version


def changes_since(tr: Transaction, version: int, limit: int = 1000) -> list[dict[str, Any]]:
    """Log entries with versions greater than ``version``, oldest first, at most ``limit``
    (0: no limit); call again from the last version returned to page through."""
    begin = CHANGELOG.pack(version + 1)
    _, end = CHANGELOG.range()
    return [json.loads(value) for _, value in tr.get_range(begin, end, limit=limit)]


def clear_recorded(tr: Transaction, key: bytes, kind: str, payload: dict[str, Any]) -> bool:
    """Clear ``key`` and record the change ``kind``, in ``tr``; False (and nothing recorded)
    when there is no such key."""
    if tr.get(key) is None:
        return False
    tr.clear(key)
    record_change(tr, kind, payload)
    return True
