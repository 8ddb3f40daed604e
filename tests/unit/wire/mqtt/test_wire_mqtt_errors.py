"""Every byte-level rule the decoder enforces, each with a hand-built bad packet.

Packets are written out in hex; ``pkt`` only adds the fixed header (type/flags byte and a
one-byte remaining length) so the lengths need not be counted by hand.
"""

from __future__ import annotations

import pytest

from flowmq_wire.mqtt import (
    MAX_PACKET_SIZE,
    Connect,
    MalformedPacket,
    MqttCodecError,
    MqttDecoder,
    PacketTooLarge,
    Pingreq,
    ProtocolViolation,
    Publish,
    UnsupportedProtocolVersion,
)
from flowmq_wire.mqtt import reason_codes as rc

h = bytes.fromhex  # ignores the spaces between bytes


def pkt(b0: int, body: str) -> bytes:
    data = h(body)
    assert len(data) < 128
    return bytes((b0, len(data))) + data


MQTT = "0004 4d515454"  # protocol name "MQTT"
CONNECT4 = pkt(0x10, f"{MQTT} 04 02 003c 0000")  # clean session, keep alive 60, client id ""
CONNECT5 = pkt(0x10, f"{MQTT} 05 02 003c 00 0000")
CONNECT = {4: CONNECT4, 5: CONNECT5}

MALFORMED = (MalformedPacket, rc.MALFORMED_PACKET)
PROTOCOL = (ProtocolViolation, rc.PROTOCOL_ERROR)

