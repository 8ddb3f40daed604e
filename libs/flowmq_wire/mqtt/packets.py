"""MQTT control packets (3.1.1 and 5.0) as plain ``__slots__`` objects.

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

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, ClassVar, NamedTuple

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


class Packet:
    """Base of every control packet: value equality and a readable repr over ``__slots__``."""

    __slots__ = ()
    TYPE: ClassVar[int]
    _fields: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Slots declared along the MRO, base first: Puback & co. inherit theirs.
        cls._fields = tuple(
            name for klass in reversed(cls.__mro__) for name in klass.__dict__.get("__slots__", ())
        )

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return all(getattr(self, f) == getattr(other, f) for f in self._fields)

    __hash__ = None  # type: ignore[assignment]  # mutable: lists and dicts inside

    def __repr__(self) -> str:
        fields = ", ".join(f"{f}={_show(getattr(self, f))}" for f in self._fields)
        return f"{self.__class__.__name__}({fields})"


class Will:
    """The Will Message of a CONNECT."""

    __slots__ = ("topic", "payload", "qos", "retain", "properties")
    _fields: ClassVar[tuple[str, ...]] = __slots__

    def __init__(
        self,
        topic: str,
        payload: bytes = b"",
        qos: int = 0,
        retain: bool = False,
        properties: Properties = EMPTY_PROPERTIES,
    ) -> None:
        self.topic = topic
        self.payload = payload
        self.qos = qos
        self.retain = retain
        self.properties = properties

    __eq__ = Packet.__eq__
    __hash__ = None  # type: ignore[assignment]
    __repr__ = Packet.__repr__


class Connect(Packet):
    """CONNECT. ``protocol_level`` is what the client sent (4 or 5); ``encode`` writes the level
    it is asked for. ``password`` is binary data; a 3.1.1 password requires a username."""

    __slots__ = (
        "client_id",
        "clean_start",
        "keep_alive",
        "will",
        "username",
        "password",
        "properties",
        "protocol_level",
        "protocol_name",
    )
    TYPE = CONNECT

    def __init__(
        self,
        client_id: str = "",
        clean_start: bool = True,
        keep_alive: int = 60,
        will: Will | None = None,
        username: str | None = None,
        password: bytes | None = None,
        properties: Properties = EMPTY_PROPERTIES,
        protocol_level: int = 4,
        protocol_name: str = "MQTT",
    ) -> None:
        self.client_id = client_id
        self.clean_start = clean_start
        self.keep_alive = keep_alive
        self.will = will
        self.username = username
        self.password = password
        self.properties = properties
        self.protocol_level = protocol_level
        self.protocol_name = protocol_name


class Connack(Packet):
    """CONNACK. At level 4 ``reason_code`` is the 3.1.1 return code (0-5); a v5 code given for
    a level-4 encode is mapped with ``connack_v5_to_v311``."""

    __slots__ = ("session_present", "reason_code", "properties")
    TYPE = CONNACK

    def __init__(
        self,
        session_present: bool = False,
        reason_code: int = 0,
        properties: Properties = EMPTY_PROPERTIES,
    ) -> None:
        self.session_present = session_present
        self.reason_code = reason_code
        self.properties = properties


class Publish(Packet):
    """PUBLISH. ``packet_id`` is ``None`` for QoS 0. In v5 ``topic`` may be ``""`` when the
    ``topic_alias`` property names a topic set earlier; resolving aliases is the session's job."""

    __slots__ = ("topic", "payload", "qos", "retain", "dup", "packet_id", "properties")
    TYPE = PUBLISH

    def __init__(
        self,
        topic: str,
        payload: bytes = b"",
        qos: int = 0,
        retain: bool = False,
        dup: bool = False,
        packet_id: int | None = None,
        properties: Properties = EMPTY_PROPERTIES,
    ) -> None:
        self.topic = topic
        self.payload = payload
        self.qos = qos
        self.retain = retain
        self.dup = dup
        self.packet_id = packet_id
        self.properties = properties


