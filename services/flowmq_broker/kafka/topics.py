"""Kafka topics = Streams of one namespace (DESIGN.md §3; one manager per tenant,
``tenants.py``): look-up from the router's in-memory catalog copy, and create / delete /
grow through the catalog.

Every change is committed to the catalog first and then ``broker.metadata_changed()`` makes
this broker route by it at once; other brokers follow through their catalog sync.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid
from collections.abc import Iterable
from typing import Any

from flowmq_broker.routing import Binding
from flowmq_broker.services import BrokerServices
from flowmq_core.errors import AlreadyExists, InvalidName, NameCollision, NotFound
from flowmq_core.mapping import kafka_to_canonical, validate_kafka_topic_name
from flowmq_kas3.retention import delete_partition
from flowmq_meta.catalog import (
    DEFAULT_NAMESPACE,
    STREAM,
    STREAM_DEFAULT_OPTIONS,
    Destination,
)
from flowmq_wire.kafka import ErrorCode

log = logging.getLogger(__name__)

DEFAULT_PARTITIONS = 1  # Kafka's num.partitions
MAX_PARTITIONS = 1024  # as the admin API
_TOPIC_ID_NAMESPACE = uuid.UUID("5b0a7c6e-3f1d-4c59-9a57-6b9f0f6c1e21")


class TopicError(Exception):
    """A topic operation refused with a Kafka error code and a message for the client."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def partition_count(dest: Destination) -> int:
    return int(dest.options.get("partitions", 1))


