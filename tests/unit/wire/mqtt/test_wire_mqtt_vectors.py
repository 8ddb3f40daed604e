"""Known byte vectors: the spec's examples and real captures.

Client→server captures are what mosquitto_pub / mosquitto_sub 2.0.11 (Debian) sent to a
listening socket; server→client captures are what the mosquitto 2.0.11 broker answered. Each is
decoded to the expected packets and re-encoded byte for byte.
"""

from __future__ import annotations

import pytest

from flowmq_wire.mqtt import (
    EMPTY_PROPERTIES,
    Auth,
    Connack,
    Connect,
    Disconnect,
    MqttDecoder,
    Packet,
    Pingreq,
    Pingresp,
    PreparedPublish,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    SubscriptionOptions,
    Unsuback,
    Will,
    encode,
    encode_publish,
)
from flowmq_wire.mqtt import reason_codes as rc
from flowmq_wire.mqtt.primitives import (
    MAX_VBI,
    decode_binary,
    decode_string,
    decode_vbi,
    encode_binary,
    encode_string,
    encode_vbi,
)
from flowmq_wire.mqtt.properties import PROPERTY_IDS, decode_properties, encode_properties

h = bytes.fromhex

# (what was run, protocol level, bytes on the wire, packets)
CLIENT_CAPTURES = [
    (
        "mosquitto_pub -V mqttv311 -i mosq-test -t a/b -m hello",
        4,
        h("101500044d5154540402003c00096d6f73712d74657374300a0003612f6268656c6c6fe000"),
        [Connect("mosq-test", True, 60), Publish("a/b", b"hello"), Disconnect()],
    ),
    (
        "mosquitto_pub -V mqttv311 -i pub1 -u user -P pass -t sensors/temp -m 21.5 -q 1 -r"
        " --will-topic w/t --will-payload gone --will-qos 1 --will-retain",
        4,
        h(
            "102700044d51545404ee003c0004707562310003772f740004676f6e6500047573657200047061737333"
            "14000c73656e736f72732f74656d70000132312e35e000"
        ),
        [
            Connect("pub1", True, 60, Will("w/t", b"gone", 1, True), "user", b"pass"),
            Publish("sensors/temp", b"21.5", 1, True, False, 1),
            Disconnect(),
        ],
    ),
    (
        "mosquitto_pub -V mqttv311 -i pub2 -t q2 -m two -q 2",
        4,
        h("101000044d5154540402003c000470756232340900027132000174776f62020001e000"),
        [
            Connect("pub2", True, 60),
            Publish("q2", b"two", 2, False, False, 1),
            Pubrel(1),
            Disconnect(),
        ],
    ),
    (
        "mosquitto_sub -V mqttv311 -i sub1 -t a/# -t b/+ -q 1 -c",
        4,
        h("101000044d5154540400003c000473756231820e00010003612f23010003622f2b01e000"),
        [
            Connect("sub1", False, 60),
            Subscribe(1, [("a/#", SubscriptionOptions(1)), ("b/+", SubscriptionOptions(1))]),
            Disconnect(),
        ],
    ),
    (
        "mosquitto_pub -V mqttv5 -i v5pub -t a/b -m hello -q 1 -D connect session-expiry-interval"
        " 60 -D publish user-property k v -D publish content-type text/plain"
        " -D publish message-expiry-interval 30",
        5,
        h(
            "101a00044d5154540502003c08110000003c2100140005763570756232260003612f62000119260001"
            "6b00017603000a746578742f706c61696e020000001e68656c6c6fe000"
        ),
        [
            Connect(
                "v5pub",
                True,
                60,
                properties={"session_expiry_interval": 60, "receive_maximum": 20},
                protocol_level=5,
            ),
            Publish(
                "a/b",
                b"hello",
                1,
                False,
                False,
                1,
                {
                    "user_property": [("k", "v")],
                    "content_type": "text/plain",
                    "message_expiry_interval": 30,
                },
            ),
            Disconnect(),
        ],
    ),
    (
        "mosquitto_sub -V mqttv5 -i sub5 -t a/# -q 2 -D subscribe subscription-identifier 7"
        " -D subscribe user-property u p",
        5,
        h(
            "101400044d5154540502003c0321000100047375623582120001090b07260001750001700003612f23"
            "02e000"
        ),
        [
            Connect("sub5", True, 60, properties={"receive_maximum": 1}, protocol_level=5),
            Subscribe(
                1,
                [("a/#", SubscriptionOptions(2))],
                {"subscription_identifier": 7, "user_property": [("u", "p")]},
            ),
            Disconnect(),
        ],
    ),
    (
        "mosquitto_pub -V mqttv5 -i w5 -u me -t t -m m --will-topic w/t --will-payload bye"
        " -D will will-delay-interval 5 -D will user-property a b -D connect maximum-packet-size"
        " 10000 -D connect topic-alias-maximum 10 -D disconnect session-expiry-interval 0",
        5,
        h(
            "103500044d5154540586003c0b270000271022000a210014000277350c1800000005260001610001"
            "620003772f74000362796500026d653005000174006de00700051100000000"
        ),
        [
            Connect(
                "w5",
                True,
                60,
                Will(
                    "w/t",
                    b"bye",
                    properties={"will_delay_interval": 5, "user_property": [("a", "b")]},
                ),
                "me",
                None,
                {"maximum_packet_size": 10000, "topic_alias_maximum": 10, "receive_maximum": 20},
                5,
            ),
            Publish("t", b"m"),
            Disconnect(0, {"session_expiry_interval": 0}),
        ],
    ),
]

