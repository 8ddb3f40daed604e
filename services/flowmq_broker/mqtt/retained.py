"""Retained messages: kept in the meta store (the source of truth), cached in memory.

A retained message is stored as the one serialised message form
(``flowmq_core.message_codec``) behind a one-byte kind: small payloads live in the
meta-store value itself (``INLINE``); larger ones (the value limit is 100 kB) are put in the
object store under a content address, and the value holds the message without its payload
and the object's key (``IN_OBJECT``)::

    INLINE | message
    IN_OBJECT | key length u16 | key (UTF-8) | message with an empty payload

Values written before this form (JSON) are not read: they are skipped, with a warning, at load.

Each namespace holds at most ``max_messages`` retained topics and ``max_bytes`` of their
payloads (``mqtt_max_retained_messages``/``..._bytes``, DESIGN.md §13).  ``_usage`` is the
count and payload bytes of each namespace's cached messages, kept equal to the cache by
changing the cache only through ``_put`` and ``_drop``.  Only a new topic can be refused:
replacing or clearing one that is retained is always allowed, so a full namespace can still
be updated and emptied.  Messages other nodes retained (``remember``) and what is loaded at
start are counted but never refused: they are stored already.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import struct
import sys
import time
from collections.abc import Awaitable, Callable

import flowmq_metrics as metrics
from flowmq_core.errors import QuotaExceeded
from flowmq_core.log_throttle import LogThrottle
from flowmq_core.message import Message
from flowmq_core.message_codec import CorruptMessage, decode_message, encode_message
from flowmq_core.topics import matches
from flowmq_meta import keys
from flowmq_meta.api import MetaStore
from flowmq_objstore.api import ObjectStore

log = logging.getLogger(__name__)

INLINE_LIMIT = 64 * 1024
# A namespace's refusals are logged at most once per this many seconds (each is counted).
LOG_INTERVAL_S = 60.0
INLINE, IN_OBJECT = 0, 1
_U16 = struct.Struct(">H")


def encode_retained(message: Message, object_key: str | None = None) -> bytes:
    """The stored value of retained ``message``: inline, or pointing at ``object_key`` (where
    the payload is) — without the publisher's ``origin``, which means nothing once stored."""
    properties = message.properties
    if "origin" in properties:
        properties = {k: v for k, v in properties.items() if k != "origin"}
    if object_key is None:
        return bytes((INLINE,)) + encode_message(
            dataclasses.replace(message, retain=True, properties=properties)
        )
    key = object_key.encode()
    stored = dataclasses.replace(message, payload=b"", retain=True, properties=properties)
    return bytes((IN_OBJECT,)) + _U16.pack(len(key)) + key + encode_message(stored)


def decode_retained(value: bytes) -> tuple[Message, str | None]:
    """The message a stored value holds and the key of the object holding its payload (None:
    inline, the message is whole).  Raises ``CorruptMessage`` for anything else."""
    if not value:
        raise CorruptMessage("empty retained value")
    if value[0] == INLINE:
        return decode_message(memoryview(value)[1:]), None
    if value[0] == IN_OBJECT and len(value) >= 3:
        end = 3 + _U16.unpack_from(value, 1)[0]
        return decode_message(memoryview(value)[end:]), value[3:end].decode()
    raise CorruptMessage(f"unknown retained value kind {value[0]}")


def _object_of(value: bytes) -> str | None:
    """The object a stored value points at, if any (its message is not decoded)."""
    if len(value) >= 3 and value[0] == IN_OBJECT:
        return value[3 : 3 + _U16.unpack_from(value, 1)[0]].decode()
    return None


