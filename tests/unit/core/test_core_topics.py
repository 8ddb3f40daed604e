import pytest

from flowmq_core.errors import FlowMQError, InvalidFilter, InvalidTopic
from flowmq_core.topics import (
    MAX_TOPIC_BYTES,
    MAX_TOPIC_LEVELS,
    SharedFilter,
    decode_topic,
    is_wildcard,
    matches,
    parse_shared,
    validate_filter,
    validate_subscription_filter,
    validate_topic,
)

# --- validate_topic ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "topic",
    [
        "a",
        "a/b/c",
        "/",
        "//",
        "a//b",
        "/a",
        "a/",
        "$SYS/broker",
        " ",
        "ünïcødé/✓",
        "a" * 4096,
        "/".join("a" * 128),
    ],
)
def test_validate_topic_accepts(topic):
    validate_topic(topic)


@pytest.mark.parametrize(
    ("topic", "fragment"),
    [
        ("", "empty"),
        ("a\x00b", "U\\+0000"),
        ("a/+/b", "wildcard"),
        ("a/#", "wildcard"),
        ("a+", "wildcard"),
        ("a" * 4097, "longer than"),
        ("é" * 2049, "longer than"),  # 4098 UTF-8 bytes, only 2049 characters
        ("/".join("a" * 129), "129 levels"),
        ("/" * 128, "129 levels"),
        ("a\ud800", "UTF-8"),
    ],
)
def test_validate_topic_rejects(topic, fragment):
    with pytest.raises(InvalidTopic, match=fragment) as ei:
        validate_topic(topic)
    assert ei.value.code == "invalid_topic"
    assert isinstance(ei.value, FlowMQError)
    assert isinstance(ei.value, ValueError)


def test_validate_topic_multibyte_at_limit():
    validate_topic("é" * 2047 + "ab")  # 4096 bytes exactly


def test_validate_topic_rejects_non_str():
    with pytest.raises(InvalidTopic, match="str"):
        validate_topic(b"a")  # type: ignore[arg-type]


def test_decode_topic():
    assert decode_topic("a/✓".encode()) == "a/✓"
    assert decode_topic(bytearray(b"x/y")) == "x/y"
    assert decode_topic(memoryview(b"x/y")) == "x/y"


@pytest.mark.parametrize(
    "raw",
    [
        b"\xff",  # never valid
        b"a\xc3",  # truncated sequence
        b"\xc0\xaf",  # overlong '/'
        b"\xed\xa0\x80",  # encoded surrogate U+D800
    ],
)
def test_decode_topic_rejects_invalid_utf8(raw):
    with pytest.raises(InvalidTopic, match="UTF-8"):
        decode_topic(raw)


def test_decode_topic_still_validates():
    with pytest.raises(InvalidTopic, match="wildcard"):
        decode_topic(b"a/#")
    with pytest.raises(InvalidTopic, match="empty"):
        decode_topic(b"")


# --- validate_filter ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "f",
    [
        "a",
        "#",
        "+",
        "a/#",
        "+/+",
        "+/#",
        "a/+/b",
        "/",
        "/#",
        "a//b",
        "/a",
        "a/",
        "+/",
        "$SYS/#",
        "$share/g/a",  # syntactically a plain filter; see validate_subscription_filter
    ],
)
def test_validate_filter_accepts(f):
    validate_filter(f)


@pytest.mark.parametrize(
    ("f", "fragment"),
    [
        ("", "empty"),
        ("a/#/b", "last level"),
        ("#/a", "last level"),
        ("a#", "whole level"),
        ("a/b#", "whole level"),
        ("##", "whole level"),
        ("a+", "whole level"),
        ("a/+b/c", "whole level"),
        ("++", "whole level"),
        ("+#", "whole level"),
        ("a\x00", "U\\+0000"),
        ("a" * 65536, "longer than"),
        ("\udc00", "UTF-8"),
    ],
)
def test_validate_filter_rejects(f, fragment):
    with pytest.raises(InvalidFilter, match=fragment) as ei:
        validate_filter(f)
    assert ei.value.code == "invalid_filter"


