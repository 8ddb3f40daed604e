"""MQTT control packets (3.1.1 and 5.0) as slotted dataclasses.

One class per control packet type; the same classes serve both protocol levels (fields that
3.1.1 lacks — properties, most reason codes — are simply dropped when encoding for level 4 and
left at their defaults when decoding it).

Properties are a mapping keyed by snake_case property name (see
:mod:`flowmq_wire.mqtt.properties`). A packet without properties holds the shared, read-only
``EMPTY_PROPERTIES``, so the common case allocates nothing; the decoder returns a fresh ``dict``
otherwise. To change a decoded packet's properties, build a new dict
(``{**p.properties, "topic_alias": 3}``).
"""

from __future__ import annotations

import dataclasses
from array import array
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, ClassVar, NamedTuple, TypeVar

Properties = Mapping[str, Any]
"""Property name → value; ``user_property`` is a list of ``(key, value)`` pairs in wire order."""

EMPTY_PROPERTIES: Properties = MappingProxyType({})
"""Shared immutable empty property set; compares equal to ``{}``."""

# Control packet types (fixed header bits 7-4).
CONNECT = 1
CONNACK = 2
PUBLISH = 3
PUBACK = 4
PUBREC = 5
PUBREL = 6
PUBCOMP = 7
SUBSCRIBE = 8
SUBACK = 9
UNSUBSCRIBE = 10
UNSUBACK = 11
PINGREQ = 12
PINGRESP = 13
DISCONNECT = 14
AUTH = 15
WILL = 0
"""Pseudo packet type for the Will Properties of a CONNECT (type 0 is reserved on the wire)."""

PACKET_NAMES = {
    WILL: "Will",
    CONNECT: "CONNECT",
    CONNACK: "CONNACK",
    PUBLISH: "PUBLISH",
    PUBACK: "PUBACK",
    PUBREC: "PUBREC",
    PUBREL: "PUBREL",
    PUBCOMP: "PUBCOMP",
    SUBSCRIBE: "SUBSCRIBE",
    SUBACK: "SUBACK",
    UNSUBSCRIBE: "UNSUBSCRIBE",
    UNSUBACK: "UNSUBACK",
    PINGREQ: "PINGREQ",
    PINGRESP: "PINGRESP",
    DISCONNECT: "DISCONNECT",
    AUTH: "AUTH",
}

# Retain handling values of SubscriptionOptions (v5 §3.8.3.1).
RETAIN_SEND_ON_SUBSCRIBE = 0
RETAIN_SEND_IF_NEW_SUBSCRIPTION = 1
RETAIN_DO_NOT_SEND = 2


def _show(value: object) -> str:
    return "{}" if value is EMPTY_PROPERTIES else repr(value)


def _repr(record: Any) -> str:
    fields = ", ".join(
        f"{f.name}={_show(getattr(record, f.name))}" for f in dataclasses.fields(record)
    )
    return f"{record.__class__.__name__}({fields})"


_NO_PROPERTIES: Any = object()
"""Stands for ``EMPTY_PROPERTIES`` as the default of ``properties`` fields while dataclasses
builds a class (it refuses a default that is not hashable, as a mapping proxy is not);
``_record`` then puts the real default in place. A ``default_factory`` would need no such step
but costs every ``__init__`` a closure and a test: ~10% of building a PUBACK, on the decoder's
hot path."""

_R = TypeVar("_R", bound=type)


def _record(cls: _R) -> _R:
    """Packets and their parts are slotted dataclasses: value equality, no ``__dict__``, an
    ``__init__`` as cheap as a hand-written one, and ``_repr`` (``properties={}`` when empty)."""
    cls = dataclasses.dataclass(slots=True, repr=False)(cls)
    field = cls.__dataclass_fields__.get("properties")  # type: ignore[attr-defined]
    if field is not None and field.default is _NO_PROPERTIES:
        field.default = EMPTY_PROPERTIES  # subclasses inherit the field as it is now
        init = cls.__init__  # type: ignore[misc]
        init.__defaults__ = tuple(
            EMPTY_PROPERTIES if d is _NO_PROPERTIES else d for d in init.__defaults__
        )
    return cls


def _packet(packet_type: int | None = None) -> Callable[[_R], _R]:
    """Make a packet class a record; ``packet_type`` is its ``TYPE`` (None for a shared base)."""

    def make(cls: _R) -> _R:
        if packet_type is not None:
            cls.TYPE = packet_type
        return _record(cls)

    return make


class Packet:
    """Base of every control packet: ``TYPE`` is its fixed header type."""

    __slots__ = ()
    TYPE: ClassVar[int]
    __repr__ = _repr


@_record
class Will:
    """The Will Message of a CONNECT."""

    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    properties: Properties = _NO_PROPERTIES
    __repr__ = _repr


@_packet(CONNECT)
class Connect(Packet):
    """CONNECT. ``protocol_level`` is what the client sent (4 or 5); ``encode`` writes the level
    it is asked for. ``password`` is binary data; a 3.1.1 password requires a username."""

    client_id: str = ""
    clean_start: bool = True
    keep_alive: int = 60
    will: Will | None = None
    username: str | None = None
    password: bytes | None = None
    properties: Properties = _NO_PROPERTIES
    protocol_level: int = 4
    protocol_name: str = "MQTT"