# (rule, protocol level, bytes sent after a valid CONNECT, expected error)
AFTER_CONNECT = [
    # --- fixed header ---
    ("remaining length of five bytes", 4, h("30 ff ff ff ff 01"), MALFORMED),
    ("remaining length not minimal (2 bytes)", 4, h("c0 80 00"), MALFORMED),
    ("remaining length not minimal (3 bytes)", 5, h("30 80 80 00"), MALFORMED),
    ("reserved packet type 0", 4, h("00 00"), MALFORMED),
    ("AUTH does not exist in 3.1.1", 4, h("f0 00"), MALFORMED),
    ("SUBSCRIBE flags must be 0010 (0000)", 4, pkt(0x80, "0001 0001 61 00"), MALFORMED),
    ("SUBSCRIBE flags must be 0010 (0011)", 5, pkt(0x83, "0001 00 0001 61 00"), MALFORMED),
    ("UNSUBSCRIBE flags must be 0010", 4, pkt(0xA0, "0001 0001 61"), MALFORMED),
    ("PUBREL flags must be 0010", 4, pkt(0x60, "0001"), MALFORMED),
    ("PUBACK flags must be 0000", 4, pkt(0x41, "0001"), MALFORMED),
    ("PUBREC flags must be 0000", 5, pkt(0x58, "0001"), MALFORMED),
    ("PINGREQ flags must be 0000", 4, h("c2 00"), MALFORMED),
    ("DISCONNECT flags must be 0000", 5, h("e8 00"), MALFORMED),
    ("second CONNECT (3.1.1)", 4, CONNECT4, PROTOCOL),
    ("second CONNECT (5)", 5, CONNECT5, PROTOCOL),
    ("server-bound CONNACK", 4, h("20 02 00 00"), PROTOCOL),
    ("server-bound SUBACK", 5, h("90 04 0001 00 00"), PROTOCOL),
    ("server-bound UNSUBACK", 4, h("b0 02 0001"), PROTOCOL),
    ("server-bound PINGRESP", 4, h("d0 00"), PROTOCOL),
    # --- PUBLISH ---
    ("PUBLISH QoS 3", 4, pkt(0x36, "0001 61 0001"), MALFORMED),
    ("PUBLISH QoS 3 (v5)", 5, pkt(0x36, "0001 61 0001 00"), MALFORMED),
    ("DUP on a QoS 0 PUBLISH", 4, pkt(0x38, "0001 61"), MALFORMED),
    ("PUBLISH QoS 1 packet id 0", 4, pkt(0x32, "0001 61 0000"), PROTOCOL),
    ("PUBLISH QoS 2 packet id 0", 5, pkt(0x34, "0001 61 0000 00"), PROTOCOL),
    ("topic not UTF-8", 4, pkt(0x30, "0001 ff"), MALFORMED),
    ("topic overlong UTF-8", 4, pkt(0x30, "0002 c0af"), MALFORMED),
    ("topic encodes a surrogate U+D800", 4, pkt(0x30, "0003 eda080"), MALFORMED),
    ("topic encodes a surrogate U+DFFF (QoS 1)", 4, pkt(0x32, "0003 edbfbf 0001"), MALFORMED),
    ("topic contains U+0000", 4, pkt(0x30, "0003 610062"), MALFORMED),
    ("topic contains U+0000 (QoS 1, retain)", 5, pkt(0x33, "0001 00 0001 00"), MALFORMED),
    ("topic longer than the packet", 4, pkt(0x30, "0005 61"), MALFORMED),
    ("topic length cut at end of data", 4, pkt(0x30, "00"), MALFORMED),
    ("topic length cut, next packet follows", 4, pkt(0x30, "00") + h("c000"), MALFORMED),
    ("packet id cut short", 4, pkt(0x32, "0001 61 00"), MALFORMED),
    ("empty topic (3.1.1)", 4, pkt(0x30, "0000 6869"), PROTOCOL),
    ("empty topic without topic alias (5)", 5, pkt(0x30, "0000 00 6869"), PROTOCOL),
    ("v5 PUBLISH without property length", 5, pkt(0x30, "0001 61"), MALFORMED),
    (
        "topic alias 0",
        5,
        pkt(0x30, "0001 61 03 230000"),
        (ProtocolViolation, rc.TOPIC_ALIAS_INVALID),
    ),
    ("subscription identifier 0", 5, pkt(0x30, "0001 61 02 0b00"), PROTOCOL),
    ("duplicate property", 5, pkt(0x30, "0001 61 0a 0200000001 0200000002"), PROTOCOL),
    ("duplicate topic alias", 5, pkt(0x32, "0001 61 0001 06 230001 230002"), PROTOCOL),
    ("property not allowed in PUBLISH", 5, pkt(0x30, "0001 61 05 1100000001"), MALFORMED),
    ("Will-only property in PUBLISH", 5, pkt(0x30, "0001 61 05 1800000001"), MALFORMED),
    ("unknown property identifier", 5, pkt(0x30, "0001 61 02 0500"), MALFORMED),
    ("property identifier >= 0x80", 5, pkt(0x30, "0001 61 02 8001"), MALFORMED),
    ("property length exceeds packet", 5, pkt(0x30, "0001 61 10 0101"), MALFORMED),
    ("property length of five bytes", 5, pkt(0x30, "0001 61 ffffffff7f"), MALFORMED),
    ("four-byte value overruns properties", 5, pkt(0x30, "0001 61 03 020000 0001"), MALFORMED),
    ("string value overruns properties", 5, pkt(0x30, "0001 61 04 03000561 6263"), MALFORMED),
    ("user property key not UTF-8", 5, pkt(0x30, "0001 61 07 260001ff000161"), MALFORMED),
    ("user property value with U+0000", 5, pkt(0x30, "0001 61 07 26000161000100"), MALFORMED),
    ("content type not UTF-8", 5, pkt(0x30, "0001 61 04 030001c3"), MALFORMED),
    # --- PUBACK, PUBREC, PUBREL, PUBCOMP ---
    ("PUBACK packet id 0", 4, h("40 02 0000"), PROTOCOL),
    ("PUBREC packet id 0", 5, h("50 02 0000"), PROTOCOL),
    ("PUBREL packet id 0", 4, h("62 02 0000"), PROTOCOL),
    ("PUBCOMP packet id 0", 5, h("70 03 0000 00"), PROTOCOL),
    ("PUBACK too short", 4, h("40 01 00"), MALFORMED),
    ("PUBACK longer than 2 bytes (3.1.1)", 4, h("40 03 0001 00"), MALFORMED),
    ("PUBCOMP longer than 2 bytes (3.1.1)", 4, h("70 04 0001 0000"), MALFORMED),
    ("PUBACK reason code not a PUBACK code", 5, h("40 03 0001 05"), PROTOCOL),
    ("PUBREL reason code not a PUBREL code", 5, h("62 03 0001 10"), PROTOCOL),
    ("PUBACK bytes after properties", 5, h("40 05 0001 80 00 ff"), MALFORMED),
    ("PUBACK property not allowed", 5, h("40 07 0001 00 03 230001"), MALFORMED),
    ("PUBREC property length exceeds packet", 5, h("50 05 0001 00 05 1f"), MALFORMED),
    ("PUBREC duplicate reason string", 5, h("50 0b 0001 00 07 1f000161 1f0000"), PROTOCOL),
    # --- SUBSCRIBE ---
    ("SUBSCRIBE without topic filters (3.1.1)", 4, pkt(0x82, "0001"), PROTOCOL),
    ("SUBSCRIBE without topic filters (5)", 5, pkt(0x82, "0001 00"), PROTOCOL),
    ("SUBSCRIBE packet id 0", 4, pkt(0x82, "0000 0001 61 00"), PROTOCOL),
    ("SUBSCRIBE options reserved bits (3.1.1)", 4, pkt(0x82, "0001 0001 61 04"), MALFORMED),
    ("SUBSCRIBE options high bits (3.1.1)", 4, pkt(0x82, "0001 0001 61 80"), MALFORMED),
    ("SUBSCRIBE QoS 3 (3.1.1)", 4, pkt(0x82, "0001 0001 61 03"), MALFORMED),
    ("SUBSCRIBE options reserved bit 6 (5)", 5, pkt(0x82, "0001 00 0001 61 40"), MALFORMED),
    ("SUBSCRIBE options reserved bit 7 (5)", 5, pkt(0x82, "0001 00 0001 61 81"), MALFORMED),
    ("SUBSCRIBE maximum QoS 3 (5)", 5, pkt(0x82, "0001 00 0001 61 03"), PROTOCOL),
    ("SUBSCRIBE retain handling 3", 5, pkt(0x82, "0001 00 0001 61 30"), PROTOCOL),
    (
        "SUBSCRIBE no local on a shared subscription",
        5,
        pkt(0x82, "0001 00 000a 247368617265 2f672f61 04"),
        PROTOCOL,
    ),
    ("SUBSCRIBE filter without options", 4, pkt(0x82, "0001 0001 61"), MALFORMED),
    ("SUBSCRIBE second filter without options", 4, pkt(0x82, "0001 0001 61 00 0001 62"), MALFORMED),
    ("SUBSCRIBE filter not UTF-8", 4, pkt(0x82, "0001 0001 ff 00"), MALFORMED),
    ("SUBSCRIBE filter length overrun", 4, pkt(0x82, "0001 0009 61 00"), MALFORMED),
    (
        "SUBSCRIBE two subscription identifiers",
        5,
        pkt(0x82, "0001 04 0b01 0b02 0001 61 00"),
        PROTOCOL,
    ),
    ("SUBSCRIBE subscription identifier 0", 5, pkt(0x82, "0001 02 0b00 0001 61 00"), PROTOCOL),
    ("SUBSCRIBE property not allowed", 5, pkt(0x82, "0001 04 1f000161 0001 61 00"), MALFORMED),
    # --- UNSUBSCRIBE ---
    ("UNSUBSCRIBE without topic filters (3.1.1)", 4, pkt(0xA2, "0001"), PROTOCOL),
    ("UNSUBSCRIBE without topic filters (5)", 5, pkt(0xA2, "0001 00"), PROTOCOL),
    ("UNSUBSCRIBE packet id 0", 4, pkt(0xA2, "0000 0001 61"), PROTOCOL),
    ("UNSUBSCRIBE filter length overrun", 5, pkt(0xA2, "0001 00 0003 61"), MALFORMED),
    ("UNSUBSCRIBE property not allowed", 5, pkt(0xA2, "0001 04 1f000161 0001 61"), MALFORMED),
    # --- PINGREQ, DISCONNECT, AUTH ---
    ("PINGREQ with a body", 4, h("c0 01 00"), MALFORMED),
    ("DISCONNECT with a body (3.1.1)", 4, h("e0 01 00"), MALFORMED),
    ("DISCONNECT reason code not a DISCONNECT code", 5, h("e0 01 05"), PROTOCOL),
    ("DISCONNECT bytes after properties", 5, h("e0 03 80 00 ff"), MALFORMED),
    ("DISCONNECT property not allowed", 5, h("e0 05 00 03 220001"), MALFORMED),
    ("DISCONNECT duplicate session expiry", 5, h("e0 0c 00 0a 1100000001 1100000002"), PROTOCOL),
    ("AUTH reason code not an AUTH code", 5, h("f0 02 01 00"), PROTOCOL),
    ("AUTH property not allowed", 5, h("f0 04 18 02 2301"), MALFORMED),
    ("AUTH duplicate authentication method", 5, h("f0 0a 18 08 15000161 15000162"), PROTOCOL),
]