SERVER_CAPTURES = [
    (
        "mosquitto 3.1.1: CONNACK, SUBACK, own QoS 1 PUBLISH echoed, PUBACK, PINGRESP, UNSUBACK",
        4,
        h("20020000900300010132090003612f620001686940020002d000b0020003"),
        [
            Connack(),
            Suback(1, [1]),
            Publish("a/b", b"hi", 1, False, False, 1),
            Puback(2),
            Pingresp(),
            Unsuback(3),
        ],
    ),
    (
        "mosquitto 3.1.1: QoS 2 flow",
        4,
        h("2002000090030001025002000534090003632f640001713270020005"),
        [
            Connack(),
            Suback(1, [2]),
            Pubrec(5),
            Publish("c/d", b"q2", 2, False, False, 1),
            Pubcomp(5),
        ],
    ),
    (
        "mosquitto v5: CONNACK with properties, PUBLISH with subscription identifier",
        5,
        h(
            "200900000622000a21001490040001000132180003612f6200010e0b2a2600016b000176020000006468"
            "6940020002d000b0050003000011"
        ),
        [
            Connack(False, 0, {"topic_alias_maximum": 10, "receive_maximum": 20}),
            Suback(1, [1]),
            Publish(
                "a/b",
                b"hi",
                1,
                False,
                False,
                1,
                {
                    "subscription_identifier": [42],
                    "user_property": [("k", "v")],
                    "message_expiry_interval": 100,
                },
            ),
            Puback(2),
            Pingresp(),
            Unsuback(3, [rc.SUCCESS, rc.NO_SUBSCRIPTION_EXISTED]),
        ],
    ),
    (
        "mosquitto v5: DISCONNECT 0x82 after a PUBLISH to 'bad/#'",
        5,
        h("200900000622000a210014e00182"),
        [
            Connack(False, 0, {"topic_alias_maximum": 10, "receive_maximum": 20}),
            Disconnect(rc.PROTOCOL_ERROR),
        ],
    ),
    (
        "mosquitto v5: CONNACK 0x8C for an unknown authentication method",
        5,
        h("2003008c00"),
        [Connack(False, rc.BAD_AUTHENTICATION_METHOD)],
    ),
    (
        "mosquitto 3.1.1: CONNACK 1 for protocol level 7",
        4,
        h("20020001"),
        [Connack(False, rc.CONNACK_UNACCEPTABLE_PROTOCOL_VERSION)],
    ),
]


