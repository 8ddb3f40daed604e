"""Retained messages: kept in the meta store (the source of truth), cached in memory.

A retained message is stored as the one serialised message form
(``flowmq_core.message_codec``) behind a one-byte kind: small payloads live in the
meta-store value itself (``INLINE``); larger ones (the value limit is 100 kB) are put in the
object store under a content address, and the value holds the message without its payload
and the object's key (``IN_OBJECT``)::

    INLINE | message
    IN_OBJECT | key length u16 | key (UTF-8) | message with an empty payload

Values written before this form (JSON) are not read: they are skipped, with a warning, at load.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import struct
import time
from collections.abc import Callable

from flowmq_core.message import Message
from flowmq_core.message_codec import CorruptMessage, decode_message, encode_message
from flowmq_core.topics import matches
from flowmq_meta import keys
from flowmq_meta.api import MetaStore
from flowmq_objstore.api import ObjectStore

log = logging.getLogger(__name__)

INLINE_LIMIT = 64 * 1024
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
    def __init__(self, meta: MetaStore, objects: ObjectStore) -> None:
        self.meta = meta
        self.objects = objects
        self._cache: dict[tuple[str, str], Message] = {}
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
            self._cache[(namespace, message.topic)] = message

    async def set(self, namespace: str, message: Message) -> None:
        """Retain ``message`` (an empty payload clears the topic, as MQTT says)."""
        key = retained_key(namespace, message.topic)
        if self.on_change is not None:
            self.on_change(namespace, message)
        if not message.payload:
            self._cache.pop((namespace, message.topic), None)
            await self._clear(key)
            return
        object_key = None
        if len(message.payload) > INLINE_LIMIT:
            object_key = f"retained/{hashlib.sha256(message.payload).hexdigest()}"
            await self.objects.put(object_key, message.payload)
        value = encode_retained(message, object_key)
        self._cache[(namespace, message.topic)] = dataclasses.replace(message, retain=True)
        old = await self.meta.transact(lambda tr: _swap(tr, key, value))
        await self._delete_unreferenced(old, object_key)

    def remember(self, namespace: str, message: Message) -> None:
        """Cache a change another node made (and stored)."""
        if message.payload:
            self._cache[(namespace, message.topic)] = dataclasses.replace(message, retain=True)
        else:
            self._cache.pop((namespace, message.topic), None)

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
                del self._cache[(ns, topic)]
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
