"""Retained messages: kept in the meta store (the source of truth), cached in memory.

Small payloads live in the meta-store value; larger ones (the value limit is 100 kB) are put
in the object store and the value points at them.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import time
from collections.abc import Callable
from typing import Any

from flowmq_core.message import Message
from flowmq_core.topics import matches
from flowmq_meta import keys
from flowmq_meta.api import MetaStore
from flowmq_objstore.api import ObjectStore

INLINE_LIMIT = 64 * 1024
LONG_TOPIC = 1024  # characters; at most 4 kB of UTF-8


def message_to_record(message: Message) -> dict[str, Any]:
    props = {
        key: base64.b64encode(value).decode() if isinstance(value, bytes) else value
        for key, value in message.properties.items()
        if key != "origin"
    }
    return {
        "topic": message.topic,
        "qos": message.qos,
        "headers": [[k, base64.b64encode(v).decode()] for k, v in message.headers],
        "content_type": message.content_type,
        "expiry_ms": message.expiry_ms,
        "timestamp_ms": message.timestamp_ms,
        "properties": props,
        "binary_properties": [k for k, v in message.properties.items() if isinstance(v, bytes)],
    }


def record_to_message(record: dict[str, Any], payload: bytes) -> Message:
    binary = set(record.get("binary_properties", ()))
    props = {
        key: base64.b64decode(value) if key in binary else value
        for key, value in record.get("properties", {}).items()
    }
    return Message(
        topic=record["topic"],
        payload=payload,
        qos=record["qos"],
        retain=True,
        headers=[(k, base64.b64decode(v)) for k, v in record.get("headers", [])],
        content_type=record.get("content_type"),
        expiry_ms=record.get("expiry_ms"),
        timestamp_ms=record.get("timestamp_ms") or int(time.time() * 1000),
        properties=props,
        source_protocol="mqtt",
    )


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
            record = json.loads(raw)
            topic = record["topic"]
            if "object" in record:
                payload = await self.objects.get(record["object"])
            else:
                payload = base64.b64decode(record["payload"])
            self._cache[(namespace, topic)] = record_to_message(record, payload)

    async def set(self, namespace: str, message: Message) -> None:
        """Retain ``message`` (an empty payload clears the topic, as MQTT says)."""
        key = retained_key(namespace, message.topic)
        if self.on_change is not None:
            self.on_change(namespace, message)
        if not message.payload:
            self._cache.pop((namespace, message.topic), None)
            await self._clear(key)
            return
        record = message_to_record(message)
        if len(message.payload) > INLINE_LIMIT:
            digest = hashlib.sha256(message.payload).hexdigest()
            record["object"] = f"retained/{digest}"
            await self.objects.put(record["object"], message.payload)
        else:
            record["payload"] = base64.b64encode(message.payload).decode()
        value = json.dumps(record).encode()
        self._cache[(namespace, message.topic)] = dataclasses.replace(message, retain=True)
        old = await self.meta.transact(lambda tr: _swap(tr, key, value))
        await self._delete_unreferenced(old, record.get("object"))

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
        previous = json.loads(old).get("object")
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
    """The meta-store key of a topic's retained message.  Topics may be 65535 bytes but keys
    only 10 kB, so a long topic is keyed by its hash (the record holds the topic itself)."""
    if len(topic) <= LONG_TOPIC:
        return keys.RETAINED.pack(namespace, topic)
    return keys.RETAINED.pack(namespace, "#sha256:" + hashlib.sha256(topic.encode()).hexdigest())


def _swap(tr, key: bytes, value: bytes | None) -> bytes | None:
    old = tr.get(key)
    if value is None:
        tr.clear(key)
    else:
        tr.set(key, value)
    return old