@pytest.mark.parametrize(
    ("level", "wire", "packets"),
    [c[1:] for c in CLIENT_CAPTURES],
    ids=[c[0][:60] for c in CLIENT_CAPTURES],
)
def test_client_captures(level: int, wire: bytes, packets: list[Packet]) -> None:
    decoder = MqttDecoder()
    assert decoder.feed(wire) == packets
    assert decoder.protocol_level == level
    assert b"".join(encode(p, level) for p in packets) == wire


@pytest.mark.parametrize(
    ("level", "wire", "packets"),
    [c[1:] for c in SERVER_CAPTURES],
    ids=[c[0][:60] for c in SERVER_CAPTURES],
)
def test_server_captures(level: int, wire: bytes, packets: list[Packet]) -> None:
    assert MqttDecoder(server=False, protocol_level=level).feed(wire) == packets
    assert b"".join(encode(p, level) for p in packets) == wire


def test_fixed_two_byte_packets() -> None:
    assert encode(Pingreq(), 4) == encode(Pingreq(), 5) == h("c000")
    assert encode(Pingresp(), 4) == h("d000")
    assert encode(Disconnect(), 4) == encode(Disconnect(), 5) == h("e000")
    assert encode(Auth(), 5) == h("f000")
    assert encode(Puback(0x1234), 5) == h("40021234")
    assert encode(Pubrel(1), 4) == h("62020001")
    assert encode(Pubrec(7, rc.NO_MATCHING_SUBSCRIBERS), 5) == h("5003000710")
    assert encode(Disconnect(rc.DISCONNECT_WITH_WILL_MESSAGE), 5) == h("e00104")
    # v5-only information disappears at level 4.
    assert encode(Puback(7, rc.NOT_AUTHORIZED, {"reason_string": "no"}), 4) == h("40020007")
    assert encode(Disconnect(rc.SERVER_SHUTTING_DOWN), 4) == h("e000")
    d = MqttDecoder()
    assert d.feed(h("101000044d5154540402003c000470756232") + h("c000e000")) == [
        Connect("pub2", True, 60),
        Pingreq(),
        Disconnect(),
    ]


def test_subscribe_options_encoding() -> None:
    opts = SubscriptionOptions(1, no_local=True, retain_as_published=True, retain_handling=2)
    assert encode(Subscribe(1, [("a", opts)]), 5) == h("82 07 0001 00 0001 61 2d")
    assert encode(Subscribe(1, [("a", opts)]), 4) == h("82 06 0001 0001 61 01")
    # A bare int is taken as the options byte as is.
    assert encode(Subscribe(1, [("a", 2)]), 4) == h("82 06 0001 0001 61 02")  # type: ignore[list-item]


def test_level4_maps_v5_codes() -> None:
    assert encode(Connack(False, rc.NOT_AUTHORIZED), 4) == h("20020005")
    assert encode(Connack(False, rc.BAD_USER_NAME_OR_PASSWORD), 4) == h("20020004")
    assert encode(Connack(False, rc.CLIENT_IDENTIFIER_NOT_VALID), 4) == h("20020002")
    assert encode(Connack(False, rc.SERVER_BUSY), 4) == h("20020003")
    assert encode(Connack(True, 0), 4) == h("20020100")
    assert encode(Suback(1, [0, 1, 2, rc.NOT_AUTHORIZED, rc.QUOTA_EXCEEDED]), 4) == h(
        "9007000100010280" + "80"
    )
    assert encode(Unsuback(9, [rc.NO_SUBSCRIPTION_EXISTED]), 4) == h("b0020009")


