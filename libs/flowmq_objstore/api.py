"""The object-store contract (DESIGN.md §8): put, ranged get, delete, list."""

from __future__ import annotations

import abc
from typing import Protocol


class ObjectStoreError(Exception):
    pass


class ObjectNotFound(ObjectStoreError):
    pass


class ThreadWriter(Protocol):
    """Blocking object writes for a worker thread (a backend on local disk): a caller that
    is in a thread already writes without a hop through the event loop."""

    def write_blocking(self, key: str, data: bytes) -> None:
        """``put``, blocking the calling thread (never the event loop's)."""

    def reserve_blocking(self, keys: list[str]) -> None:
        """Make later ``write_blocking`` of ``keys`` cheaper by creating them ahead (the
        caller holds write intents for them): until written they exist, empty, and are not
        listed."""


class ObjectStore(abc.ABC):
    url: str

    def thread_writer(self) -> ThreadWriter | None:
        """The blocking writes of this store, or None if it has only the async ones."""
        return None

    @abc.abstractmethod
    async def put(self, key: str, data: bytes) -> None:
        """Store ``data`` under ``key`` atomically (readers never see a partial object)."""

    @abc.abstractmethod
    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        """Bytes ``[start, end)`` of the object (``end`` None: to the end).
        Raises ``ObjectNotFound``."""

    @abc.abstractmethod
    async def delete(self, key: str) -> None:
        """Delete; deleting a missing key is not an error."""

    @abc.abstractmethod
    async def list(self, prefix: str = "") -> list[str]:
        """All keys starting with ``prefix``, sorted."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""
