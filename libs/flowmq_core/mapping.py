"""Protocol names ⇄ canonical topics (DESIGN.md §3).

Every protocol's names are translated to one canonical (MQTT-style) topic space so that one
routing engine serves all of them. Translations that cannot round trip, and distinct names
that would land on one canonical name, are rejected here — never silently merged.
"""

from __future__ import annotations

import re

from flowmq_core.errors import InvalidFilter, InvalidName, InvalidTopic, NameCollision
from flowmq_core.topics import validate_filter, validate_topic

KAFKA_MAX_NAME_LEN = 249
_KAFKA_NAME = re.compile(r"[a-zA-Z0-9._-]+")
_KAFKA_CANONICAL = re.compile(r"[a-zA-Z0-9_/-]+")

DEFAULT_EXCHANGE = ""
# Exchanges whose routing keys are published straight into the canonical space.
_UNPREFIXED_EXCHANGES = frozenset({"", "amq.topic", "amq.direct"})


# --- Kafka -----------------------------------------------------------------------------------


def validate_kafka_topic_name(name: str) -> None:
    """Kafka's own rules (``Topic.validate``), so we reject what a real Kafka would."""
    if not isinstance(name, str):
        raise InvalidName(f"Kafka topic name must be a str, not {type(name).__name__}")
    if not name:
        raise InvalidName("Kafka topic name is empty", details={"name": name})
    if name in (".", ".."):
        raise InvalidName(f"Kafka topic name cannot be {name!r}", details={"name": name})
    if len(name) > KAFKA_MAX_NAME_LEN:
        raise InvalidName(
            f"Kafka topic name is {len(name)} characters, longer than the maximum of "
            f"{KAFKA_MAX_NAME_LEN}",
            details={"name": name, "length": len(name), "max": KAFKA_MAX_NAME_LEN},
        )
    if not _KAFKA_NAME.fullmatch(name):
        raise InvalidName(
            f"Kafka topic name {name!r} contains characters other than ASCII letters, "
            "digits, '.', '_' and '-'",
            details={"name": name},
        )


def kafka_to_canonical(name: str) -> str:
    """A Kafka topic ``a.b`` is canonical topic ``a/b``; invalid Kafka names are rejected."""
    validate_kafka_topic_name(name)
    return name.replace(".", "/")


def canonical_to_kafka(topic: str) -> str:
    """Inverse of :func:`kafka_to_canonical`; raises if the result would not round trip."""
    if not isinstance(topic, str):
        raise InvalidName(f"topic must be a str, not {type(topic).__name__}")
    if "." in topic:
        raise InvalidName(
            f"topic {topic!r} contains '.', which has no Kafka spelling "
            "('.' in a Kafka name means '/')",
            details={"topic": topic},
        )
    if not _KAFKA_CANONICAL.fullmatch(topic):
        raise InvalidName(
            f"topic {topic!r} has no Kafka name: only ASCII letters, digits, '_', '-' and '/' "
            "can be expressed",
            details={"topic": topic},
        )
    name = topic.replace("/", ".")
    try:
        validate_kafka_topic_name(name)
    except InvalidName as e:
        raise InvalidName(
            f"topic {topic!r} has no Kafka name: {e.message}", details={"topic": topic}
        ) from None
    return name


# --- AMQP 0-9-1 ------------------------------------------------------------------------------


def _amqp_map(key: str) -> str:
    return key.replace(".", "/")


def _check_exchange(exchange: str) -> None:
    """Exchange names become the first canonical level, so they must be exactly one level."""
    if not isinstance(exchange, str):
        raise InvalidName(f"exchange name must be a str, not {type(exchange).__name__}")
    for ch, why in (("/", "'/'"), ("+", "'+'"), ("#", "'#'"), ("\x00", "U+0000")):
        if ch in exchange:
            raise InvalidName(
                f"exchange name {exchange!r} contains {why}, which cannot be mapped to a "
                "canonical topic level",
                details={"exchange": exchange},
            )


def _is_fanout(exchange: str, exchange_type: str) -> bool:
    return exchange_type == "fanout" or exchange == "amq.fanout"


def amqp_publish_topic(exchange: str, routing_key: str, exchange_type: str = "topic") -> str:
    """Canonical topic of a basic.publish; raises InvalidTopic if it is not publishable.

    Callers treat InvalidTopic as "unroutable" (drop, or basic.return when mandatory): AMQP
    accepts routing keys (empty, containing '#') that no canonical topic can represent.
    """
    if exchange in _UNPREFIXED_EXCHANGES:
        topic = _amqp_map(routing_key)
    else:
        _check_exchange(exchange)
        topic = (
            exchange
            if _is_fanout(exchange, exchange_type)
            else f"{exchange}/{_amqp_map(routing_key)}"
        )
    validate_topic(topic)
    return topic


