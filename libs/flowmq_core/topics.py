"""Canonical topic names and filters (MQTT syntax is the canonical form, DESIGN.md §3).

Validation happens once, where a name enters the system (publish, subscribe, destination
creation), so the routing trie can assume well-formed input on its hot path.
"""

from __future__ import annotations

from dataclasses import dataclass

from flowmq_core.errors import InvalidFilter, InvalidTopic
from flowmq_core.limits import MAX_NAME_BYTES, MAX_TOPIC_BYTES, MAX_TOPIC_LEVELS, utf8_size

SHARE_PREFIX = "$share/"
_SHARE_LEVEL = "$share"


def _check_common(text: str, what: str, exc: type[InvalidTopic] | type[InvalidFilter]) -> None:
    """Rules topics and filters share: type, non-empty, no U+0000, well-formed, length and
    levels within ``flowmq_core.limits``."""
    if not isinstance(text, str):
        raise exc(f"{what} must be a str, not {type(text).__name__}", details={what: repr(text)})
    if not text:
        raise exc(f"{what} is empty", details={what: text})
    if "\x00" in text:
        raise exc(f"{what} contains U+0000 (null character)", details={what: text})
    if text.isascii():
        size = len(text)
    else:
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError:
            # A lone surrogate cannot be encoded: MQTT requires well-formed UTF-8.
            raise exc(f"{what} is not valid UTF-8 (contains a surrogate code point)") from None
    if size > MAX_TOPIC_BYTES:
        raise exc(
            f"{what} is {size} UTF-8 bytes, longer than the maximum of {MAX_TOPIC_BYTES}",
            details={"length": size, "max": MAX_TOPIC_BYTES, "limit": "topic_bytes"},
        )
    levels = text.count("/") + 1
    if levels > MAX_TOPIC_LEVELS:
        raise exc(
            f"{what} has {levels} levels, more than the maximum of {MAX_TOPIC_LEVELS}",
            details={"levels": levels, "max": MAX_TOPIC_LEVELS, "limit": "topic_levels"},
        )


def validate_topic(topic: str) -> None:
    """Reject names that cannot be published to (MQTT 3.1.1 §4.7.3, 5.0 §4.7.3)."""
    _check_common(topic, "topic", InvalidTopic)
    if "+" in topic or "#" in topic:
        raise InvalidTopic(
            "topic contains a wildcard character ('+' or '#'); wildcards are only allowed in filters",
            details={"topic": topic},
        )


def decode_topic(raw: bytes | bytearray | memoryview) -> str:
    """Decode a topic taken off the wire, rejecting malformed UTF-8 as MQTT requires."""
    try:
        topic = bytes(raw).decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidTopic(
            f"topic is not valid UTF-8 ({e.reason} at byte {e.start})",
            details={"offset": e.start},
        ) from None
    validate_topic(topic)
    return topic


def validate_filter(filter: str) -> None:
    """Reject filters MQTT forbids (§4.7.1): misplaced '#', '+'/'#' sharing a level, etc.

    Empty levels ("a//b", "/a", "a/") are legal. ``$share/...`` is not unwrapped here; use
    :func:`validate_subscription_filter` for what a client may subscribe to.
    """
    _check_common(filter, "filter", InvalidFilter)
    if "+" not in filter and "#" not in filter:
        return
    levels = filter.split("/")
    last = len(levels) - 1
    for i, level in enumerate(levels):
        if "#" in level:
            if level != "#":
                raise InvalidFilter(
                    f"'#' must occupy a whole level, got level {level!r}",
                    details={"filter": filter, "level": i},
                )
            if i != last:
                raise InvalidFilter(
                    "'#' must be the last level of a filter",
                    details={"filter": filter, "level": i},
                )
        elif "+" in level and level != "+":
            raise InvalidFilter(
                f"'+' must occupy a whole level, got level {level!r}",
                details={"filter": filter, "level": i},
            )


def is_wildcard(filter: str) -> bool:
    """True if the filter can match more than one topic (valid filters only)."""
    return "+" in filter or "#" in filter


def matches(filter: str, topic: str) -> bool:
    """Reference matcher: deliberately naive, used as the oracle for the routing trie."""
    f_levels = filter.split("/")
    t_levels = topic.split("/")
    # Topics beginning with '$' are not matched by a leading wildcard (MQTT §4.7.2).
    if topic.startswith("$") and f_levels[0] in ("+", "#"):
        return False
    for i, f in enumerate(f_levels):
        if f == "#":
            return True  # zero or more remaining levels, so "a/#" matches "a"
        if i >= len(t_levels):
            return False
        if f != "+" and f != t_levels[i]:
            return False
    return len(f_levels) == len(t_levels)


@dataclass(frozen=True, slots=True)
class SharedFilter:
    """``$share/<group>/<filter>``: each matching message goes to one member of ``group``."""

    group: str
    filter: str

    def __str__(self) -> str:
        return f"{SHARE_PREFIX}{self.group}/{self.filter}"


def parse_shared(filter: str) -> SharedFilter | None:
    """Split a shared subscription (MQTT 5 §4.8.2); None if ``filter`` is not one.

    A first level of exactly ``$share`` always means a shared subscription, so malformed ones
    ("$share", "$share/g", "$share//a") are errors rather than silently becoming plain filters.
    """
    if not isinstance(filter, str):
        raise InvalidFilter(f"filter must be a str, not {type(filter).__name__}")
    if not filter.startswith(_SHARE_LEVEL) or (
        len(filter) > len(_SHARE_LEVEL) and filter[len(_SHARE_LEVEL)] != "/"
    ):
        return None
    rest = filter[len(SHARE_PREFIX) :]
    group, sep, inner = rest.partition("/")
    if not group:
        raise InvalidFilter(
            "shared subscription needs a non-empty group name: $share/<group>/<filter>",
            details={"filter": filter},
        )
    if not sep:
        raise InvalidFilter(
            "shared subscription has no topic filter after the group: $share/<group>/<filter>",
            details={"filter": filter},
        )
    if "+" in group or "#" in group:
        raise InvalidFilter(
            f"shared subscription group {group!r} must not contain '+' or '#'",
            details={"filter": filter, "group": group},
        )
    if utf8_size(group) > MAX_NAME_BYTES:
        raise InvalidFilter(
            f"shared subscription group name is longer than {MAX_NAME_BYTES} bytes",
            details={"max": MAX_NAME_BYTES, "limit": "name_bytes"},
        )
    _check_common(filter, "filter", InvalidFilter)  # length / NUL / UTF-8 of the whole thing
    try:
        validate_filter(inner)
    except InvalidFilter as e:
        raise InvalidFilter(
            f"shared subscription {filter!r}: {e.message}",
            details={"filter": filter, "group": group, **e.details},
        ) from None
    return SharedFilter(group, inner)


def validate_subscription_filter(filter: str) -> SharedFilter | None:
    """Validate what a client may subscribe to; returns the parsed shared filter, if any."""
    shared = parse_shared(filter)
    if shared is None:
        validate_filter(filter)
    return shared


__all__ = [
    "MAX_TOPIC_BYTES",
    "MAX_TOPIC_LEVELS",
    "SHARE_PREFIX",
    "SharedFilter",
    "decode_topic",
    "is_wildcard",
    "matches",
    "parse_shared",
    "validate_filter",
    "validate_subscription_filter",
    "validate_topic",
]