class RetainedStore:
    def __init__(
        self, meta: MetaStore, objects: ObjectStore, max_messages: int = 0, max_bytes: int = 0
    ) -> None:
        self.meta = meta
        self.objects = objects
        self.max_messages = max_messages or sys.maxsize  # per namespace; 0: no limit
        self.max_bytes = max_bytes or sys.maxsize
        self._cache: dict[tuple[str, str], Message] = {}
        self._usage: dict[str, list[int]] = {}  # namespace -> [messages, payload bytes]
        self._log = LogThrottle(LOG_INTERVAL_S)  # one line per namespace per interval
        # Told of every change made here (the broker tells the other nodes: DESIGN.md §6).
        self.on_change: Callable[[str, Message], None] | None = None

    async def load(self) -> None:
        begin, end = keys.RETAINED.range()
        rows = await self.meta.transact(lambda tr: tr.get_range(begin, end))
        for key, raw in rows:
            namespace, _ = keys.RETAINED.unpack(key)
            try:
                message, object_key = decode_retained(raw)
            except CorruptMessage as exc:
                log.warning("retained message %r not loaded: %s", key, exc)
                continue
            if object_key is not None:
                message.payload = await self.objects.get(object_key)
            self._put(namespace, message)

    def set(self, namespace: str, message: Message) -> Awaitable[None]:
        """Retain ``message`` (an empty payload clears the topic, as MQTT says): cached now,
        stored by the awaitable returned.  Raises ``QuotaExceeded`` (``retained_messages`` or
        ``retained_bytes``; counted and logged here, nothing changed) for a new topic past
        the namespace's limits."""
        topic = message.topic
        previous = self._cache.get((namespace, topic))
        if message.payload and previous is None:
            self._check_quota(namespace, len(message.payload))
        key = retained_key(namespace, topic)
        if self.on_change is not None:
            self.on_change(namespace, message)
        if not message.payload:
            self._drop(namespace, topic)
            return self._stored_or_undone(namespace, topic, previous, None, self._clear(key))
        cached = dataclasses.replace(message, retain=True)
        self._put(namespace, cached)
        return self._stored_or_undone(namespace, topic, previous, cached, self._store(key, message))

    async def _stored_or_undone(
        self,
        namespace: str,
        topic: str,
        previous: Message | None,
        cached: Message | None,
        storing: Awaitable[None],
    ) -> None:
        """Await ``storing``; if it fails, put the cache back as it was (unless a later change
        replaced ``cached`` meanwhile) and tell the other nodes so: what subscribers are given
        as retained is what is stored (DESIGN.md §13)."""
        try:
            await storing
        except BaseException:
            if self._cache.get((namespace, topic)) is cached:
                if previous is None:
                    self._drop(namespace, topic)
                else:
                    self._put(namespace, previous)
                if self.on_change is not None:
                    self.on_change(namespace, previous or Message(topic, b""))
            raise

    async def _store(self, key: bytes, message: Message) -> None:
        object_key = None
        if len(message.payload) > INLINE_LIMIT:
            object_key = f"retained/{hashlib.sha256(message.payload).hexdigest()}"
            await self.objects.put(object_key, message.payload)
        value = encode_retained(message, object_key)
        old = await self.meta.transact(lambda tr: _swap(tr, key, value))
        await self._delete_unreferenced(old, object_key)

    def remember(self, namespace: str, message: Message) -> None:
        """Cache a change another node made (and stored)."""
        if message.payload:
            self._put(namespace, dataclasses.replace(message, retain=True))
        else:
            self._drop(namespace, message.topic)

    def usage(self, namespace: str) -> tuple[int, int]:
        """Retained messages of ``namespace`` and their payload bytes."""
        messages, size = self._usage.get(namespace, (0, 0))
        return messages, size

    def _check_quota(self, namespace: str, size: int) -> None:
        messages, used = self.usage(namespace)
        if messages >= self.max_messages:
            limit, why = "retained_messages", f"{messages} retained messages"
        elif used + size > self.max_bytes:
            limit, why = "retained_bytes", f"{used} bytes of retained payloads"
        else:
            return
        refusal = QuotaExceeded(
            f"the namespace holds {why}: not retained", details={"limit": limit}
        )
        metrics.record_limit_refusal(refusal.details)
        if self._log.due(namespace):
            log.info(
                "namespace %s holds %s (mqtt_max_%s): new retained topics are not retained; "
                "further refusals for %.0f s are only counted (limits_rejections_count)",
                namespace,
                why,
                limit,
                LOG_INTERVAL_S,
            )
        raise refusal

    def _put(self, namespace: str, message: Message) -> None:
        usage = self._usage.setdefault(namespace, [0, 0])
        old = self._cache.get((namespace, message.topic))
        if old is None:
            usage[0] += 1
        else:
            usage[1] -= len(old.payload)
        usage[1] += len(message.payload)
        self._cache[(namespace, message.topic)] = message

    def _drop(self, namespace: str, topic: str) -> None:
        old = self._cache.pop((namespace, topic), None)
        if old is not None:
            usage = self._usage[namespace]
            usage[0] -= 1
            usage[1] -= len(old.payload)

    async def _clear(self, key: bytes) -> None:
        old = await self.meta.transact(lambda tr: _swap(tr, key, None))
        await self._delete_unreferenced(old, None)

    async def _delete_unreferenced(self, old: bytes | None, kept: str | None) -> None:
        # Content-addressed objects may be shared by several topics; a leftover object costs
        # only space, a deleted one that is still referenced loses a message — so check.
        if old is None:
            return
        previous = _object_of(old)
        if previous and previous != kept and not self._object_in_use(previous):
            await self.objects.delete(previous)

    def _object_in_use(self, object_key: str) -> bool:
        digest = object_key.removeprefix("retained/")
        return any(
            len(m.payload) > INLINE_LIMIT and hashlib.sha256(m.payload).hexdigest() == digest
            for m in self._cache.values()
        )

    def matching(self, namespace: str, topic_filter: str) -> list[Message]:
        now = time.time() * 1000
        found = []
        for (ns, topic), message in list(self._cache.items()):
            if ns != namespace or not matches(topic_filter, topic):
                continue
            if message.expiry_ms is not None and message.expiry_ms <= now:
                self._drop(ns, topic)
                continue
            found.append(message)
        return found


def retained_key(namespace: str, topic: str) -> bytes:
    """The meta-store key of a topic's retained message: topics are within
    ``flowmq_core.limits``, so every such key fits the key budget."""
    return keys.RETAINED.pack(namespace, topic)


def _swap(tr, key: bytes, value: bytes | None) -> bytes | None:
    old = tr.get(key)
    if value is None:
        tr.clear(key)
    else:
        tr.set(key, value)
    return old