def test_connack_v5_to_v311_covers_every_connack_code() -> None:
    assert rc.connack_v5_to_v311(rc.SUCCESS) == rc.CONNACK_ACCEPTED
    assert rc.connack_v5_to_v311(rc.UNSUPPORTED_PROTOCOL_VERSION) == 1
    assert rc.connack_v5_to_v311(rc.CLIENT_IDENTIFIER_NOT_VALID) == 2
    assert rc.connack_v5_to_v311(rc.SERVER_UNAVAILABLE) == 3
    assert rc.connack_v5_to_v311(rc.BAD_USER_NAME_OR_PASSWORD) == 4
    assert rc.connack_v5_to_v311(rc.NOT_AUTHORIZED) == 5
    assert rc.connack_v5_to_v311(rc.BANNED) == 5
    for code in range(6):
        assert rc.connack_v5_to_v311(code) == code
    for code in rc.CONNACK_REASON_CODES:
        assert rc.connack_v5_to_v311(code) in rc.CONNACK_V311_RETURN_CODES
    assert rc.suback_v5_to_v311(rc.GRANTED_QOS_2) == 2
    assert rc.suback_v5_to_v311(rc.WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED) == rc.SUBACK_FAILURE


def test_reason_code_constants() -> None:
    assert (rc.MALFORMED_PACKET, rc.PROTOCOL_ERROR, rc.SESSION_TAKEN_OVER) == (0x81, 0x82, 0x8E)
    assert (rc.TOPIC_FILTER_INVALID, rc.TOPIC_NAME_INVALID, rc.PACKET_ID_IN_USE) == (
        0x8F,
        0x90,
        0x91,
    )
    assert (rc.PACKET_ID_NOT_FOUND, rc.RECEIVE_MAXIMUM_EXCEEDED, rc.TOPIC_ALIAS_INVALID) == (
        0x92,
        0x93,
        0x94,
    )
    assert (rc.PACKET_TOO_LARGE, rc.QOS_NOT_SUPPORTED) == (0x95, 0x9B)
    assert rc.SHARED_SUBSCRIPTIONS_NOT_SUPPORTED == 0x9E
    assert rc.WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED == 0xA2
    assert len(rc.ALL_REASON_CODES) == 43
    assert rc.reason_code_name(0x87) == "Not authorized"
    assert "Unknown" in rc.reason_code_name(0x42)