def amqp_binding_filter(exchange: str, binding_key: str, exchange_type: str) -> str:
    """Canonical filter of a queue.bind, matching exactly what :func:`amqp_publish_topic` emits.

    AMQP's ``#`` matches zero or more words anywhere; MQTT's only at the end, so a ``#`` word
    that is not last is rejected rather than approximated.
    """
    if exchange == DEFAULT_EXCHANGE:
        raise InvalidName("queues cannot be bound to the default exchange", details={})
    if _is_fanout(exchange, exchange_type):
        _check_exchange(exchange)
        return exchange
    prefix = ""
    if exchange not in _UNPREFIXED_EXCHANGES:
        _check_exchange(exchange)
        prefix = exchange + "/"
    details = {"exchange": exchange, "binding_key": binding_key, "exchange_type": exchange_type}
    if exchange_type == "topic":
        words = binding_key.split(".")
        last = len(words) - 1
        out = []
        for i, word in enumerate(words):
            if word == "*":
                out.append("+")
            elif word == "#":
                if i != last:
                    raise InvalidFilter(
                        f"binding key {binding_key!r}: '#' is only supported as the last word",
                        details=details,
                    )
                out.append("#")
            elif "+" in word or "#" in word:
                raise InvalidFilter(
                    f"binding key {binding_key!r}: word {word!r} contains '+' or '#', which "
                    "cannot be expressed as a canonical filter",
                    details=details,
                )
            else:
                out.append(word)
        filt = prefix + "/".join(out)
    elif exchange_type == "direct":
        if "+" in binding_key or "#" in binding_key:
            raise InvalidFilter(
                f"direct binding key {binding_key!r} contains '+' or '#', which cannot be "
                "expressed as a canonical filter",
                details=details,
            )
        filt = prefix + _amqp_map(binding_key)
    else:
        raise InvalidFilter(
            f"exchange type {exchange_type!r} is not supported for bindings "
            "(supported: topic, direct, fanout)",
            details=details,
        )
    try:
        validate_filter(filt)
    except InvalidFilter as e:
        raise InvalidFilter(
            f"binding key {binding_key!r} on exchange {exchange!r}: {e.message}", details=details
        ) from None
    return filt


def amqp_queue_filter(queue_name: str) -> str:
    """The implicit binding of a declared queue: what the default exchange publishes to it."""
    topic = _amqp_map(queue_name) if isinstance(queue_name, str) else queue_name
    try:
        validate_topic(topic)
    except InvalidTopic as e:
        raise InvalidName(
            f"queue name {queue_name!r} cannot be mapped to a canonical topic: {e.message}",
            details={"queue": queue_name},
        ) from None
    return topic


# --- collisions ------------------------------------------------------------------------------


class NameRegistry:
    """Canonical name → original name, refusing two originals on one canonical name.

    With ``kafka_collisions`` (the default) names that differ only by '.' versus '_' also
    collide, as Kafka refuses them (its metric names cannot tell them apart). Canonically a
    Kafka '.' is '/', so the comparison key folds '_' into '/'.
    """

    __slots__ = ("_by_key", "_by_original", "_kafka_collisions")

    def __init__(self, *, kafka_collisions: bool = True) -> None:
        self._kafka_collisions = kafka_collisions
        self._by_key: dict[str, tuple[str, str]] = {}  # collision key -> (original, canonical)
        self._by_original: dict[str, str] = {}  # original -> canonical

    def _key(self, canonical: str) -> str:
        return canonical.replace("_", "/") if self._kafka_collisions else canonical

    def check(self, original: str, canonical: str) -> None:
        """Raise NameCollision if ``register`` would; registers nothing."""
        known = self._by_original.get(original)
        if known is not None and known != canonical:
            raise NameCollision(
                f"name {original!r} is already registered for canonical topic {known!r}",
                details={"name": original, "canonical": canonical, "existing_canonical": known},
            )
        hit = self._by_key.get(self._key(canonical))
        if hit is None or hit[0] == original:
            return
        other, other_canonical = hit
        if other_canonical == canonical:
            why = f"both map to canonical topic {canonical!r}"
        else:
            why = (
                f"they map to {canonical!r} and {other_canonical!r}, which differ only by "
                "'.' versus '_' and collide in Kafka"
            )
        raise NameCollision(
            f"name {original!r} collides with existing name {other!r}: {why}",
            details={
                "name": original,
                "canonical": canonical,
                "existing": other,
                "existing_canonical": other_canonical,
            },
        )

    def register(self, original: str, canonical: str) -> bool:
        """Claim ``canonical`` for ``original``; True if new, False if already identical."""
        self.check(original, canonical)
        if original in self._by_original:
            return False
        self._by_original[original] = canonical
        self._by_key[self._key(canonical)] = (original, canonical)
        return True

    def unregister(self, original: str) -> bool:
        """Release the name (destination deleted); False if it was not registered."""
        canonical = self._by_original.pop(original, None)
        if canonical is None:
            return False
        del self._by_key[self._key(canonical)]
        return True

    def original_of(self, canonical: str) -> str | None:
        hit = self._by_key.get(self._key(canonical))
        return hit[0] if hit is not None and hit[1] == canonical else None

    def canonical_of(self, original: str) -> str | None:
        return self._by_original.get(original)

    def __contains__(self, canonical: object) -> bool:
        """Whether this exact canonical name is registered (mapping semantics)."""
        return isinstance(canonical, str) and self.original_of(canonical) is not None

    def __len__(self) -> int:
        return len(self._by_original)

    def __repr__(self) -> str:
        return f"NameRegistry({len(self)} names)"


__all__ = [
    "KAFKA_MAX_NAME_LEN",
    "NameRegistry",
    "amqp_binding_filter",
    "amqp_publish_topic",
    "amqp_queue_filter",
    "canonical_to_kafka",
    "kafka_to_canonical",
    "validate_kafka_topic_name",
]
