"""Limits on the identifiers a client sends (DESIGN.md §13), checked at the protocol edge.

Every identifier a client controls ends up in meta-store keys: client ids in session keys,
filters in route and subscription keys, group and queue names in offset and index keys.  The
meta store refuses keys over 10,000 bytes (FoundationDB's limit, applied on every backend),
and a refused key inside a shared flush would fail every publisher in that flush.  So each
identifier is bounded where it enters, and the bounds are chosen so that the largest key —
a node id, a namespace, a client id and a ``$share/<group>/<filter>`` together — stays under
half the budget (``tests/unit/meta/test_key_budget.py`` packs every such key at the maxima).
Nothing an ordinary client sends comes near them: Kafka's topic names stop at 249
characters, AMQP's names at 255 bytes, and EMQX caps topics at 4,096 bytes and 128 levels.
"""

from __future__ import annotations

MAX_CLIENT_ID_BYTES = 256
"""MQTT client identifiers and Kafka client ids (UTF-8 bytes)."""

MAX_TOPIC_BYTES = 4096
"""Topics and topic filters, ``$share/<group>/`` included (UTF-8 bytes)."""

MAX_TOPIC_LEVELS = 128
"""Levels of a topic or filter: each one is a trie node and a cache entry."""

MAX_NAME_BYTES = 255
"""Namespace, stream, queue, consumer-group and shared-subscription group names."""


def utf8_size(text: str) -> int:
    """Bytes of ``text`` in UTF-8 (fast for ASCII, the common case)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def exceeded_topic_limit(text: str) -> str | None:
    """The limit a topic or filter exceeds (``topic_bytes``, ``topic_levels``), or None.
    One comparison for the usual topic: under ``MAX_TOPIC_LEVELS`` characters it can break
    neither limit (each extra level needs a ``/``)."""
    if len(text) < MAX_TOPIC_LEVELS:
        return None
    if utf8_size(text) > MAX_TOPIC_BYTES:
        return "topic_bytes"
    if text.count("/") >= MAX_TOPIC_LEVELS:
        return "topic_levels"
    return None
