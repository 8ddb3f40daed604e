"""The destination catalog: namespaces, Streams and Queues as the meta store records them.

Each change is one transaction that validates, writes the record and its name-index
entries, and appends a change-log entry (``changelog.record_change``), so every broker can
replay it.  Name rules come from ``flowmq_core`` so the catalog, the adapters and the admin
API agree on them.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from flowmq_core.errors import AlreadyExists, FlowMQError, InvalidName, NameCollision, NotFound
from flowmq_core.mapping import (
    amqp_queue_filter,
    kafka_to_canonical,
    validate_kafka_topic_name,
)
from flowmq_core.topics import validate_filter
from flowmq_meta import keys
from flowmq_meta.api import MetaStore, Transaction
from flowmq_meta.changelog import read_version, record_change

DEFAULT_NAMESPACE = "default"
STREAM = "stream"
QUEUE = "queue"

# Kafka's default log.retention.hours (168 h); -1 means unbounded, as in Kafka.
DEFAULT_STREAM_RETENTION_MS = 7 * 24 * 3600 * 1000
DEFAULT_QUEUE_SHARDS = 4
DEFAULT_QUEUE_MAX_RETRIES = 5

# The options a new destination starts from, before the settings its creator gives (admin API
# body, AMQP x-arguments, Kafka topic configs).  Read-only: copy with ``dict(...)``.
STREAM_DEFAULT_OPTIONS: Mapping[str, Any] = MappingProxyType(
    {"partitions": 1, "retention_ms": DEFAULT_STREAM_RETENTION_MS, "retention_bytes": -1}
)
QUEUE_DEFAULT_OPTIONS: Mapping[str, Any] = MappingProxyType(
    {
        "max_size_mb": None,
        "message_ttl_seconds": None,
        "max_retries": DEFAULT_QUEUE_MAX_RETRIES,
        "dead_letter_topic": None,
        "shards": DEFAULT_QUEUE_SHARDS,
    }
)


class NotEmpty(FlowMQError):
    code = "not_empty"


@dataclasses.dataclass
class Destination:
    """One durable destination.  ``options`` holds the type's own settings."""

    type: str
    namespace: str
    name: str
    topic_filters: list[str]
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    created_at_ms: int = 0
    version: int = 0

    def to_json(self) -> bytes:
        return json.dumps(dataclasses.asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Destination:
        return cls(**json.loads(raw))


def validate_namespace_name(name: str) -> None:
    if not isinstance(name, str) or not 1 <= len(name) <= 64:
        raise InvalidName("namespace name must be 1 to 64 characters")
    if not all(ch.isascii() and (ch.isalnum() or ch in "-_") for ch in name):
        raise InvalidName(f"namespace name {name!r} may only contain a-z, A-Z, 0-9, '-' and '_'")


def validate_queue_name(name: str) -> None:
    """AMQP queue names (shortstr, at most 255 bytes) that map onto a valid canonical topic."""
    if not isinstance(name, str) or not name:
        raise InvalidName("queue name must not be empty")
    if len(name.encode()) > 255:
        raise InvalidName("queue name must be at most 255 bytes (AMQP shortstr)")
    if name.startswith("amq."):
        raise InvalidName(f"queue name {name!r} uses the reserved prefix 'amq.'")
    bad = sorted({ch for ch in name if ch in "+#/*" or ord(ch) < 0x20 or ord(ch) == 0x7F})
    if bad:
        raise InvalidName(f"queue name {name!r} contains characters not allowed: {''.join(bad)!r}")


def canonical_name(dest_type: str, name: str) -> str:
    """The canonical topic a destination's name occupies; two destinations may not share one."""
    if dest_type == STREAM:
        return kafka_to_canonical(name)
    return amqp_queue_filter(name)


def validate_destination(dest: Destination) -> None:
    validate_namespace_name(dest.namespace)
    if dest.type == STREAM:
        validate_kafka_topic_name(dest.name)
    elif dest.type == QUEUE:
        validate_queue_name(dest.name)
    else:
        raise InvalidName(f"unknown destination type {dest.type!r}")
    if not dest.topic_filters:
        raise InvalidName(f"{dest.type} {dest.name!r} needs at least one topic filter")
    for topic_filter in dest.topic_filters:
        validate_filter(topic_filter)


def _name_index_keys(dest: Destination) -> list[tuple[bytes, str]]:
    """Index keys that make a name unique within a namespace, with what each guards against."""
    canonical = canonical_name(dest.type, dest.name)
    entries = [(keys.DESTINATION_NAMES.pack(dest.namespace, "canonical", canonical), canonical)]
    if dest.type == STREAM:
        # Kafka refuses topics whose names differ only by '.' and '_' (their metric names
        # collide); a Kafka client would see the same here.
        folded = dest.name.replace(".", "_")
        entries.append((keys.DESTINATION_NAMES.pack(dest.namespace, "kafka", folded), folded))
    return entries


def _of_type(raw: bytes | None, dest_type: str) -> Destination | None:
    """The destination stored as ``raw`` if there is one and it is of ``dest_type``."""
    dest = None if raw is None else Destination.from_json(raw)
    return dest if dest is not None and dest.type == dest_type else None


class Catalog:
    def __init__(self, store: MetaStore) -> None:
        self.store = store

    # --- namespaces -------------------------------------------------------------------
    async def ensure_namespace(self, name: str = DEFAULT_NAMESPACE) -> None:
        validate_namespace_name(name)

        def txn(tr: Transaction) -> None:
            if tr.get(keys.NAMESPACES.pack(name)) is None:
                self._write_namespace(tr, name)

        await self.store.transact(txn)

    def _write_namespace(self, tr: Transaction, name: str) -> dict[str, Any]:
        record = {"name": name, "created_at_ms": int(time.time() * 1000)}
        tr.set(keys.NAMESPACES.pack(name), json.dumps(record).encode())
        record_change(tr, "namespace.created", {"name": name})
        return record

    async def create_namespace(self, name: str) -> dict[str, Any]:
        validate_namespace_name(name)

        def txn(tr: Transaction) -> dict[str, Any]:
            if tr.get(keys.NAMESPACES.pack(name)) is not None:
                raise AlreadyExists(f"namespace {name!r} already exists")
            return self._write_namespace(tr, name)

        return await self.store.transact(txn)

    async def list_namespaces(self) -> list[dict[str, Any]]:
        begin, end = keys.NAMESPACES.range()
        rows = await self.store.transact(lambda tr: tr.get_range(begin, end))
        return [json.loads(value) for _, value in rows]

    async def get_namespace(self, name: str) -> dict[str, Any]:
        raw = await self.store.get(keys.NAMESPACES.pack(name))
        if raw is None:
            raise NotFound(f"namespace {name!r} does not exist")
        return json.loads(raw)

    async def delete_namespace(self, name: str) -> None:
        if name == DEFAULT_NAMESPACE:
            raise NotEmpty("the default namespace cannot be deleted")

        def txn(tr: Transaction) -> None:
            if tr.get(keys.NAMESPACES.pack(name)) is None:
                raise NotFound(f"namespace {name!r} does not exist")
            begin, end = keys.DESTINATIONS.range(name)
            if tr.get_range(begin, end, limit=1):
                raise NotEmpty(f"namespace {name!r} still has destinations; delete them first")
            tr.clear(keys.NAMESPACES.pack(name))
            record_change(tr, "namespace.deleted", {"name": name})

        await self.store.transact(txn)

    # --- destinations -----------------------------------------------------------------
    async def create_destination(self, dest: Destination) -> Destination:
        validate_destination(dest)
        index = _name_index_keys(dest)

        def txn(tr: Transaction) -> Destination:
            if tr.get(keys.NAMESPACES.pack(dest.namespace)) is None:
                raise NotFound(f"namespace {dest.namespace!r} does not exist")
            existing = tr.get(keys.DESTINATIONS.pack(dest.namespace, dest.name))
            if existing is not None:
                other = Destination.from_json(existing)
                raise AlreadyExists(
                    f"{other.type} {dest.name!r} already exists in namespace {dest.namespace!r}"
                )
            for key, what in index:
                holder = tr.get(key)
                if holder is not None:
                    raise NameCollision(
                        f"{dest.type} name {dest.name!r} collides with existing destination "
                        f"{holder.decode()!r} (both map to {what!r})"
                    )
            created = dataclasses.replace(dest, created_at_ms=int(time.time() * 1000))
            for key, _ in index:
                tr.set(key, dest.name.encode())
            created.version = record_change(
                tr, "destination.created", {"namespace": dest.namespace, "name": dest.name}
            )
            tr.set(keys.DESTINATIONS.pack(dest.namespace, dest.name), created.to_json())
            return created

        return await self.store.transact(txn)

    async def update_destination(
        self,
        namespace: str,
        name: str,
        dest_type: str,
        change: Callable[[Destination], Destination],
    ) -> Destination:
        """Change a destination in one transaction: ``change`` gets the record as that
        transaction reads it and returns the new one, so an update committed meanwhile is
        built upon, never overwritten.  ``change`` may run more than once (a transaction is
        retried on conflict) and may raise to refuse; it cannot rename or retype.  A change
        that returns the record as it was writes nothing (no new metadata version)."""
        key = keys.DESTINATIONS.pack(namespace, name)

        def txn(tr: Transaction) -> Destination:
            current = _of_type(tr.get(key), dest_type)
            if current is None:
                raise NotFound(f"{dest_type} {name!r} does not exist in {namespace!r}")
            created_at_ms = current.created_at_ms
            changed = change(dataclasses.replace(current))
            if changed == current:
                return current
            if (changed.type, changed.namespace, changed.name) != (dest_type, namespace, name):
                raise InvalidName(f"an update cannot rename or retype {dest_type} {name!r}")
            validate_destination(changed)
            updated = dataclasses.replace(changed, created_at_ms=created_at_ms)
            updated.version = record_change(
                tr, "destination.updated", {"namespace": namespace, "name": name}
            )
            tr.set(key, updated.to_json())
            return updated

        return await self.store.transact(txn)

    async def get_destination(self, namespace: str, name: str, dest_type: str) -> Destination:
        dest = _of_type(await self.store.get(keys.DESTINATIONS.pack(namespace, name)), dest_type)
        if dest is None:
            raise NotFound(f"{dest_type} {name!r} does not exist in namespace {namespace!r}")
        return dest

    async def list_destinations(
        self, namespace: str | None = None, dest_type: str | None = None
    ) -> list[Destination]:
        begin, end = keys.DESTINATIONS.range(namespace) if namespace else keys.DESTINATIONS.range()
        rows = await self.store.transact(lambda tr: tr.get_range(begin, end))
        found = [Destination.from_json(value) for _, value in rows]
        return [d for d in found if dest_type is None or d.type == dest_type]

    async def delete_destination(self, namespace: str, name: str, dest_type: str) -> None:
        def txn(tr: Transaction) -> None:
            dest = _of_type(tr.get(keys.DESTINATIONS.pack(namespace, name)), dest_type)
            if dest is None:
                raise NotFound(f"{dest_type} {name!r} does not exist in namespace {namespace!r}")
            for key, _ in _name_index_keys(dest):
                tr.clear(key)
            tr.clear(keys.DESTINATIONS.pack(namespace, name))
            record_change(tr, "destination.deleted", {"namespace": namespace, "name": name})

        await self.store.transact(txn)

    async def snapshot(self) -> tuple[int, list[Destination]]:
        """Every destination and the metadata version they are current at, in one read."""

        def txn(tr: Transaction) -> tuple[int, list[Destination]]:
            begin, end = keys.DESTINATIONS.range()
            rows = tr.get_range(begin, end)
            return read_version(tr), [Destination.from_json(value) for _, value in rows]

        return await self.store.transact(txn)
