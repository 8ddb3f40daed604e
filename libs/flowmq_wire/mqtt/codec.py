"""Incremental MQTT 3.1.1 / 5.0 decoder and encoders.

Decoding: one :class:`MqttDecoder` per connection. ``feed(data)`` returns every complete packet
in ``data`` (plus what was kept from earlier calls) and keeps the incomplete tail, so a broker's
``data_received`` parses all packets of one read in one call. On the server side the decoder
learns the protocol level from CONNECT and applies it to everything after.

Encoding: ``encode(packet, protocol_level)`` for any packet; ``encode_publish`` for the hot path
without building a :class:`Publish`; :class:`PreparedPublish` to encode a fanned-out message's
topic, properties and payload once and stamp per-subscriber flags and packet ids cheaply.

What is left to the broker: topic name/filter syntax beyond UTF-8 (wildcards in a PUBLISH
topic, ``#`` placement in filters — the right answer there is a per-packet reason code, not a
decoding error), topic alias ranges and resolution, and anything that depends on session state.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Callable, Mapping
from typing import Any

from flowmq_wire.mqtt import reason_codes as rc
from flowmq_wire.mqtt.errors import (
    MalformedPacket,
    MqttCodecError,
    PacketTooLarge,
    ProtocolViolation,
    UnsupportedProtocolVersion,
)
from flowmq_wire.mqtt.packets import (
    AUTH,
    CONNACK,
    CONNECT,
    DISCONNECT,
    EMPTY_PROPERTIES,
    PACKET_NAMES,
    PINGREQ,
    PINGREQ_PACKET,
    PINGRESP,
    PINGRESP_PACKET,
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
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
    Pingreq,
    Pingresp,
    PlainPubacks,
    PlainPublish,
    PlainPublish1,
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
from flowmq_wire.mqtt.primitives import (
    MAX_VBI,
    decode_binary,
    decode_string,
    encode_binary,
    encode_string,
    encode_vbi,
    pack_u16,
)
from flowmq_wire.mqtt.properties import decode_properties, encode_properties

__all__ = [
    "DEFAULT_MAX_PACKET_SIZE",
    "MAX_PACKET_SIZE",
    "MalformedPacket",
    "MqttCodecError",
    "MqttDecoder",
    "PacketTooLarge",
    "PreparedPublish",
    "ProtocolViolation",
    "UnsupportedProtocolVersion",
    "encode",
    "encode_publish",
    "encode_pubacks",
]

DEFAULT_MAX_PACKET_SIZE = 1 << 20
_LITTLE_ENDIAN = sys.byteorder == "little"
# Plain PUBACKs decoded in one go at most (_puback_run): a few windows' worth.
_PUBACK_RUN = 4096
MAX_PACKET_SIZE = MAX_VBI + 5
"""Largest possible packet: the biggest remaining length plus a five-byte fixed header."""

_SHARE_PREFIX = "$share/"

# Fixed header flag nibble each non-PUBLISH packet must carry (§2.1.3); None = PUBLISH.
_REQUIRED_FLAGS = (0, 0, 0, None, 0, 0, 2, 0, 2, 0, 2, 0, 0, 0, 0, 0)

# Packet types a server may receive, and a client, per protocol level. 3.1.1 reserves type 15
# and has no server-sent DISCONNECT.
_TO_SERVER = {
    4: frozenset({CONNECT, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP, SUBSCRIBE, UNSUBSCRIBE})
    | {PINGREQ, DISCONNECT},
}
_TO_SERVER[5] = _TO_SERVER[4] | {AUTH}
_TO_CLIENT = {
    4: frozenset({CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP, SUBACK, UNSUBACK, PINGRESP}),
}
_TO_CLIENT[5] = _TO_CLIENT[4] | {DISCONNECT, AUTH}

_pack_BBH = struct.Struct(">BBH").pack
_pack_BBBH = struct.Struct(">BBBH").pack


def _puback_run(buf: bytes, pos: int, n: int) -> tuple[PlainPubacks, int]:
    """The packet ids of the plain PUBACKs (``40 02 id id``) from ``pos`` on, a complete one
    being there, and where they end: read a column of four-byte packets at a time, not a
    packet at a time (a subscriber acknowledges its whole window in one read), at most
    ``_PUBACK_RUN`` at a time (the rest of the read is copied once per run, not per PUBACK)."""
    if pos + 8 > n or buf[pos + 4] != 0x40:  # one alone (in a read of other packets)
        packet_id = (buf[pos + 2] << 8) | buf[pos + 3]
        if not packet_id:
            raise ProtocolViolation("PUBACK with packet identifier 0")
        return array("H", (packet_id,)), pos + 4
    block = buf[pos : pos + min((n - pos) & ~3, _PUBACK_RUN * 4)]
    count = len(block) >> 2
    count -= len(block[::4].lstrip(b"\x40"))  # up to the first packet of another type …
    count -= len(block[1 : count * 4 : 4].lstrip(b"\x02"))  # … or another length
    ids_be = bytearray(count * 2)
    ids_be[::2] = block[2 : count * 4 : 4]
    ids_be[1::2] = block[3 : count * 4 : 4]
    ids = array("H", ids_be)
    if _LITTLE_ENDIAN:
        ids.byteswap()
    if 0 in ids:  # up to the bad one, which the next call refuses
        count = ids.index(0)
        if not count:
            raise ProtocolViolation("PUBACK with packet identifier 0")
        del ids[count:]
    return ids, pos + count * 4


def _type_name(ptype: int) -> str:
    return PACKET_NAMES[ptype] if ptype else "reserved packet type 0"


def _long_remaining_length(buf: bytes, pos: int, n: int) -> tuple[int, int]:
    """Remaining length whose first byte (at ``pos + 1``) has the continuation bit set.

    Returns ``(length, start_of_variable_header)``, or ``(0, -1)`` if the header itself is
    still incomplete.
    """
    value = 0
    shift = 0
    i = pos + 1
    stop = min(pos + 5, n)
    while i < stop:
        byte = buf[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            if byte == 0:
                raise MalformedPacket("remaining length is not minimally encoded")
            return value, i
        shift += 7
    if i == pos + 5:
        raise MalformedPacket("remaining length longer than four bytes")
    return 0, -1


class MqttDecoder:
    """Incremental decoder for one connection.

    ``server=True`` (default) decodes client→server packets: the first must be CONNECT, whose
    protocol level (4 = 3.1.1 or 5) then governs the rest; a second CONNECT is a protocol
    violation. ``server=False`` decodes server→client packets at the ``protocol_level`` given.
    A server decoder given ``protocol_level`` behaves as if CONNECT had already been seen.

    ``max_packet_size`` bounds the whole packet (fixed header included, as MQTT 5's Maximum
    Packet Size does); ``0``/``None`` means the protocol maximum. An oversized packet raises
    :class:`PacketTooLarge` as soon as its fixed header is read, before its body is buffered.

    ``plain_tuples=True`` (a broker's choice): a plain QoS 0 PUBLISH — no retain, no DUP, no
    properties, a topic given — comes out as a ``PlainPublish`` tuple ``(topic, payload,
    raw)``, ``raw`` being the whole packet as received, instead of a :class:`Publish`: the
    commonest packet costs no object, and can be forwarded as it came.

    ``plain_qos1=True`` (the same for QoS 1): a plain QoS 1 PUBLISH comes out as a
    ``PlainPublish1`` list ``[topic, payload, raw, packet_id]`` (a list only so that its class
    tells it from the QoS 0 tuple in one check), and a run of plain PUBACKs (reason 0, no
    properties) as one ``PlainPubacks`` array of their packet identifiers: a QoS 1 message
    costs no packet object either way.

    After any :class:`MqttCodecError` the stream position is lost: close the connection.
    """

    __slots__ = (
        "server",
        "protocol_level",
        "connected",
        "plain_tuples",
        "plain_qos1",
        "_limit",
        "_tail",
        "_need",
    )

    def __init__(
        self,
        server: bool = True,
        protocol_level: int | None = None,
        max_packet_size: int | None = DEFAULT_MAX_PACKET_SIZE,
        plain_tuples: bool = False,
        plain_qos1: bool = False,
    ) -> None:
        if protocol_level not in (None, 4, 5):
            raise ValueError(f"protocol_level must be 4 or 5, not {protocol_level!r}")
        if not server and protocol_level is None:
            raise ValueError("a client-side decoder needs the protocol_level it connected with")
        self.server = server
        self.protocol_level: int | None = protocol_level
        """Known protocol level; set from CONNECT as soon as its level byte is read, so a
        CONNECT that fails later can still be answered in the right version."""
        self.connected = protocol_level is not None
        """True once a CONNECT has been decoded completely (always True client-side)."""
        self.plain_tuples = plain_tuples
        self.plain_qos1 = plain_qos1
        self.max_packet_size = max_packet_size  # sets _limit
        self._tail = bytearray()
        self._need = 0

    @property
    def max_packet_size(self) -> int:
        """Largest accepted packet in bytes (a v5 client's Maximum Packet Size, for example)."""
        return self._limit

    @max_packet_size.setter
    def max_packet_size(self, value: int | None) -> None:
        self._limit = MAX_PACKET_SIZE if not value else min(value, MAX_PACKET_SIZE)

    @property
    def buffered(self) -> int:
        """Bytes of an incomplete packet held for the next ``feed``."""
        return len(self._tail)

    def feed(
        self, data: bytes | bytearray | memoryview
    ) -> list[Packet | PlainPublish | PlainPublish1 | PlainPubacks]:
        """Decode every complete packet in the data seen so far, in order.

        Raises :class:`MqttCodecError`; its ``packets`` holds the packets decoded from this call
        before the bad one.
        """
        tail = self._tail
        if tail:
            tail += data
            if len(tail) < self._need:
                return []
            buf = bytes(tail)
            tail.clear()
        elif data.__class__ is bytes:
            buf = data
        else:
            buf = bytes(data)
        n = len(buf)
        pos = 0
        need = 0
        out: list[Packet | PlainPublish | PlainPublish1 | PlainPubacks] = []
        append = out.append
        limit = self._limit
        plain = self.plain_tuples
        plain1 = self.plain_qos1
        if not self.connected and n and buf[0] & 0xF0 != 0x10:
            # Rejected on its first byte: nothing before CONNECT is worth buffering.
            e = ProtocolViolation(f"first packet must be CONNECT, got {_type_name(buf[0] >> 4)}")
            e.packet_type = buf[0] >> 4
            raise e
        # None until CONNECT is decoded; the PUBLISH paths cannot be reached before that
        # because the first packet was checked to be a CONNECT above.
        level = self.protocol_level
        b0 = 0
        props: Properties = EMPTY_PROPERTIES  # a PUBLISH's; set per packet in v5 only
        last = n - 1  # a fixed header needs two bytes
        try:
            while pos < last:
                b0 = buf[pos]
                rl = buf[pos + 1]
                if rl < 0x80:
                    start = pos + 2
                elif n - pos > 2 and (rl2 := buf[pos + 2]) and rl2 < 0x80:
                    # Two-byte remaining length (128 B - 16 KiB): most PUBLISH packets.
                    rl = (rl & 0x7F) | (rl2 << 7)
                    start = pos + 3
                else:
                    rl, start = _long_remaining_length(buf, pos, n)
                    if start < 0:
                        need = n - pos + 1
                        break
                end = start + rl
                if end - pos > limit:
                    raise PacketTooLarge(end - pos, limit)
                if end > n:
                    need = end - pos
                    break
                # PUBLISH is decoded inline: it is most of the traffic. Its flags are checked
                # first (no checks for the commonest packet of all: QoS 0, no retain, no dup),
                # then one path decodes every PUBLISH's topic, properties and payload. A read
                # past the end of ``buf`` (a field cut short by the end of the data) raises
                # IndexError, which is turned into MalformedPacket below; reads past ``end``
                # are checked.
                if b0 == 0x30:
                    q = start + 2 + ((buf[start] << 8) | buf[start + 1])  # end of the topic
                    if q > end:
                        raise MalformedPacket("PUBLISH topic runs past the packet")
                    # Plain (v5: property length 0, so q < end), as a tuple when asked for.
                    if plain and q > start + 2 and (level == 4 or (q < end and buf[q] == 0)):
                        topic = buf[start + 2 : q].decode()
                        if "\x00" in topic:
                            raise MalformedPacket("topic contains U+0000")
                        append((topic, buf[q if level == 4 else q + 1 : end], buf[pos:end]))
                        pos = end
                        continue
                    p = q
                    qos, retain, dup, packet_id = 0, False, False, None
                elif b0 & 0xF0 == 0x30:
                    q = start + 2 + ((buf[start] << 8) | buf[start + 1])
                    qos = (b0 >> 1) & 3
                    if qos:
                        if qos == 3:
                            raise MalformedPacket("PUBLISH with QoS 3")
                        p = q + 2
                        if p > end:
                            raise MalformedPacket("PUBLISH topic or packet id runs past the packet")
                        packet_id = (buf[q] << 8) | buf[q + 1]
                        if not packet_id:
                            raise ProtocolViolation("PUBLISH with QoS > 0 and packet identifier 0")
                        # QoS 1, no retain, no DUP: as a list when plain (v5: no properties).
                        if (
                            b0 == 0x32
                            and plain1
                            and q > start + 2
                            and (level == 4 or (p < end and buf[p] == 0))
                        ):
                            topic = buf[start + 2 : q].decode()
                            if "\x00" in topic:
                                raise MalformedPacket("topic contains U+0000")
                            payload = buf[p if level == 4 else p + 1 : end]
                            append([topic, payload, buf[pos:end], packet_id])
                            pos = end
                            continue
                    else:
                        if b0 & 8:
                            raise MalformedPacket("DUP flag set on a QoS 0 PUBLISH")
                        if q > end:
                            raise MalformedPacket("PUBLISH topic runs past the packet")
                        packet_id = None
                        p = q
                    retain = (b0 & 1) != 0
                    dup = (b0 & 8) != 0
                elif b0 == 0x40 and rl == 2:
                    # Plain PUBACK, the other half of QoS 1 traffic.
                    if plain1:  # with those right after it, as one array of packet ids
                        ids, pos = _puback_run(buf, pos, n)
                        append(ids)
                        continue
                    packet_id = (buf[start] << 8) | buf[start + 1]
                    if not packet_id:
                        raise ProtocolViolation("PUBACK with packet identifier 0")
                    append(Puback(packet_id, 0, EMPTY_PROPERTIES))
                    pos = end
                    continue
                else:
                    append(self._decode_other(b0, buf, start, end))
                    if level is None:
                        level = self.protocol_level
                    pos = end
                    continue
                # Every PUBLISH: topic (ends at q), properties (v5, from p) and payload.
                topic = buf[start + 2 : q].decode()
                if "\x00" in topic:
                    raise MalformedPacket("topic contains U+0000")
                if level == 5:
                    if p < end and buf[p] == 0:
                        props = EMPTY_PROPERTIES
                        p += 1
                    else:
                        props, p = decode_properties(buf, p, end, PUBLISH)
                    if not topic and "topic_alias" not in props:
                        raise ProtocolViolation("PUBLISH with an empty topic and no topic alias")
                elif not topic:
                    raise ProtocolViolation("PUBLISH with an empty topic")
                append(Publish(topic, buf[p:end], qos, retain, dup, packet_id, props))
                pos = end
            else:
                need = 2
        except (MqttCodecError, IndexError, UnicodeDecodeError) as exc:
            if isinstance(exc, IndexError):
                e: MqttCodecError = MalformedPacket("field runs past the end of the packet")
            elif isinstance(exc, UnicodeDecodeError):
                e = MalformedPacket(f"topic is not well-formed UTF-8 ({exc.reason})")
            else:
                e = exc
            e.packets = out
            if e.packet_type is None:
                e.packet_type = b0 >> 4
            if e is exc:
                raise
            raise e from None
        if pos < n:
            self._tail = bytearray(buf[pos:]) if pos else bytearray(buf)
            self._need = need
        return out

    def _decode_other(self, b0: int, buf: bytes, start: int, end: int) -> Packet:
        ptype = b0 >> 4
        if ptype == CONNECT:
            if not self.server:
                raise ProtocolViolation("a client received CONNECT")
            if self.connected:
                raise ProtocolViolation("second CONNECT on one connection")
            if b0 & 0x0F:
                raise MalformedPacket("reserved fixed header flags set on CONNECT")
            return self._decode_connect(buf, start, end)
        if not self.connected:
            raise ProtocolViolation(f"first packet must be CONNECT, got {_type_name(ptype)}")
        level = self.protocol_level
        assert level is not None
        if ptype not in (_TO_SERVER if self.server else _TO_CLIENT)[level]:
            if ptype == 0 or (ptype == AUTH and level == 4):
                raise MalformedPacket(f"reserved control packet type {ptype}")
            side = "server" if self.server else "client"
            raise ProtocolViolation(f"a {side} does not accept {PACKET_NAMES[ptype]}")
        if b0 & 0x0F != _REQUIRED_FLAGS[ptype]:
            raise MalformedPacket(f"invalid fixed header flags on {PACKET_NAMES[ptype]}")
        return _DECODERS[ptype](buf, start, end, level)

    def _decode_connect(self, buf: bytes, p: int, end: int) -> Connect:
        name, p = decode_string(buf, p, end)
        if p >= end:
            raise MalformedPacket("CONNECT ends before its protocol level")
        level = buf[p]
        if name != "MQTT" or level not in (4, 5):
            raise UnsupportedProtocolVersion(name, level)
        self.protocol_level = level
        if p + 4 > end:
            raise MalformedPacket("CONNECT ends before its keep alive")
        flags = buf[p + 1]
        keep_alive = (buf[p + 2] << 8) | buf[p + 3]
        p += 4
        if flags & 0x01:
            raise MalformedPacket("CONNECT reserved flag is set")
        will_qos = (flags >> 3) & 3
        if flags & 0x04:
            if will_qos == 3:
                raise MalformedPacket("CONNECT will QoS 3")
        elif flags & 0x38:
            raise MalformedPacket("CONNECT will QoS or will retain set without the will flag")
        if level == 4 and flags & 0xC0 == 0x40:
            raise MalformedPacket("CONNECT password flag without user name flag (MQTT 3.1.1)")
        props = EMPTY_PROPERTIES
        if level == 5:
            props, p = decode_properties(buf, p, end, CONNECT)
        client_id, p = decode_string(buf, p, end)
        will = None
        if flags & 0x04:
            will_props = EMPTY_PROPERTIES
            if level == 5:
                will_props, p = decode_properties(buf, p, end, WILL)
            will_topic, p = decode_string(buf, p, end)
            will_payload, p = decode_binary(buf, p, end)
            will = Will(will_topic, will_payload, will_qos, (flags & 0x20) != 0, will_props)
        username = None
        if flags & 0x80:
            username, p = decode_string(buf, p, end)
        password = None
        if flags & 0x40:
            password, p = decode_binary(buf, p, end)
        if p != end:
            raise MalformedPacket("CONNECT has bytes after its payload")
        self.connected = True
        return Connect(
            client_id,
            (flags & 0x02) != 0,
            keep_alive,
            will,
            username,
            password,
            props,
            level,
            name,
        )


# --- per-type decoders: (buf, start, end, level) -> Packet ------------------------------------


def _trailing(p: int, end: int, ptype: int) -> None:
    if p != end:
        raise MalformedPacket(f"{PACKET_NAMES[ptype]} length does not match its contents")


def _packet_id(buf: bytes, p: int, end: int, ptype: int) -> int:
    if p + 2 > end:
        raise MalformedPacket(f"{PACKET_NAMES[ptype]} ends before its packet identifier")
    packet_id = (buf[p] << 8) | buf[p + 1]
    if not packet_id:
        raise ProtocolViolation(f"{PACKET_NAMES[ptype]} with packet identifier 0")
    return packet_id


def _packet_id_and_properties(
    buf: bytes, p: int, end: int, level: int, ptype: int
) -> tuple[int, Properties, int]:
    """The packet identifier, then (v5) the properties, that open SUBSCRIBE, SUBACK,
    UNSUBSCRIBE and UNSUBACK; and where what follows them starts."""
    packet_id = _packet_id(buf, p, end, ptype)
    p += 2
    if level == 5:
        props, p = decode_properties(buf, p, end, ptype)
        return packet_id, props, p
    return packet_id, EMPTY_PROPERTIES, p


def _reason_codes(buf: bytes, p: int, end: int, valid: frozenset[int], ptype: int) -> list[int]:
    """The rest of a SUBACK or UNSUBACK: one reason code a byte."""
    codes = list(buf[p:end])
    for code in codes:
        if code not in valid:
            raise ProtocolViolation(f"invalid {PACKET_NAMES[ptype]} reason code 0x{code:02X}")
    return codes


def _decode_connack(buf: bytes, p: int, end: int, level: int) -> Connack:
    if p + 2 > end:
        raise MalformedPacket("CONNACK too short")
    flags = buf[p]
    code = buf[p + 1]
    if flags & 0xFE:
        raise MalformedPacket("CONNACK reserved acknowledge flags set")
    if level == 5:
        if code not in rc.CONNACK_REASON_CODES:
            raise ProtocolViolation(f"invalid CONNACK reason code 0x{code:02X}")
        props, p = decode_properties(buf, p + 2, end, CONNACK)
    else:
        if code not in rc.CONNACK_V311_RETURN_CODES:
            raise ProtocolViolation(f"invalid CONNACK return code {code}")
        props = EMPTY_PROPERTIES
        p += 2
    _trailing(p, end, CONNACK)
    if code and flags:
        raise ProtocolViolation("CONNACK with an error code and session present set")
    return Connack(flags == 1, code, props)


def _pub_response_decoder(
    cls: type[Puback | Pubrec | Pubrel | Pubcomp], ptype: int, codes: frozenset[int]
) -> Callable[[bytes, int, int, int], Packet]:
    def decode(buf: bytes, p: int, end: int, level: int) -> Packet:
        packet_id = _packet_id(buf, p, end, ptype)
        p += 2
        if p == end:
            return cls(packet_id, 0, EMPTY_PROPERTIES)
        if level == 4:
            raise MalformedPacket(f"{PACKET_NAMES[ptype]} longer than 2 bytes (MQTT 3.1.1)")
        code = buf[p]
        if code not in codes:
            raise ProtocolViolation(f"invalid {PACKET_NAMES[ptype]} reason code 0x{code:02X}")
        props = EMPTY_PROPERTIES
        if p + 1 < end:  # a remaining length under 4 means no property length (§3.4.2.2.1)
            props, q = decode_properties(buf, p + 1, end, ptype)
            _trailing(q, end, ptype)
        return cls(packet_id, code, props)

    return decode


def _decode_subscribe(buf: bytes, p: int, end: int, level: int) -> Subscribe:
    packet_id, props, p = _packet_id_and_properties(buf, p, end, level, SUBSCRIBE)
    subscriptions: list[tuple[str, SubscriptionOptions]] = []
    while p < end:
        topic_filter, p = decode_string(buf, p, end)
        if p >= end:
            raise MalformedPacket("SUBSCRIBE topic filter without subscription options")
        opts = buf[p]
        p += 1
        qos = opts & 3
        if level == 5:
            if opts & 0xC0:
                raise MalformedPacket("SUBSCRIBE subscription options reserved bits set")
            if qos == 3:
                raise ProtocolViolation("SUBSCRIBE maximum QoS 3")
            retain_handling = (opts >> 4) & 3
            if retain_handling == 3:
                raise ProtocolViolation("SUBSCRIBE retain handling 3")
            no_local = (opts & 4) != 0
            if no_local and topic_filter.startswith(_SHARE_PREFIX):
                raise ProtocolViolation("SUBSCRIBE no local set on a shared subscription")
            options = SubscriptionOptions(qos, no_local, (opts & 8) != 0, retain_handling)
        else:
            if opts & 0xFC or qos == 3:
                raise MalformedPacket("SUBSCRIBE requested QoS reserved bits set or QoS 3")
            options = SubscriptionOptions(qos)
        subscriptions.append((topic_filter, options))
    if not subscriptions:
        raise ProtocolViolation("SUBSCRIBE without topic filters")
    return Subscribe(packet_id, subscriptions, props)


def _decode_suback(buf: bytes, p: int, end: int, level: int) -> Suback:
    packet_id, props, p = _packet_id_and_properties(buf, p, end, level, SUBACK)
    valid = rc.SUBACK_REASON_CODES if level == 5 else rc.SUBACK_V311_RETURN_CODES
    return Suback(packet_id, _reason_codes(buf, p, end, valid, SUBACK), props)


def _decode_unsubscribe(buf: bytes, p: int, end: int, level: int) -> Unsubscribe:
    packet_id, props, p = _packet_id_and_properties(buf, p, end, level, UNSUBSCRIBE)
    filters: list[str] = []
    while p < end:
        topic_filter, p = decode_string(buf, p, end)
        filters.append(topic_filter)
    if not filters:
        raise ProtocolViolation("UNSUBSCRIBE without topic filters")
    return Unsubscribe(packet_id, filters, props)


def _decode_unsuback(buf: bytes, p: int, end: int, level: int) -> Unsuback:
    packet_id, props, p = _packet_id_and_properties(buf, p, end, level, UNSUBACK)
    if level == 4:  # 3.1.1: no reason codes
        _trailing(p, end, UNSUBACK)
        return Unsuback(packet_id, [], props)
    return Unsuback(
        packet_id, _reason_codes(buf, p, end, rc.UNSUBACK_REASON_CODES, UNSUBACK), props
    )


def _decode_pingreq(buf: bytes, p: int, end: int, level: int) -> Pingreq:
    _trailing(p, end, PINGREQ)
    return PINGREQ_PACKET


def _decode_pingresp(buf: bytes, p: int, end: int, level: int) -> Pingresp:
    _trailing(p, end, PINGRESP)
    return PINGRESP_PACKET


def _reason_and_properties(
    buf: bytes, p: int, end: int, level: int, ptype: int, codes: frozenset[int]
) -> tuple[int, Properties]:
    """DISCONNECT/AUTH body: both may be omitted (success, no properties)."""
    if p == end:
        return 0, EMPTY_PROPERTIES
    if level == 4:
        raise MalformedPacket(f"{PACKET_NAMES[ptype]} with a body (MQTT 3.1.1)")
    code = buf[p]
    if code not in codes:
        raise ProtocolViolation(f"invalid {PACKET_NAMES[ptype]} reason code 0x{code:02X}")
    if p + 1 == end:
        return code, EMPTY_PROPERTIES
    props, p = decode_properties(buf, p + 1, end, ptype)
    _trailing(p, end, ptype)
    return code, props


def _decode_disconnect(buf: bytes, p: int, end: int, level: int) -> Disconnect:
    code, props = _reason_and_properties(buf, p, end, level, DISCONNECT, rc.DISCONNECT_REASON_CODES)
    return Disconnect(code, props)


def _decode_auth(buf: bytes, p: int, end: int, level: int) -> Auth:
    code, props = _reason_and_properties(buf, p, end, level, AUTH, rc.AUTH_REASON_CODES)
    return Auth(code, props)


_DECODERS: dict[int, Callable[[bytes, int, int, int], Packet]] = {
    # PUBLISH has no entry: MqttDecoder.feed decodes it inline.
    CONNACK: _decode_connack,
    PUBACK: _pub_response_decoder(Puback, PUBACK, rc.PUBACK_REASON_CODES),
    PUBREC: _pub_response_decoder(Pubrec, PUBREC, rc.PUBREC_REASON_CODES),
    PUBREL: _pub_response_decoder(Pubrel, PUBREL, rc.PUBREL_REASON_CODES),
    PUBCOMP: _pub_response_decoder(Pubcomp, PUBCOMP, rc.PUBCOMP_REASON_CODES),
    SUBSCRIBE: _decode_subscribe,
    SUBACK: _decode_suback,
    UNSUBSCRIBE: _decode_unsubscribe,
    UNSUBACK: _decode_unsuback,
    PINGREQ: _decode_pingreq,
    PINGRESP: _decode_pingresp,
    DISCONNECT: _decode_disconnect,
    AUTH: _decode_auth,
}


# --- encoding -----------------------------------------------------------------------------------


def _frame(b0: int, body: bytes) -> bytes:
    n = len(body)
    if n < 0x80:
        return bytes((b0, n)) + body
    return bytes((b0,)) + encode_vbi(n) + body


def encode_publish(
    topic: str | bytes,
    payload: bytes | bytearray | memoryview,
    qos: int = 0,
    retain: bool = False,
    dup: bool = False,
    packet_id: int | None = None,
    properties: Mapping[str, Any] | None = None,
    protocol_level: int = 4,
) -> bytes:
    """Encode one PUBLISH. ``topic`` may be pre-encoded UTF-8 bytes; properties are ignored at
    level 4. ``packet_id`` is required for QoS 1 and 2."""
    t = topic.encode() if topic.__class__ is str else topic  # type: ignore[union-attr]
    tl = len(t)
    b0 = 0x30 | (qos << 1) | (0x01 if retain else 0) | (0x08 if dup else 0)
    if protocol_level == 5:
        mid = encode_properties(properties) if properties else b"\x00"
        if qos:
            mid = pack_u16(packet_id) + mid  # type: ignore[arg-type]
    elif qos:
        mid = pack_u16(packet_id)  # type: ignore[arg-type]
    else:
        mid = b""
    rl = 2 + tl + len(mid) + len(payload)
    if rl < 0x80:
        header = _pack_BBH(b0, rl, tl)
    elif rl < 0x4000:
        header = _pack_BBBH(b0, (rl & 0x7F) | 0x80, rl >> 7, tl)
    else:
        header = bytes((b0,)) + encode_vbi(rl) + pack_u16(tl)
    if mid:
        return b"".join((header, t, mid, payload))  # type: ignore[arg-type]
    return header + t + payload  # type: ignore[operator]


class PreparedPublish:
    """One message encoded once for fan-out at one protocol level.

    The topic, properties and payload bytes are built in the constructor; ``encode`` only adds
    the fixed header (per-subscriber QoS, retain, dup) and packet id. QoS 0 results are cached,
    so every QoS 0 subscriber shares one ``bytes`` object. Subscribers that need their own
    properties (v5 subscription identifiers, topic aliases) need their own ``encode_publish``.
    """

    __slots__ = ("_head", "_tail", "_size", "_qos0", "_prefixes")

    def __init__(
        self,
        topic: str | bytes,
        payload: bytes | bytearray | memoryview,
        properties: Mapping[str, Any] | None = None,
        protocol_level: int = 4,
    ) -> None:
        t = topic.encode() if isinstance(topic, str) else bytes(topic)
        self._head = pack_u16(len(t)) + t
        props = b""
        if protocol_level == 5:
            props = encode_properties(properties) if properties else b"\x00"
        self._tail = props + bytes(payload)
        self._size = len(self._head) + len(self._tail)
        if self._size + 2 > MAX_VBI:
            raise ValueError("PUBLISH too large for MQTT")
        self._qos0: list[bytes | None] = [None, None]
        # Fixed header + topic per flag nibble, so a QoS 1/2 packet is two concatenations.
        self._prefixes: dict[int, bytes] = {}

    def encode(
        self, qos: int = 0, retain: bool = False, dup: bool = False, packet_id: int | None = None
    ) -> bytes:
        """The PUBLISH for one subscriber (``packet_id`` required for QoS 1 and 2)."""
        if not qos:
            cached = self._qos0[retain]
            if cached is None:
                cached = self._qos0[retain] = _frame(
                    0x31 if retain else 0x30, self._head + self._tail
                )
            return cached
        flags = (qos << 1) | retain | (dup << 3)
        prefix = self._prefixes.get(flags)
        if prefix is None:
            prefix = self._prefixes[flags] = (
                bytes((0x30 | flags,)) + encode_vbi(self._size + 2) + self._head
            )
        return prefix + pack_u16(packet_id) + self._tail  # type: ignore[arg-type]


def encode_pubacks(packet_ids: list[int], reason_code: int = 0) -> bytes:
    """The PUBACKs of ``packet_ids``, joined: one write acknowledges a run of QoS 1 PUBLISH
    packets.  Each has ``reason_code`` (a v5 one; 3.1.1 only has 0) and no properties."""
    if not reason_code:  # 40 02 id id: one 32-bit integer each
        return struct.pack(f">{len(packet_ids)}I", *[0x40020000 | i for i in packet_ids])
    return b"".join(bytes((0x40, 3, i >> 8, i & 0xFF, reason_code)) for i in packet_ids)


def _encode_connect(p: Connect, level: int) -> bytes:
    flags = 0x02 if p.clean_start else 0
    will = p.will
    if will is not None:
        flags |= 0x04 | (will.qos << 3)
        if will.retain:
            flags |= 0x20
    if p.username is not None:
        flags |= 0x80
    if p.password is not None:
        flags |= 0x40
    parts = [encode_string(p.protocol_name), bytes((level, flags)), pack_u16(p.keep_alive)]
    if level == 5:
        parts.append(encode_properties(p.properties))
    parts.append(encode_string(p.client_id))
    if will is not None:
        if level == 5:
            parts.append(encode_properties(will.properties))
        parts.append(encode_string(will.topic))
        parts.append(encode_binary(will.payload))
    if p.username is not None:
        parts.append(encode_string(p.username))
    if p.password is not None:
        parts.append(encode_binary(p.password))
    return _frame(0x10, b"".join(parts))


def _encode_connack(p: Connack, level: int) -> bytes:
    if level == 5:
        return _frame(
            0x20, bytes((p.session_present, p.reason_code)) + encode_properties(p.properties)
        )
    return bytes((0x20, 2, p.session_present, rc.connack_v5_to_v311(p.reason_code)))


def _encode_publish_packet(p: Publish, level: int) -> bytes:
    return encode_publish(
        p.topic, p.payload, p.qos, p.retain, p.dup, p.packet_id, p.properties, level
    )


def _encode_pub_response(p: Puback, level: int) -> bytes:
    b0 = 0x62 if p.TYPE == PUBREL else p.TYPE << 4
    if level == 5 and (p.reason_code or p.properties):
        if not p.properties:
            return bytes((b0, 3)) + pack_u16(p.packet_id) + bytes((p.reason_code,))
        return _frame(
            b0, pack_u16(p.packet_id) + bytes((p.reason_code,)) + encode_properties(p.properties)
        )
    return bytes((b0, 2)) + pack_u16(p.packet_id)


def _subscription_options_byte(opts: SubscriptionOptions | int, level: int) -> int:
    if isinstance(opts, int):
        return opts
    if level == 5:
        return (
            opts.qos
            | (0x04 if opts.no_local else 0)
            | (0x08 if opts.retain_as_published else 0)
            | (opts.retain_handling << 4)
        )
    return opts.qos


def _encode_subscribe(p: Subscribe, level: int) -> bytes:
    parts = [pack_u16(p.packet_id)]
    if level == 5:
        parts.append(encode_properties(p.properties))
    for topic_filter, opts in p.subscriptions:
        parts.append(encode_string(topic_filter))
        parts.append(bytes((_subscription_options_byte(opts, level),)))
    return _frame(0x82, b"".join(parts))


def _encode_suback(p: Suback, level: int) -> bytes:
    if level == 5:
        body = pack_u16(p.packet_id) + encode_properties(p.properties) + bytes(p.reason_codes)
    else:
        body = pack_u16(p.packet_id) + bytes(rc.suback_v5_to_v311(c) for c in p.reason_codes)
    return _frame(0x90, body)


def _encode_unsubscribe(p: Unsubscribe, level: int) -> bytes:
    parts = [pack_u16(p.packet_id)]
    if level == 5:
        parts.append(encode_properties(p.properties))
    parts.extend(encode_string(f) for f in p.filters)
    return _frame(0xA2, b"".join(parts))


def _encode_unsuback(p: Unsuback, level: int) -> bytes:
    if level == 5:
        return _frame(
            0xB0, pack_u16(p.packet_id) + encode_properties(p.properties) + bytes(p.reason_codes)
        )
    return b"\xb0\x02" + pack_u16(p.packet_id)


def _encode_pingreq(p: Pingreq, level: int) -> bytes:
    return b"\xc0\x00"


def _encode_pingresp(p: Pingresp, level: int) -> bytes:
    return b"\xd0\x00"


def _encode_disconnect(p: Disconnect, level: int) -> bytes:
    code = p.reason_code
    props = p.properties
    if level == 4 or (not code and not props):
        return b"\xe0\x00"
    if not props:  # "If the Remaining Length is less than 2, a value of 0 is used" (§3.14.2.2.1)
        return bytes((0xE0, 1, code))
    return _frame(0xE0, bytes((code,)) + encode_properties(props))


def _encode_auth(p: Auth, level: int) -> bytes:
    if level != 5:
        raise ValueError("AUTH exists only in MQTT 5")
    if not p.reason_code and not p.properties:
        return b"\xf0\x00"  # §3.15.2.1 allows omitting both
    # Unlike DISCONNECT, AUTH has no rule for a missing property length: always write it.
    return _frame(0xF0, bytes((p.reason_code,)) + encode_properties(p.properties))


_ENCODERS: dict[type, Callable[[Any, int], bytes]] = {
    Connect: _encode_connect,
    Connack: _encode_connack,
    Publish: _encode_publish_packet,
    Puback: _encode_pub_response,
    Pubrec: _encode_pub_response,
    Pubrel: _encode_pub_response,
    Pubcomp: _encode_pub_response,
    Subscribe: _encode_subscribe,
    Suback: _encode_suback,
    Unsubscribe: _encode_unsubscribe,
    Unsuback: _encode_unsuback,
    Pingreq: _encode_pingreq,
    Pingresp: _encode_pingresp,
    Disconnect: _encode_disconnect,
    Auth: _encode_auth,
}


def encode(packet: Packet, protocol_level: int) -> bytes:
    """Encode any control packet for a connection at ``protocol_level`` (4 or 5).

    At level 4 the v5-only parts (properties, most reason codes) are dropped, CONNACK and
    SUBACK codes are mapped to their 3.1.1 equivalents. The encoder trusts its input: it does
    not re-check the rules the decoder enforces.
    """
    if protocol_level not in (4, 5):
        raise ValueError(f"protocol_level must be 4 or 5, not {protocol_level!r}")
    try:
        encoder = _ENCODERS[packet.__class__]
    except KeyError:
        raise TypeError(f"not an MQTT packet: {packet!r}") from None
    return encoder(packet, protocol_level)
