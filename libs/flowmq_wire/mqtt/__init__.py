"""MQTT 3.1.1 (protocol level 4) and 5.0 (level 5) codec: pure, incremental, no I/O.

    from flowmq_wire.mqtt import MqttDecoder, encode, Publish

    decoder = MqttDecoder()                   # server side: first packet must be CONNECT
    for packet in decoder.feed(data): ...     # every complete packet; the tail is kept
    out = encode(Publish("a/b", b"hi"), decoder.protocol_level)

Properties are mappings keyed by snake_case name (``EMPTY_PROPERTIES`` when there are none);
errors are :class:`MqttCodecError` subclasses carrying the v5 reason code to answer with.
"""

from flowmq_wire.mqtt import reason_codes
from flowmq_wire.mqtt.codec import *  # noqa: F403 (its __all__: decoder, encoders, errors)
from flowmq_wire.mqtt.codec import __all__ as _codec_names
from flowmq_wire.mqtt.packets import *  # noqa: F403 (its __all__: the packet model)
from flowmq_wire.mqtt.packets import __all__ as _packet_names
from flowmq_wire.mqtt.properties import PROPERTY_IDS, PROPERTY_NAMES

__all__ = [
    *_codec_names,
    *_packet_names,
    "PROPERTY_IDS",
    "PROPERTY_NAMES",
    "reason_codes",
]