def _int_config(name: str, raw: str | None) -> int:
    try:
        value = int(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise TopicError(
            ErrorCode.INVALID_CONFIG, f"{name} must be an integer, not {raw!r}"
        ) from None
    if value < -1:
        raise TopicError(ErrorCode.INVALID_CONFIG, f"{name} must be -1 or more, not {value}")
    return value


def options_from_configs(
    configs: Iterable[tuple[str, str | None]], partitions: int
) -> dict[str, Any]:
    """Stream options from CreateTopics configs: the retention settings are kept, the
    settings with a fixed meaning here are checked, the rest (replication, segment sizes)
    have no effect on a Stream and are accepted as Kafka accepts them."""
    options: dict[str, Any] = dict(STREAM_DEFAULT_OPTIONS, partitions=partitions)
    for name, value in configs:
        if name == "retention.ms":
            options["retention_ms"] = _int_config(name, value)
        elif name == "retention.bytes":
            options["retention_bytes"] = _int_config(name, value)
        elif name == "cleanup.policy" and value != "delete":
            raise TopicError(
                ErrorCode.INVALID_CONFIG,
                f"cleanup.policy={value} is not supported: Streams only delete by retention",
            )
    return options


class TopicManager:
    def __init__(self, services: BrokerServices, namespace: str = DEFAULT_NAMESPACE) -> None:
        self.services = services
        self.namespace = namespace
        self.auto_create = services.config.kafka_auto_create_topics
        self._ids: dict[tuple[str, int], uuid.UUID] = {}
        self._by_id: dict[uuid.UUID, str] = {}
        self._creating: dict[str, asyncio.Future[Destination]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.on_deleted: list[Any] = []  # async callbacks(name): forget state kept per topic

    # -- look-up (memory only) -----------------------------------------------------------------

    def get(self, name: str) -> Destination | None:
        return self.services.router.destination(Binding(STREAM, self.namespace, name))

    def all(self) -> list[Destination]:
        found = [
            d
            for d in self.services.router.destinations()
            if d.type == STREAM and d.namespace == self.namespace
        ]
        found.sort(key=lambda d: d.name)
        return found

    def topic_id(self, dest: Destination) -> uuid.UUID:
        """A topic id every broker derives alike, new when a topic of the same name is
        created again (Kafka never reuses one)."""
        key = (dest.name, dest.created_at_ms)
        tid = self._ids.get(key)
        if tid is None:
            tid = uuid.uuid5(
                _TOPIC_ID_NAMESPACE, f"{dest.namespace}/{dest.name}/{dest.created_at_ms}"
            )
            self._ids[key] = tid
            self._by_id[tid] = dest.name
        return tid

    def by_id(self, tid: uuid.UUID) -> Destination | None:
        name = self._by_id.get(tid)
        if name is None:
            for dest in self.all():
                self.topic_id(dest)
            name = self._by_id.get(tid)
        dest = self.get(name) if name is not None else None
        return dest if dest is not None and self.topic_id(dest) == tid else None

    @staticmethod
    def name_error(name: str | None) -> TopicError | None:
        try:
            validate_kafka_topic_name(name)  # type: ignore[arg-type]
        except InvalidName as exc:
            return TopicError(ErrorCode.INVALID_TOPIC_EXCEPTION, exc.message)
        return None

    # -- changes -------------------------------------------------------------------------------

    async def create(
        self,
        name: str,
        partitions: int = -1,
        configs: Iterable[tuple[str, str | None]] = (),
        *,
        validate_only: bool = False,
        notify: bool = True,
    ) -> Destination:
        """A Stream named ``name`` bound to its canonical topic.  Raises ``TopicError``."""
        error = self.name_error(name)
        if error is not None:
            raise error
        if partitions == -1:
            partitions = DEFAULT_PARTITIONS
        if not 1 <= partitions <= MAX_PARTITIONS:
            raise TopicError(
                ErrorCode.INVALID_PARTITIONS,
                f"number of partitions must be 1 to {MAX_PARTITIONS}, not {partitions}",
            )
        options = options_from_configs(configs, partitions)
        dest = Destination(STREAM, self.namespace, name, [kafka_to_canonical(name)], options)
        if validate_only:
            if self.get(name) is not None:
                raise TopicError(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists")
            return dest
        try:
            created = await self.services.catalog.create_destination(dest)
        except AlreadyExists as exc:
            raise TopicError(ErrorCode.TOPIC_ALREADY_EXISTS, exc.message) from None
        except (NameCollision, InvalidName) as exc:
            raise TopicError(ErrorCode.INVALID_TOPIC_EXCEPTION, exc.message) from None
        if notify:
            await self.services.metadata_changed()
        log.info("kafka: created topic %s with %d partitions", name, partitions)
        return created

    async def ensure(self, names: Iterable[str]) -> dict[str, Destination | TopicError]:
        """Auto-create (``auto.create.topics.enable``): each missing, valid name becomes a
        Stream with the default settings; concurrent requests for one name share one
        creation.  Returns the destination or the error per name."""
        out: dict[str, Destination | TopicError] = {}
        mine: list[str] = []
        waits: dict[str, asyncio.Future[Destination]] = {}
        loop = asyncio.get_running_loop()
        for name in dict.fromkeys(names):
            dest = self.get(name)
            if dest is not None:
                out[name] = dest
                continue
            error = self.name_error(name)
            if error is not None:
                out[name] = error
                continue
            if not self.auto_create:
                out[name] = TopicError(
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist"
                )
                continue
            pending = self._creating.get(name)
            if pending is None:
                pending = self._creating[name] = loop.create_future()
                mine.append(name)
            waits[name] = pending
        if mine:
            # The creation is not the requester's: a client that disconnects (cancelling its
            # request) must not leave the other waiters for these names hanging.
            task = loop.create_task(self._create_batch(mine), name="kafka-auto-create")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        for name, fut in waits.items():
            try:
                out[name] = await asyncio.shield(fut)
            except TopicError as exc:
                out[name] = exc
            except Exception as exc:  # the catalog (meta store) failed: retriable for clients
                log.warning("kafka: cannot create topic %s: %s", name, exc)
                out[name] = TopicError(ErrorCode.UNKNOWN_SERVER_ERROR, str(exc))
        return out

    async def _create_batch(self, names: list[str]) -> None:
        results: list[Any] = []
        try:
            results = await asyncio.gather(
                *(self.create(n, notify=False) for n in names), return_exceptions=True
            )
            await self.services.metadata_changed()
        except Exception as exc:
            log.warning("kafka: auto-created topics may route late: %s", exc)
        finally:
            for i, name in enumerate(names):
                fut = self._creating.pop(name)
                result = results[i] if i < len(results) else None
                if isinstance(result, TopicError) and result.code == ErrorCode.TOPIC_ALREADY_EXISTS:
                    existing = self.get(name)  # created meanwhile by someone else
                    result = existing if existing is not None else result
                if result is None:
                    result = TopicError(
                        ErrorCode.UNKNOWN_SERVER_ERROR, "topic creation interrupted"
                    )
                if fut.done():
                    continue
                if isinstance(result, BaseException):
                    fut.set_exception(result)
                    fut.exception()  # retrieved here; the waiters re-raise it
                else:
                    fut.set_result(result)

    async def delete(self, name: str) -> None:
        """Remove the Stream, then its data and the state kept per topic (group offsets,
        producer sequences), so a topic created again under the name starts empty."""
        dest = self.get(name)
        try:
            if dest is None:
                dest = await self.services.catalog.get_destination(self.namespace, name, STREAM)
            await self.services.catalog.delete_destination(self.namespace, name, STREAM)
        except NotFound:
            raise TopicError(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist"
            ) from None
        await self.services.metadata_changed()
        for partition in range(partition_count(dest)):
            await delete_partition(self.services.meta, (self.namespace, name, partition))
        for callback in self.on_deleted:
            await callback(name)
        log.info("kafka: deleted topic %s", name)

    async def add_partitions(self, name: str, count: int, *, validate_only: bool = False) -> None:
        dest = self.get(name)
        if dest is None:
            raise TopicError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist")
        current = partition_count(dest)
        if count <= current:
            raise TopicError(
                ErrorCode.INVALID_PARTITIONS,
                f"topic {name!r} has {current} partitions; partitions can only grow "
                f"(asked for {count})",
            )
        if count > MAX_PARTITIONS:
            raise TopicError(
                ErrorCode.INVALID_PARTITIONS, f"at most {MAX_PARTITIONS} partitions per topic"
            )
        if validate_only:
            return

        def grow(latest: Destination) -> Destination:
            # Re-checked on the record the transaction reads: another broker may have grown it.
            if count <= partition_count(latest):
                raise TopicError(
                    ErrorCode.INVALID_PARTITIONS,
                    f"topic {name!r} has {partition_count(latest)} partitions; partitions can "
                    f"only grow (asked for {count})",
                )
            return dataclasses.replace(latest, options={**latest.options, "partitions": count})

        try:
            await self.services.catalog.update_destination(self.namespace, name, STREAM, grow)
        except NotFound:
            raise TopicError(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist"
            ) from None
        await self.services.metadata_changed()


__all__ = [
    "DEFAULT_PARTITIONS",
    "MAX_PARTITIONS",
    "TopicError",
    "TopicManager",
    "options_from_configs",
    "partition_count",
]