@pytest.mark.parametrize(
    ("level", "data", "expected"),
    [case[1:] for case in AFTER_CONNECT],
    ids=[case[0] for case in AFTER_CONNECT],
)
def test_server_side_rule(level: int, data: bytes, expected: tuple[type, int]) -> None:
    cls, code = expected
    decoder = MqttDecoder()
    [connect] = decoder.feed(CONNECT[level])
    assert connect.protocol_level == level
    with pytest.raises(cls) as info:
        decoder.feed(data)
    assert info.value.reason_code == code
    assert info.value.packet_type == data[0] >> 4
    assert info.value.packets == []


# (rule, bytes of the first packet, expected error)
FIRST_PACKET = [
    ("first packet is not CONNECT", h("c0 00"), PROTOCOL),
    ("first byte alone already shows PUBLISH", h("30"), PROTOCOL),
    ("CONNECT fixed header flags", pkt(0x12, f"{MQTT} 04 02 003c 0000"), MALFORMED),
    ("CONNECT reserved flag (bit 0)", pkt(0x10, f"{MQTT} 04 03 003c 0000"), MALFORMED),
    ("will QoS 3", pkt(0x10, f"{MQTT} 04 1e 003c 0000 0001 74 0000"), MALFORMED),
    ("will QoS without will flag", pkt(0x10, f"{MQTT} 04 0a 003c 0000"), MALFORMED),
    ("will retain without will flag", pkt(0x10, f"{MQTT} 05 22 003c 00 0000"), MALFORMED),
    ("password without user name (3.1.1)", pkt(0x10, f"{MQTT} 04 42 003c 0000 0001 70"), MALFORMED),
    ("CONNECT cut before protocol level", pkt(0x10, MQTT), MALFORMED),
    ("CONNECT cut before keep alive", pkt(0x10, f"{MQTT} 04 02"), MALFORMED),
    ("CONNECT client id overruns", pkt(0x10, f"{MQTT} 04 02 003c 0005"), MALFORMED),
    ("CONNECT client id not UTF-8", pkt(0x10, f"{MQTT} 04 02 003c 0001 80"), MALFORMED),
    ("CONNECT bytes after payload", pkt(0x10, f"{MQTT} 04 02 003c 0000 ff"), MALFORMED),
    ("CONNECT user name missing", pkt(0x10, f"{MQTT} 04 82 003c 0000"), MALFORMED),
    ("CONNECT will payload missing", pkt(0x10, f"{MQTT} 04 06 003c 0000 0001 74"), MALFORMED),
    ("CONNECT property not allowed", pkt(0x10, f"{MQTT} 05 02 003c 03 230001 0000"), MALFORMED),
    (
        "Will-only property in CONNECT",
        pkt(0x10, f"{MQTT} 05 02 003c 05 1800000001 0000"),
        MALFORMED,
    ),
    ("receive maximum 0", pkt(0x10, f"{MQTT} 05 02 003c 03 210000 0000"), PROTOCOL),
    ("maximum packet size 0", pkt(0x10, f"{MQTT} 05 02 003c 05 2700000000 0000"), PROTOCOL),
    ("request problem information 2", pkt(0x10, f"{MQTT} 05 02 003c 02 1702 0000"), PROTOCOL),
    ("request response information 2", pkt(0x10, f"{MQTT} 05 02 003c 02 1902 0000"), PROTOCOL),
    (
        "duplicate session expiry interval",
        pkt(0x10, f"{MQTT} 05 02 003c 0a 1100000001 1100000001 0000"),
        PROTOCOL,
    ),
    (
        "duplicate authentication method",
        pkt(0x10, f"{MQTT} 05 02 003c 08 15000161 15000161 0000"),
        PROTOCOL,
    ),
    (
        "CONNECT-only property in Will properties",
        pkt(0x10, f"{MQTT} 05 06 003c 00 0000 05 1100000001 0001 74 0000"),
        MALFORMED,
    ),
    (
        "Will properties overrun",
        pkt(0x10, f"{MQTT} 05 06 003c 00 0000 09 18000000"),
        MALFORMED,
    ),
]


