"""Hypothesis strategies for valid MQTT packets, per protocol level and direction.

"Valid" means exactly what the decoder accepts and returns unchanged, so that
``decode(encode(p)) == p``: e.g. no properties at level 4, ``packet_id is None`` iff QoS 0,
a password only with a username in 3.1.1, reason codes from the spec's table for the packet.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from flowmq_wire.mqtt import (
    Auth,
    Connack,
    Connect,
    Disconnect,
    Pingreq,
    Pingresp,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    SubscriptionOptions,
    Unsuback,
    Unsubscribe,
    Will,
)
from flowmq_wire.mqtt import reason_codes as rc
from flowmq_wire.mqtt.packets import (
    AUTH,
    CONNACK,
    CONNECT,
    DISCONNECT,
    PUBACK,
    PUBCOMP,
    PUBLISH,
    PUBREC,
    PUBREL,
    SUBACK,
    SUBSCRIBE,
    UNSUBACK,
    UNSUBSCRIBE,
    WILL,
)
from flowmq_wire.mqtt.primitives import MAX_VBI
from flowmq_wire.mqtt.properties import (
    BINARY,
    BYTE,
    PAIR,
    PROPERTY_TABLE,
    STRING,
    U16,
    U32,
    VBI,
)

# Well-formed UTF-8 without U+0000: no surrogates (they cannot be encoded), no NUL.
_chars = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")
text = st.text(_chars, max_size=12)
nonempty_text = st.text(_chars, min_size=1, max_size=12)
# Topic names as mqtt5 also accepts them: no wildcards.
topic_names = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00+#"),
    min_size=1,
    max_size=16,
)
_level_text = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00+#/"), max_size=6
)


@st.composite
def _filters(draw: st.DrawFn) -> str:
    levels = draw(st.lists(_level_text | st.just("+"), min_size=1, max_size=4))
    if draw(st.booleans()):
        levels.append("#")
    return "/".join(levels)


# Syntactically valid topic filters (mqtt5 rejects others; the decoder leaves syntax alone).
topic_filters = _filters().filter(bool)
binary = st.binary(max_size=24)
packet_ids = st.integers(1, 0xFFFF)

_ZERO_OR_ONE = {
    "request_problem_information",
    "request_response_information",
    "maximum_qos",
    "retain_available",
    "wildcard_subscription_available",
    "subscription_identifier_available",
    "shared_subscription_available",
}
_NON_ZERO = {"receive_maximum", "maximum_packet_size", "topic_alias"}


def _value_strategy(name: str, kind: int, ptype: int) -> st.SearchStrategy[Any]:
    if name in _ZERO_OR_ONE:
        return st.integers(0, 1)
    if name == "subscription_identifier":
        ids = st.integers(1, MAX_VBI)
        return st.lists(ids, min_size=1, max_size=3) if ptype == PUBLISH else ids
    low = 1 if name in _NON_ZERO else 0
    if kind == BYTE:
        return st.integers(low, 1 if name == "payload_format_indicator" else 0xFF)
    if kind == U16:
        return st.integers(low, 0xFFFF)
    if kind == U32:
        return st.integers(low, 0xFFFFFFFF)
    if kind == VBI:
        return st.integers(low, MAX_VBI)
    if name == "response_topic":  # a topic name: no wildcards (MQTT-3.3.2-14)
        return topic_names
    if kind == STRING:
        return text
    if kind == BINARY:
        return binary
    assert kind == PAIR
    return st.lists(st.tuples(text, text), min_size=1, max_size=3)


def properties(ptype: int, level: int, exclude: frozenset[str] = frozenset()) -> Any:
    """A random subset of the properties valid in ``ptype`` (nothing at level 4)."""
    if level == 4:
        return st.just({})
    optional = {
        name: _value_strategy(name, kind, ptype)
        for _, name, kind, where in PROPERTY_TABLE
        if ptype in where and name not in exclude
    }
    return st.fixed_dictionaries({}, optional=optional)


def _codes(codes: frozenset[int]) -> st.SearchStrategy[int]:
    return st.sampled_from(sorted(codes))


@st.composite
def wills(draw: st.DrawFn, level: int) -> Will:
    return Will(
        draw(topic_names),
        draw(binary),
        draw(st.integers(0, 2)),
        draw(st.booleans()),
        draw(properties(WILL, level)),
    )


@st.composite
def connects(draw: st.DrawFn, level: int) -> Connect:
    username = draw(st.none() | text)
    password = draw(st.none() | binary)
    if level == 4 and username is None:
        password = None
    return Connect(
        client_id=draw(text),
        clean_start=draw(st.booleans()),
        keep_alive=draw(st.integers(0, 0xFFFF)),
        will=draw(st.none() | wills(level)),
        username=username,
        password=password,
        properties=draw(properties(CONNECT, level)),
        protocol_level=level,
    )


@st.composite
def connacks(draw: st.DrawFn, level: int) -> Connack:
    codes = rc.CONNACK_REASON_CODES if level == 5 else rc.CONNACK_V311_RETURN_CODES
    code = draw(_codes(codes))
    return Connack(
        session_present=draw(st.booleans()) if code == 0 else False,
        reason_code=code,
        properties=draw(properties(CONNACK, level)),
    )


@st.composite
def publishes(draw: st.DrawFn, level: int) -> Publish:
    qos = draw(st.integers(0, 2))
    props = draw(properties(PUBLISH, level))
    topic = draw(topic_names)
    if "topic_alias" in props and draw(st.booleans()):
        topic = ""
    return Publish(
        topic=topic,
        payload=draw(st.binary(max_size=300)),
        qos=qos,
        retain=draw(st.booleans()),
        dup=draw(st.booleans()) if qos else False,
        packet_id=draw(packet_ids) if qos else None,
        properties=props,
    )


def _pub_response(cls: type, ptype: int, codes: frozenset[int], level: int) -> Any:
    if level == 4:
        return st.builds(cls, packet_ids)
    return st.builds(cls, packet_ids, _codes(codes), properties(ptype, level))


def pubacks(level: int) -> Any:
    return _pub_response(Puback, PUBACK, rc.PUBACK_REASON_CODES, level)


def pubrecs(level: int) -> Any:
    return _pub_response(Pubrec, PUBREC, rc.PUBREC_REASON_CODES, level)


def pubrels(level: int) -> Any:
    return _pub_response(Pubrel, PUBREL, rc.PUBREL_REASON_CODES, level)


def pubcomps(level: int) -> Any:
    return _pub_response(Pubcomp, PUBCOMP, rc.PUBCOMP_REASON_CODES, level)


@st.composite
def subscription_options(draw: st.DrawFn, level: int) -> SubscriptionOptions:
    qos = draw(st.integers(0, 2))
    if level == 4:
        return SubscriptionOptions(qos)
    return SubscriptionOptions(
        qos, draw(st.booleans()), draw(st.booleans()), draw(st.integers(0, 2))
    )


@st.composite
def subscribes(draw: st.DrawFn, level: int) -> Subscribe:
    subs = draw(
        st.lists(st.tuples(topic_filters, subscription_options(level)), min_size=1, max_size=4)
    )
    # No Local on a shared subscription is a protocol error the decoder rejects.
    subs = [(f, o._replace(no_local=False) if f.startswith("$share/") else o) for f, o in subs]
    return Subscribe(draw(packet_ids), subs, draw(properties(SUBSCRIBE, level)))


@st.composite
def subacks(draw: st.DrawFn, level: int) -> Suback:
    codes = rc.SUBACK_REASON_CODES if level == 5 else rc.SUBACK_V311_RETURN_CODES
    return Suback(
        draw(packet_ids),
        draw(st.lists(_codes(codes), min_size=1, max_size=5)),
        draw(properties(SUBACK, level)),
    )


def unsubscribes(level: int) -> Any:
    return st.builds(
        Unsubscribe,
        packet_ids,
        st.lists(topic_filters, min_size=1, max_size=4),
        properties(UNSUBSCRIBE, level),
    )


def unsubacks(level: int) -> Any:
    if level == 4:
        return st.builds(Unsuback, packet_ids)
    return st.builds(
        Unsuback,
        packet_ids,
        st.lists(_codes(rc.UNSUBACK_REASON_CODES), min_size=1, max_size=5),
        properties(UNSUBACK, level),
    )


def disconnects(level: int) -> Any:
    if level == 4:
        return st.just(Disconnect())
    return st.builds(Disconnect, _codes(rc.DISCONNECT_REASON_CODES), properties(DISCONNECT, level))


def auths() -> Any:
    return st.builds(Auth, _codes(rc.AUTH_REASON_CODES), properties(AUTH, 5))


def client_packets(level: int) -> Any:
    """Any packet a client sends after CONNECT."""
    options = [
        publishes(level),
        pubacks(level),
        pubrecs(level),
        pubrels(level),
        pubcomps(level),
        subscribes(level),
        unsubscribes(level),
        st.just(Pingreq()),
        disconnects(level),
    ]
    if level == 5:
        options.append(auths())
    return st.one_of(options)


def server_packets(level: int) -> Any:
    """Any packet a server sends."""
    options = [
        connacks(level),
        publishes(level),
        pubacks(level),
        pubrecs(level),
        pubrels(level),
        pubcomps(level),
        subacks(level),
        unsubacks(level),
        st.just(Pingresp()),
    ]
    if level == 5:
        options += [disconnects(level), auths()]
    return st.one_of(options)


levels = st.sampled_from([4, 5])
