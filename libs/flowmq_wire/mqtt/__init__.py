"""MQTT 3.1.1 (protocol level 4) and 5.0 (level 5) codec: pure, incremental, no I/O.

    from flowmq_wire.mqtt import MqttDecoder, encode, Publish

    decoder = MqttDecoder()                   # server side: first packet must be CONNECT
    for packet in decoder.feed(data): ...     # every complete packet; the tail is kept
    out = encode(Publish("a/b", b"hi"), decoder.protocol_level)

Properties are mappings keyed by snake_case name (``EMPTY_PROPERTIES`` when there are none);
errors are :class:`MqttCodecError` subclasses carrying the v5 reason code to answer with.
"""

from flowmq_wire.mqtt import reason_codes
from flowmq_wire.mqtt.codec import (
    DEFAULT_MAX_PACKET_SIZE,
    MAX_PACKET_SIZE,
    MqttDecoder,
    PreparedPublish,
    encode,
    encode_publish,
)
from flowmq_wire.mqtt.errors import (
    MalformedPacket,
    MqttCodecError,
    PacketTooLarge,
    ProtocolViolation,
    UnsupportedProtocolVersion,
)
from flowmq_wire.mqtt.packets import (
    EMPTY_PROPERTIES,
    PACKET_CLASSES,
    PACKET_NAMES,
    RETAIN_DO_NOT_SEND,
    RETAIN_SEND_IF_NEW_SUBSCRIPTION,
    RETAIN_SEND_ON_SUBSCRIBE,
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
    Pingreq,
    Pingresp,
    Properties,
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
from flowmq_wire.mqtt.properties import PROPERTY_IDS, PROPERTY_NAMES

__all__ = [
    "DEFAULT_MAX_PACKET_SIZE",
    "EMPTY_PROPERTIES",
    "MAX_PACKET_SIZE",
    "PACKET_CLASSES",
    "PACKET_NAMES",
    "PROPERTY_IDS",
    "PROPERTY_NAMES",
    "RETAIN_DO_NOT_SEND",
    "RETAIN_SEND_IF_NEW_SUBSCRIPTION",
    "RETAIN_SEND_ON_SUBSCRIBE",
    "Auth",
    "Connack",
    "Connect",
    "Disconnect",
    "MalformedPacket",
    "MqttCodecError",
    "MqttDecoder",
    "Packet",
    "PacketTooLarge",
    "Pingreq",
    "Pingresp",
    "PreparedPublish",
    "Properties",
    "ProtocolViolation",
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
    "UnsupportedProtocolVersion",
    "Will",
    "encode",
    "encode_publish",
    "reason_codes",
]