@pytest.mark.parametrize(
    ("data", "expected"),
    [case[1:] for case in FIRST_PACKET],
    ids=[case[0] for case in FIRST_PACKET],
)
def test_first_packet_rule(data: bytes, expected: tuple[type, int]) -> None:
    cls, code = expected
    decoder = MqttDecoder()
    with pytest.raises(cls) as info:
        decoder.feed(data)
    assert info.value.reason_code == code
    assert info.value.packet_type == data[0] >> 4
    assert not decoder.connected


def test_failed_v5_connect_still_tells_the_protocol_level() -> None:
    """A v5 CONNECT that fails after its level byte is answered with a v5 CONNACK."""
    decoder = MqttDecoder()
    with pytest.raises(MalformedPacket):
        decoder.feed(pkt(0x10, f"{MQTT} 05 02 003c 03 230001 0000"))
    assert decoder.protocol_level == 5
    assert not decoder.connected


def test_password_without_user_name_is_fine_in_v5() -> None:
    [connect] = MqttDecoder().feed(pkt(0x10, f"{MQTT} 05 42 003c 00 0000 0001 70"))
    assert connect == Connect("", True, 60, None, None, b"p", {}, 5)


@pytest.mark.parametrize(
    ("data", "name", "level"),
    [
        (pkt(0x10, "0006 4d5149736470 03 02 003c 0000"), "MQIsdp", 3),  # MQTT 3.1
        (pkt(0x10, f"{MQTT} 06 02 003c 0000"), "MQTT", 6),
        (pkt(0x10, f"{MQTT} 03 02 003c 0000"), "MQTT", 3),
        (pkt(0x10, "0004 4d515458 04 02 003c 0000"), "MQTX", 4),
    ],
    ids=["MQIsdp 3", "MQTT 6", "MQTT 3", "MQTX 4"],
)
def test_unsupported_protocol_version(data: bytes, name: str, level: int) -> None:
    with pytest.raises(UnsupportedProtocolVersion) as info:
        MqttDecoder().feed(data)
    err = info.value
    assert err.reason_code == rc.UNSUPPORTED_PROTOCOL_VERSION == 0x84
    assert err.return_code == rc.CONNACK_UNACCEPTABLE_PROTOCOL_VERSION == 1
    assert (err.protocol_name, err.protocol_level) == (name, level)
    assert isinstance(err, MqttCodecError)