@pytest.mark.parametrize(
    ("value", "wire"),
    [
        # MQTT 5 Table 1-1 "Size of Variable Byte Integer": the boundaries of each width.
        (0, "00"),
        (127, "7f"),
        (128, "8001"),
        (16_383, "ff7f"),
        (16_384, "808001"),
        (2_097_151, "ffff7f"),
        (2_097_152, "80808001"),
        (268_435_455, "ffffff7f"),
        (321, "c102"),  # the spec's worked example: 321 = 65 + 2*128
    ],
)
def test_variable_byte_integer(value: int, wire: str) -> None:
    assert encode_vbi(value) == h(wire)
    assert decode_vbi(h(wire) + b"\xaa", 0, len(wire) // 2 + 1) == (value, len(wire) // 2)


def test_vbi_and_string_errors() -> None:
    with pytest.raises(ValueError):
        encode_vbi(MAX_VBI + 1)
    with pytest.raises(ValueError):
        encode_vbi(-1)
    with pytest.raises(ValueError):
        encode_string("x" * 65536)
    with pytest.raises(ValueError):
        encode_binary(b"x" * 65536)
    with pytest.raises(UnicodeEncodeError):
        encode_string("\ud800")


def test_string_and_binary_helpers() -> None:
    assert encode_string("A\U0002a6d4") == h("000541f0aa9b94")  # the spec's example 1.5.4
    assert decode_string(h("000541f0aa9b94"), 0, 7) == ("A\U0002a6d4", 7)
    # U+FEFF is kept, never stripped as a BOM [MQTT-1.5.4-3].
    assert decode_string(h("0003efbbbf"), 0, 5) == ("\ufeff", 5)
    assert encode_binary(b"\x00\xff") == h("000200ff")
    assert decode_binary(h("000200ff"), 0, 4) == (b"\x00\xff", 4)


def test_property_codec_order_and_repeats() -> None:
    props = {
        "user_property": [("a", "1"), ("a", "2"), ("b", "")],
        "subscription_identifier": [5, 300],
        "correlation_data": b"\x01",
        "message_expiry_interval": None,  # skipped
    }
    wire = encode_properties(props)
    assert wire == h(
        "1d" + "2600016100013126000161000132260001620000" + "0b05" + "0bac02" + "0900" + "0101"
    )
    decoded, end = decode_properties(wire, 0, len(wire), 3)
    assert end == len(wire)
    assert decoded == {k: v for k, v in props.items() if v is not None}
    assert encode_properties({}) == encode_properties(None) == b"\x00"
    assert decode_properties(b"\x00", 0, 1, 3) == (EMPTY_PROPERTIES, 1)
    with pytest.raises(ValueError):
        encode_properties({"no_such_property": 1})
    assert PROPERTY_IDS["shared_subscription_available"] == 0x2A
    assert len(PROPERTY_IDS) == 27


def test_encode_publish_lengths_and_flags() -> None:
    assert encode_publish("a/b", b"hello") == h("300a0003612f6268656c6c6f")
    assert encode_publish("a/b", b"hello", 1, True, True, 10) == h("3b0c0003612f62000a68656c6c6f")
    assert encode_publish("a/b", b"hello", protocol_level=5) == h("300b0003612f620068656c6c6f")
    assert encode_publish(b"a/b", b"", 2, False, False, 1, None, 5) == h("34080003612f62000100")
    # Two-, three- and four-byte remaining lengths.
    for size in (200, 20_000, 3_000_000):
        wire = encode_publish("t", bytes(size))
        [p] = MqttDecoder(server=False, protocol_level=4, max_packet_size=0).feed(wire)
        assert p == Publish("t", bytes(size))


def test_prepared_publish_shares_qos0_bytes() -> None:
    prepared = PreparedPublish("a/b", b"hello", {"content_type": "t"}, 5)
    first = prepared.encode()
    assert prepared.encode() is first
    assert first == encode_publish("a/b", b"hello", 0, False, False, None, {"content_type": "t"}, 5)
    assert prepared.encode(0, True) == encode_publish(
        "a/b", b"hello", 0, True, False, None, {"content_type": "t"}, 5
    )
    for pid in (1, 2, 65535):
        assert prepared.encode(2, False, True, pid) == encode_publish(
            "a/b", b"hello", 2, False, True, pid, {"content_type": "t"}, 5
        )
    big = PreparedPublish("t", bytes(20_000))
    assert big.encode(1, packet_id=3) == encode_publish("t", bytes(20_000), 1, packet_id=3)


def test_packet_value_semantics() -> None:
    assert Publish("a", b"x") == Publish("a", b"x", properties={})
    assert Publish("a", b"x") != Publish("a", b"y")
    assert Puback(1) != Pubrec(1)
    assert Puback(1) != Puback(2)
    assert repr(Puback(1)) == "Puback(packet_id=1, reason_code=0, properties={})"
    assert Unsuback(1) == Unsuback(1, [])
    with pytest.raises(TypeError):
        hash(Publish("a"))
    with pytest.raises(TypeError):
        EMPTY_PROPERTIES["x"] = 1  # type: ignore[index]
    with pytest.raises(TypeError):
        encode(object(), 4)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        encode(Auth(), 4)
    with pytest.raises(ValueError):
        encode(Pingreq(), 3)


def test_packets_share_the_empty_properties_and_take_no_stray_attributes() -> None:
    """A packet built without properties holds the shared EMPTY_PROPERTIES (the decoder's hot
    path allocates nothing for them); packets are slotted, so a misspelt field fails loudly."""
    defaults = [Connect(), Connack(), Publish("a"), Puback(1), Pubcomp(1), Suback(1)]
    defaults += [Unsuback(1), Subscribe(1, []), Disconnect(), Auth(), Will("w")]
    for packet in defaults:
        assert packet.properties is EMPTY_PROPERTIES, packet
        with pytest.raises(AttributeError):
            packet.reasoncode = 1  # type: ignore[union-attr]
    assert (Puback.TYPE, Pubrec.TYPE, Pubrel.TYPE, Pingresp.TYPE, Auth.TYPE) == (4, 5, 6, 13, 15)
    assert Suback(1).reason_codes is not Suback(1).reason_codes
