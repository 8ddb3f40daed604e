"""flowmq_objstore: object store API (DESIGN.md §8) and its backends, chosen by URL.

``file:///abs/dir`` or a bare path → :class:`FileObjectStore` (embedded default);
``s3://bucket[/prefix]?endpoint=…&region=…`` → :class:`S3ObjectStore`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from flowmq_objstore._common import RequestHook
from flowmq_objstore.api import ObjectNotFound, ObjectStore, ObjectStoreError
from flowmq_objstore.file import FileObjectStore

if TYPE_CHECKING:
    from flowmq_objstore.s3 import S3ObjectStore

__all__ = [
    "FileObjectStore",
    "ObjectNotFound",
    "ObjectStore",
    "ObjectStoreError",
    "RequestHook",
    "S3ObjectStore",
    "open_object_store",
]


def __getattr__(name: str) -> Any:
    # aiobotocore costs ~0.5 s to import; processes on the file backend never pay it.
    if name == "S3ObjectStore":
        from flowmq_objstore.s3 import S3ObjectStore

        return S3ObjectStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def open_object_store(url: str, on_request: RequestHook | None = None) -> ObjectStore:
    """Open the store ``url`` names; ``on_request(type, size)`` is called once per request.

    A file store's directory is created (and probed for writability) here, so a bad path
    fails at startup. Raises ObjectStoreError with a one-line message for any bad URL.
    """
    if not isinstance(url, str) or not url.strip():
        raise ObjectStoreError(f"bad object store URL {url!r}: empty")
    url = url.strip()
    scheme = urlsplit(url).scheme.lower() if "://" in url or url[:5].lower() == "file:" else ""
    if scheme == "s3":
        from flowmq_objstore.s3 import S3ObjectStore

        return S3ObjectStore.from_url(url, on_request=on_request)
    if scheme in ("", "file"):
        return FileObjectStore.from_url(url, on_request=on_request)
    raise ObjectStoreError(
        f"bad object store URL {url!r}: unsupported scheme {scheme!r} "
        "(use file:///abs/dir, a directory path, or s3://bucket?endpoint=…&region=…)"
    )