# (rule, level, bytes a client receives, expected error)
CLIENT_SIDE = [
    ("CONNACK reserved flags", 4, h("20 02 02 00"), MALFORMED),
    ("CONNACK return code 6 (3.1.1)", 4, h("20 02 00 06"), PROTOCOL),
    ("CONNACK longer than 2 bytes (3.1.1)", 4, h("20 03 00 00 00"), MALFORMED),
    ("CONNACK too short", 4, h("20 01 00"), MALFORMED),
    ("CONNACK session present with an error", 4, h("20 02 01 05"), PROTOCOL),
    ("CONNACK session present with an error (5)", 5, h("20 03 01 87 00"), PROTOCOL),
    ("CONNACK reason code not a CONNACK code", 5, h("20 03 00 05 00"), PROTOCOL),
    ("CONNACK without property length (5)", 5, h("20 02 00 00"), MALFORMED),
    ("CONNACK duplicate receive maximum", 5, h("20 09 00 00 06 21000a 21000b"), PROTOCOL),
    ("CONNACK maximum QoS 2", 5, h("20 05 00 00 02 2402"), PROTOCOL),
    ("CONNACK retain available 2", 5, h("20 05 00 00 02 2502"), PROTOCOL),
    ("CONNACK shared subscription available 7", 5, h("20 05 00 00 02 2a07"), PROTOCOL),
    ("CONNACK property not allowed", 5, h("20 07 00 00 04 1800000001"), MALFORMED),
    ("client-bound CONNECT", 4, CONNECT4, PROTOCOL),
    ("client-bound SUBSCRIBE", 5, pkt(0x82, "0001 00 0001 61 00"), PROTOCOL),
    ("client-bound UNSUBSCRIBE", 4, pkt(0xA2, "0001 0001 61"), PROTOCOL),
    ("client-bound PINGREQ", 4, h("c0 00"), PROTOCOL),
    ("client-bound DISCONNECT (3.1.1)", 4, h("e0 00"), PROTOCOL),
    ("SUBACK return code 3 (3.1.1)", 4, h("90 03 0001 03"), PROTOCOL),
    ("SUBACK reason code 0x05 (5)", 5, h("90 04 0001 00 05"), PROTOCOL),
    ("SUBACK packet id 0", 4, h("90 03 0000 00"), PROTOCOL),
    ("UNSUBACK with a payload (3.1.1)", 4, h("b0 03 0001 00"), MALFORMED),
    ("UNSUBACK reason code 0x05 (5)", 5, h("b0 04 0001 00 05"), PROTOCOL),
    ("PINGRESP with a body", 5, h("d0 01 00"), MALFORMED),
    ("PUBLISH flags QoS 3 to a client", 5, pkt(0x3E, "0001 61 0001 00"), MALFORMED),
]


