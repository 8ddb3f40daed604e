"""Rules shared by every backend, so a store can move between backends without renaming keys."""

from __future__ import annotations

import logging
from collections.abc import Callable

from flowmq_objstore.api import ObjectStoreError

log = logging.getLogger("flowmq_objstore")

#: ``on_request(type, size)``: ``type`` is "put", "get", "delete" or "list"; ``size`` the
#: payload bytes moved by that request (0 for delete and list).
RequestHook = Callable[[str, int], None]

#: The file backend writes ``<dir>/.flowmq-tmp.<random>`` before renaming into place; keys may
#: not use this name so that ``list`` can skip leftovers of a crash without hiding real objects.
TEMP_PREFIX = ".flowmq-tmp."

# S3's limit on a whole key, and the usual filesystem limit on one path component.
MAX_KEY_BYTES = 1024
MAX_COMPONENT_BYTES = 255


def validate_key(key: str) -> None:
    """Reject keys that would not round-trip on every backend (raises ObjectStoreError)."""
    if not isinstance(key, str) or not key:
        raise ObjectStoreError(f"invalid object key {key!r}: must be a non-empty string")
    try:
        encoded = key.encode("utf-8")
    except UnicodeEncodeError:
        raise ObjectStoreError(f"invalid object key {key!r}: not valid UTF-8") from None
    if len(encoded) > MAX_KEY_BYTES:
        raise ObjectStoreError(
            f"invalid object key {key[:40]!r}...: longer than {MAX_KEY_BYTES} bytes"
        )
    if "\x00" in key:
        raise ObjectStoreError(f"invalid object key {key!r}: contains NUL")
    if key.startswith("/"):
        raise ObjectStoreError(f"invalid object key {key!r}: must be relative (no leading '/')")
    for part in key.split("/"):
        if part in ("", ".", ".."):
            raise ObjectStoreError(f"invalid object key {key!r}: empty, '.' or '..' path component")
        if part.startswith(TEMP_PREFIX):
            raise ObjectStoreError(f"invalid object key {key!r}: {TEMP_PREFIX!r} is reserved")
        if len(part.encode("utf-8")) > MAX_COMPONENT_BYTES:
            raise ObjectStoreError(
                f"invalid object key {key[:40]!r}...: a path component is longer than "
                f"{MAX_COMPONENT_BYTES} bytes"
            )


def check_range(start: int, end: int | None) -> None:
    # Negative offsets are a caller bug, not a storage condition, hence ValueError.
    if start < 0 or (end is not None and end < 0):
        raise ValueError(f"byte range must be non-negative, got [{start}, {end})")


def notify(hook: RequestHook | None, kind: str, size: int) -> None:
    """Call the metrics hook; a broken hook must never fail a storage operation."""
    if hook is None:
        return
    try:
        hook(kind, size)
    except Exception:
        log.exception("object store on_request hook failed")