PlainPublish = tuple[str, bytes, bytes]
"""A plain QoS 0 PUBLISH as ``MqttDecoder(plain_tuples=True)`` yields it: topic, payload, and
the whole packet as received (no retain, no DUP, no properties)."""


class _PubResponse(Packet):
    __slots__ = ("packet_id", "reason_code", "properties")

    def __init__(
        self,
        packet_id: int,
        reason_code: int = 0,
        properties: Properties = EMPTY_PROPERTIES,
    ) -> None:
        self.packet_id = packet_id
        self.reason_code = reason_code
        self.properties = properties


class Puback(_PubResponse):
    """PUBACK (QoS 1 acknowledgement)."""

    __slots__ = ()
    TYPE = PUBACK


class Pubrec(_PubResponse):
    """PUBREC (QoS 2, part 1)."""

    __slots__ = ()
    TYPE = PUBREC


class Pubrel(_PubResponse):
    """PUBREL (QoS 2, part 2)."""

    __slots__ = ()
    TYPE = PUBREL


class Pubcomp(_PubResponse):
    """PUBCOMP (QoS 2, part 3)."""

    __slots__ = ()
    TYPE = PUBCOMP


class SubscriptionOptions(NamedTuple):
    """Options of one SUBSCRIBE entry; 3.1.1 carries only ``qos``."""

    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = RETAIN_SEND_ON_SUBSCRIBE


class Subscribe(Packet):
    """SUBSCRIBE: ``subscriptions`` is a list of ``(topic_filter, SubscriptionOptions)``. The
    ``subscription_identifier`` property, if any, is a single ``int`` here."""

    __slots__ = ("packet_id", "subscriptions", "properties")
    TYPE = SUBSCRIBE

    def __init__(
        self,
        packet_id: int,
        subscriptions: list[tuple[str, SubscriptionOptions]],
        properties: Properties = EMPTY_PROPERTIES,
    ) -> None:
        self.packet_id = packet_id
        self.subscriptions = subscriptions
        self.properties = properties


class _SubscriptionAck(Packet):
    __slots__ = ("packet_id", "reason_codes", "properties")

    def __init__(
        self,
        packet_id: int,
        reason_codes: list[int] | None = None,
        properties: Properties = EMPTY_PROPERTIES,
    ) -> None:
        self.packet_id = packet_id
        self.reason_codes = [] if reason_codes is None else reason_codes
        self.properties = properties


class Suback(_SubscriptionAck):
    """SUBACK: one reason code (granted QoS or failure) per subscription, in order."""

    __slots__ = ()
    TYPE = SUBACK


class Unsubscribe(Packet):
    """UNSUBSCRIBE: a list of topic filters."""

    __slots__ = ("packet_id", "filters", "properties")
    TYPE = UNSUBSCRIBE

    def __init__(
        self,
        packet_id: int,
        filters: list[str],
        properties: Properties = EMPTY_PROPERTIES,
    ) -> None:
        self.packet_id = packet_id
        self.filters = filters
        self.properties = properties


class Unsuback(_SubscriptionAck):
    """UNSUBACK: ``reason_codes`` exist only in v5 (empty list at level 4)."""

    __slots__ = ()
    TYPE = UNSUBACK


class Pingreq(Packet):
    """PINGREQ."""

    __slots__ = ()
    TYPE = PINGREQ


class Pingresp(Packet):
    """PINGRESP."""

    __slots__ = ()
    TYPE = PINGRESP


class _ReasonAndProperties(Packet):
    __slots__ = ("reason_code", "properties")

    def __init__(self, reason_code: int = 0, properties: Properties = EMPTY_PROPERTIES) -> None:
        self.reason_code = reason_code
        self.properties = properties


class Disconnect(_ReasonAndProperties):
    """DISCONNECT (v5 may carry a reason code and properties; 3.1.1 only the client sends it)."""

    __slots__ = ()
    TYPE = DISCONNECT


class Auth(_ReasonAndProperties):
    """AUTH (v5 only): enhanced authentication exchange."""

    __slots__ = ()
    TYPE = AUTH


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
    "PlainPublish",
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