@_packet(CONNACK)
class Connack(Packet):
    """CONNACK. At level 4 ``reason_code`` is the 3.1.1 return code (0-5); a v5 code given for
    a level-4 encode is mapped with ``connack_v5_to_v311``."""

    session_present: bool = False
    reason_code: int = 0
    properties: Properties = _NO_PROPERTIES


@_packet(PUBLISH)
class Publish(Packet):
    """PUBLISH. ``packet_id`` is ``None`` for QoS 0. In v5 ``topic`` may be ``""`` when the
    ``topic_alias`` property names a topic set earlier; resolving aliases is the session's job."""

    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int | None = None
    properties: Properties = _NO_PROPERTIES


PlainPublish = tuple[str, bytes, bytes]
"""A plain QoS 0 PUBLISH as ``MqttDecoder(plain_tuples=True)`` yields it: topic, payload, and
the whole packet as received (no retain, no DUP, no properties)."""

PlainPublish1 = list
"""A plain QoS 1 PUBLISH as ``MqttDecoder(plain_qos1=True)`` yields it: ``[topic, payload,
raw, packet_id]`` (no retain, no DUP, no properties; a list, not a tuple, so that its class
alone tells it from a ``PlainPublish``)."""

PlainPubacks = array
"""A run of plain PUBACKs (reason 0, no properties) as ``MqttDecoder(plain_qos1=True)``
yields it: their packet identifiers, in order, in an ``array("H")``."""


@_packet()
class _PubResponse(Packet):
    packet_id: int
    reason_code: int = 0
    properties: Properties = _NO_PROPERTIES


@_packet(PUBACK)
class Puback(_PubResponse):
    """PUBACK (QoS 1 acknowledgement)."""


@_packet(PUBREC)
class Pubrec(_PubResponse):
    """PUBREC (QoS 2, part 1)."""


@_packet(PUBREL)
class Pubrel(_PubResponse):
    """PUBREL (QoS 2, part 2)."""


@_packet(PUBCOMP)
class Pubcomp(_PubResponse):
    """PUBCOMP (QoS 2, part 3)."""


class SubscriptionOptions(NamedTuple):
    """Options of one SUBSCRIBE entry; 3.1.1 carries only ``qos``."""

    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = RETAIN_SEND_ON_SUBSCRIBE


@_packet(SUBSCRIBE)
class Subscribe(Packet):
    """SUBSCRIBE: ``subscriptions`` is a list of ``(topic_filter, SubscriptionOptions)``. The
    ``subscription_identifier`` property, if any, is a single ``int`` here."""

    packet_id: int
    subscriptions: list[tuple[str, SubscriptionOptions]]
    properties: Properties = _NO_PROPERTIES


@_packet()
class _SubscriptionAck(Packet):
    packet_id: int
    reason_codes: list[int] = dataclasses.field(default_factory=list)
    properties: Properties = _NO_PROPERTIES


@_packet(SUBACK)
class Suback(_SubscriptionAck):
    """SUBACK: one reason code (granted QoS or failure) per subscription, in order."""


@_packet(UNSUBSCRIBE)
class Unsubscribe(Packet):
    """UNSUBSCRIBE: a list of topic filters."""

    packet_id: int
    filters: list[str]
    properties: Properties = _NO_PROPERTIES


@_packet(UNSUBACK)
class Unsuback(_SubscriptionAck):
    """UNSUBACK: ``reason_codes`` exist only in v5 (empty list at level 4)."""


@_packet(PINGREQ)
class Pingreq(Packet):
    """PINGREQ."""


@_packet(PINGRESP)
class Pingresp(Packet):
    """PINGRESP."""


@_packet()
class _ReasonAndProperties(Packet):
    reason_code: int = 0
    properties: Properties = _NO_PROPERTIES


@_packet(DISCONNECT)
class Disconnect(_ReasonAndProperties):
    """DISCONNECT (v5 may carry a reason code and properties; 3.1.1 only the client sends it)."""


@_packet(AUTH)
class Auth(_ReasonAndProperties):
    """AUTH (v5 only): enhanced authentication exchange."""


PINGREQ_PACKET = Pingreq()
PINGRESP_PACKET = Pingresp()
"""Shared instances: the decoder returns these rather than allocating per ping."""

PACKET_CLASSES: dict[int, type[Packet]] = {
    cls.TYPE: cls
    for cls in (
        Connect,
        Connack,
        Publish,
        Puback,
        Pubrec,
        Pubrel,
        Pubcomp,
        Subscribe,
        Suback,
        Unsubscribe,
        Unsuback,
        Pingreq,
        Pingresp,
        Disconnect,
        Auth,
    )
}

__all__ = [
    "EMPTY_PROPERTIES",
    "PACKET_CLASSES",
    "PACKET_NAMES",
    "RETAIN_DO_NOT_SEND",
    "RETAIN_SEND_IF_NEW_SUBSCRIPTION",
    "RETAIN_SEND_ON_SUBSCRIBE",
    "Auth",
    "Connack",
    "Connect",
    "Disconnect",
    "Packet",
    "Pingreq",
    "Pingresp",
    "PlainPubacks",
    "PlainPublish",
    "PlainPublish1",
    "Properties",
    "Puback",
    "Pubcomp",
    "Publish",
    "Pubrec",
    "Pubrel",
    "Suback",
    "Subscribe",
    "SubscriptionOptions",
    "Unsuback",
    "Unsubscribe",
    "Will",
]
