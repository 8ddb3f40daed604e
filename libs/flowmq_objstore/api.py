"""The object-store contract (DESIGN.md §8): put, ranged get, delete, list."""

from __future__ import annotations

import abc


class ObjectStoreError(Exception):
    pass


class ObjectNotFound(ObjectStoreError):
    pass


class ObjectStore(abc.ABC):
    url: str

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