@pytest.mark.parametrize(
    ("level", "data", "expected"),
    [case[1:] for case in CLIENT_SIDE],
    ids=[case[0] for case in CLIENT_SIDE],
)
def test_client_side_rule(level: int, data: bytes, expected: tuple[type, int]) -> None:
    cls, code = expected
    with pytest.raises(cls) as info:
        MqttDecoder(server=False, protocol_level=level).feed(data)
    assert info.value.reason_code == code


def test_packet_too_large_is_raised_on_the_fixed_header() -> None:
    decoder = MqttDecoder(max_packet_size=100)
    decoder.feed(CONNECT4)
    # Only the fixed header of a 1003-byte PUBLISH has arrived: rejected now, nothing buffered.
    with pytest.raises(PacketTooLarge) as info:
        decoder.feed(h("30 e8 07"))
    err = info.value
    assert (err.reason_code, err.size, err.limit) == (rc.PACKET_TOO_LARGE, 1003, 100)
    assert decoder.buffered == 0


def test_packet_too_large_counts_the_whole_packet() -> None:
    # The limit applies to the CONNECT too: two bytes tell its size, 14 > 10.
    with pytest.raises(PacketTooLarge):
        MqttDecoder(max_packet_size=10).feed(CONNECT4[:2])
    decoder = MqttDecoder()
    decoder.feed(CONNECT4)
    decoder.max_packet_size = 10
    at_limit = pkt(0x30, "0001 61 6162636465")  # 2 + 8 = 10 bytes
    assert decoder.feed(at_limit) == [Publish("a", b"abcde")]
    with pytest.raises(PacketTooLarge):
        decoder.feed(pkt(0x30, "0001 61 616263646566"))


def test_unlimited_packet_size() -> None:
    for limit in (0, None):
        decoder = MqttDecoder(max_packet_size=limit)
        assert decoder.max_packet_size == MAX_PACKET_SIZE
        decoder.feed(CONNECT4)
        assert decoder.feed(h("30 ff ff ff 7f 00")) == []  # 256 MB announced: buffered, waiting
        assert decoder.buffered == 6


def test_error_keeps_the_packets_decoded_before_it() -> None:
    decoder = MqttDecoder()
    with pytest.raises(MalformedPacket) as info:
        decoder.feed(CONNECT4 + h("c0 00") + pkt(0x30, "0001 61 78") + pkt(0x36, "0001 61 0001"))
    assert info.value.packets == [
        Connect("", True, 60),
        Pingreq(),
        Publish("a", b"x"),
    ]
    assert info.value.packet_type == 3
    assert "QoS 3" in str(info.value) and "0x81" in str(info.value)


def test_error_in_a_packet_completed_by_a_later_feed() -> None:
    decoder = MqttDecoder()
    decoder.feed(CONNECT5 + h("82"))
    with pytest.raises(ProtocolViolation) as info:
        decoder.feed(h("07 0001 00 0001 61 03"))
    assert info.value.packet_type == 8


def test_decoder_arguments() -> None:
    with pytest.raises(ValueError):
        MqttDecoder(server=False)
    with pytest.raises(ValueError):
        MqttDecoder(protocol_level=3)
    # A server-side decoder given a level skips the CONNECT handshake (and refuses a CONNECT).
    decoder = MqttDecoder(protocol_level=5)
    assert decoder.feed(pkt(0x30, "0001 61 00 78")) == [Publish("a", b"x")]
    with pytest.raises(ProtocolViolation):
        decoder.feed(CONNECT5)