def test_is_wildcard():
    assert is_wildcard("a/+")
    assert is_wildcard("#")
    assert not is_wildcard("a/b")
    assert not is_wildcard("$SYS/x")


# --- matches (the oracle itself) -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("f", "t", "expected"),
    [
        ("a/b", "a/b", True),
        ("a/b", "a/c", False),
        ("a/b", "a/b/c", False),
        ("a/b/c", "a/b", False),
        ("A", "a", False),  # case-sensitive
        ("+", "a", True),
        ("+", "", True),  # '+' matches an empty level
        ("+", "a/b", False),
        ("+/+", "/", True),
        ("/+", "/", True),
        ("a/+", "a", False),
        ("a/+", "a/", True),
        ("a/+/c", "a//c", True),
        ("#", "a", True),
        ("#", "a/b/c", True),
        ("#", "/", True),
        ("a/#", "a", True),  # '#' matches the parent level too
        ("a/#", "a/b/c", True),
        ("a/#", "ab", False),
        ("+/#", "a", True),
        ("a//#", "a", False),
        ("a//#", "a/", True),
        ("#", "$SYS/x", False),
        ("+/x", "$SYS/x", False),
        ("+", "$SYS", False),
        ("$SYS/#", "$SYS/x", True),
        ("$SYS/+", "$SYS/x", True),
        ("a/#", "a/$x", True),  # '$' matters only in the first level
        ("a/+", "a/$x", True),
    ],
)
def test_matches(f, t, expected):
    assert matches(f, t) is expected


# --- shared subscriptions -------------------------------------------------------------------------


def test_parse_shared():
    assert parse_shared("$share/g/a/b") == SharedFilter("g", "a/b")
    assert parse_shared("$share/g/#") == SharedFilter("g", "#")
    assert parse_shared("$share/g/+/x") == SharedFilter("g", "+/x")
    assert parse_shared("$share/g//") == SharedFilter("g", "/")
    assert str(SharedFilter("g", "a/+")) == "$share/g/a/+"
    # not shared at all
    assert parse_shared("a/b") is None
    assert parse_shared("$SYS/x") is None
    assert parse_shared("$sharex/g/a") is None
    assert parse_shared("x/$share/g/a") is None


@pytest.mark.parametrize(
    ("f", "fragment"),
    [
        ("$share", "non-empty group"),
        ("$share/", "non-empty group"),
        ("$share//a", "non-empty group"),
        ("$share/g", "no topic filter"),
        ("$share/g/", "empty"),
        ("$share/g+/a", "must not contain"),
        ("$share/#/a", "must not contain"),
        ("$share/g/a/#/b", "last level"),
        ("$share/g/a+", "whole level"),
        ("$share/g\x00/a", "U\\+0000"),
        ("$share/g/" + "a" * 4096, "longer than"),
        ("$share/g/" + "a/" * 127 + "a", "levels"),
        ("$share/" + "g" * 256 + "/a", "longer than 255 bytes"),
    ],
)
def test_parse_shared_rejects(f, fragment):
    with pytest.raises(InvalidFilter, match=fragment):
        parse_shared(f)


def test_shared_filter_is_frozen():
    sf = SharedFilter("g", "a")
    with pytest.raises(AttributeError):
        sf.group = "h"  # type: ignore[misc]
    assert hash(sf) == hash(SharedFilter("g", "a"))


def test_validate_subscription_filter():
    assert validate_subscription_filter("a/+") is None
    assert validate_subscription_filter("$share/g/a/+") == SharedFilter("g", "a/+")
    with pytest.raises(InvalidFilter):
        validate_subscription_filter("a/#/b")
    with pytest.raises(InvalidFilter):
        validate_subscription_filter("$share/g")
    with pytest.raises(InvalidFilter, match="str"):
        validate_subscription_filter(None)  # type: ignore[arg-type]


def test_topic_limits_are_emqx_defaults():
    """4,096 bytes and 128 levels, as EMQX ships (``mqtt.max_topic_levels``); the meta-store
    key budget test holds them to the 10,000-byte keys."""
    assert MAX_TOPIC_BYTES == 4096
    assert MAX_TOPIC_LEVELS == 128
