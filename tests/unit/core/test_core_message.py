import time

import pytest

from flowmq_core.errors import (
    AlreadyExists,
    FlowMQError,
    InvalidFilter,
    InvalidName,
    InvalidTopic,
    NameCollision,
    NotFound,
)
from flowmq_core.message import Message, now_ms


@pytest.mark.parametrize(
    ("cls", "code"),
    [
        (InvalidTopic, "invalid_topic"),
        (InvalidFilter, "invalid_filter"),
        (InvalidName, "invalid_name"),
        (NameCollision, "name_collision"),
        (NotFound, "not_found"),
        (AlreadyExists, "already_exists"),
    ],
)
def test_error_codes(cls, code):
    e = cls("boom", details={"x": 1})
    assert isinstance(e, FlowMQError)
    assert e.code == cls.code == code
    assert str(e) == e.message == "boom"
    assert e.details == {"x": 1}
    assert e.to_dict() == {"code": code, "message": "boom", "details": {"x": 1}}


def test_error_details_default_and_copy():
    assert FlowMQError("m").details == {}
    d = {"a": 1}
    e = NotFound("m", details=d)
    d["b"] = 2
    assert e.details == {"a": 1}
    with pytest.raises(TypeError):
        FlowMQError("m", {"positional": "details"})  # type: ignore[misc]


def test_message_defaults():
    before = now_ms()
    m = Message("a/b", b"x")
    after = now_ms()
    assert (m.qos, m.retain, m.key, m.content_type, m.expiry_ms) == (0, False, None, None, None)
    assert m.headers == [] and m.properties == {} and m.source_protocol == ""
    assert before <= m.timestamp_ms <= after
    assert abs(m.timestamp_ms - time.time() * 1000) < 5000
    # mutable defaults are not shared
    m.headers.append(("k", b"v"))
    assert Message("a", b"").headers == []
    assert not hasattr(m, "__dict__")  # slots


def test_message_expiry():
    m = Message("a", b"", expiry_ms=1000)
    assert not m.is_expired(999)
    assert m.is_expired(1000)
    assert not Message("a", b"").is_expired(10**15)
    assert Message("a", b"", expiry_ms=1).is_expired()
