"""Cross-check against an independent MQTT 5 codec, the Rust-based ``mqtt5`` package.

For random v5 packets of every type: what we encode, mqtt5 decodes to the same fields; what
mqtt5 encodes from the same fields, we decode to the same fields. Fields are compared in mqtt5's
object model (``to_mqtt5``), which applies the spec's defaults for absent properties, so a
property that one side writes explicitly at its default value and the other omits compares
equal — as it means the same thing on the wire.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from wire_mqtt_strategies import client_packets, connects, server_packets

from flowmq_wire.mqtt import (
    Auth,
    Connack,
    Connect,
    Disconnect,
    MqttDecoder,
    Packet,
    Pingreq,
    Pingresp,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Unsuback,
    Unsubscribe,
    Will,
    encode,
)
from flowmq_wire.mqtt import reason_codes as rc

mqtt5 = pytest.importorskip("mqtt5")

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _users(props: Any) -> list[tuple[str, str]]:
    return list(props.get("user_property", []))


def _will_to_mqtt5(w: Will) -> Any:
    props = w.properties
    return mqtt5.Will(
        w.topic,
        payload=w.payload,
        qos=mqtt5.QoS(w.qos),
        retain=w.retain,
        payload_format_indicator=props.get("payload_format_indicator", 0),
        message_expiry_interval=props.get("message_expiry_interval"),
        content_type=props.get("content_type"),
        response_topic=props.get("response_topic"),
        correlation_data=props.get("correlation_data"),
        will_delay_interval=props.get("will_delay_interval", 0),
        user_properties=_users(props),
    )


def to_mqtt5(p: Packet) -> Any:
    """The mqtt5 object with the same meaning as our packet."""
    props = getattr(p, "properties", {})
    if isinstance(p, Connect):
        return mqtt5.ConnectPacket(
            p.client_id,
            username=p.username,
            password=p.password,
            clean_start=p.clean_start,
            will=p.will and _will_to_mqtt5(p.will),
            keep_alive=p.keep_alive,
            session_expiry_interval=props.get("session_expiry_interval", 0),
            authentication_method=props.get("authentication_method"),
            authentication_data=props.get("authentication_data"),
            request_problem_info=bool(props.get("request_problem_information", 1)),
            request_response_info=bool(props.get("request_response_information", 0)),
            receive_max=props.get("receive_maximum", 65535),
            topic_alias_max=props.get("topic_alias_maximum", 0),
            max_packet_size=props.get("maximum_packet_size"),
            user_properties=_users(props),
        )
    if isinstance(p, Connack):
        return mqtt5.ConnAckPacket(
            session_present=p.session_present,
            reason_code=mqtt5.ConnAckReasonCode(p.reason_code),
            session_expiry_interval=props.get("session_expiry_interval"),
            assigned_client_id=props.get("assigned_client_identifier"),
            server_keep_alive=props.get("server_keep_alive"),
            authentication_method=props.get("authentication_method"),
            authentication_data=props.get("authentication_data"),
            response_info=props.get("response_information"),
            server_reference=props.get("server_reference"),
            reason_str=props.get("reason_string"),
            receive_max=props.get("receive_maximum", 65535),
            topic_alias_max=props.get("topic_alias_maximum", 0),
            max_qos=mqtt5.QoS(props.get("maximum_qos", 2)),
            retain_available=bool(props.get("retain_available", 1)),
            max_packet_size=props.get("maximum_packet_size"),
            wildcard_subscription_available=bool(props.get("wildcard_subscription_available", 1)),
            subscription_id_available=bool(props.get("subscription_identifier_available", 1)),
            shared_subscription_available=bool(props.get("shared_subscription_available", 1)),
            user_properties=_users(props),
        )
    if isinstance(p, Publish):
        return mqtt5.PublishPacket(
            p.topic,
            p.payload,
            qos=mqtt5.QoS(p.qos),
            retain=p.retain,
            packet_id=p.packet_id,
            duplicate=p.dup,
            payload_format_indicator=props.get("payload_format_indicator", 0),
            message_expiry_interval=props.get("message_expiry_interval"),
            content_type=props.get("content_type"),
            response_topic=props.get("response_topic"),
            correlation_data=props.get("correlation_data"),
            subscription_ids=list(props.get("subscription_identifier", [])),
            topic_alias=props.get("topic_alias"),
            user_properties=_users(props),
        )
    responses = {
        Puback: (mqtt5.PubAckPacket, mqtt5.PubAckReasonCode),
        Pubrec: (mqtt5.PubRecPacket, mqtt5.PubRecReasonCode),
        Pubrel: (mqtt5.PubRelPacket, mqtt5.PubRelReasonCode),
        Pubcomp: (mqtt5.PubCompPacket, mqtt5.PubCompReasonCode),
    }
    if p.__class__ in responses:
        cls, codes = responses[p.__class__]
        return cls(
            p.packet_id,
            reason_code=codes(p.reason_code),
            reason_str=props.get("reason_string"),
            user_properties=_users(props),
        )
    if isinstance(p, Subscribe):
        return mqtt5.SubscribePacket(
            p.packet_id,
            [
                mqtt5.TopicFilter(
                    f,
                    max_qos=mqtt5.QoS(o.qos),
                    no_local=o.no_local,
                    retain_as_published=o.retain_as_published,
                    retain_handling=mqtt5.RetainHandling(o.retain_handling),
                )
                for f, o in p.subscriptions
            ],
            subscription_id=props.get("subscription_identifier"),
            user_properties=_users(props),
        )
    if isinstance(p, Suback):
        return mqtt5.SubAckPacket(
            p.packet_id,
            [mqtt5.SubAckReasonCode(c) for c in p.reason_codes],
            reason_str=props.get("reason_string"),
            user_properties=_users(props),
        )
    if isinstance(p, Unsubscribe):
        return mqtt5.UnsubscribePacket(p.packet_id, list(p.filters), user_properties=_users(props))
    if isinstance(p, Unsuback):
        return mqtt5.UnsubAckPacket(
            p.packet_id,
            [mqtt5.UnsubAckReasonCode(c) for c in p.reason_codes],
            reason_str=props.get("reason_string"),
            user_properties=_users(props),
        )
    if isinstance(p, Pingreq):
        return mqtt5.PingReqPacket()
    if isinstance(p, Pingresp):
        return mqtt5.PingRespPacket()
    if isinstance(p, Disconnect):
        return mqtt5.DisconnectPacket(
            reason_code=mqtt5.DisconnectReasonCode(p.reason_code),
            session_expiry_interval=props.get("session_expiry_interval"),
            server_reference=props.get("server_reference"),
            reason_str=props.get("reason_string"),
            user_properties=_users(props),
        )
    if isinstance(p, Auth):
        return mqtt5.AuthPacket(
            reason_code=mqtt5.AuthReasonCode(p.reason_code),
            authentication_method=props.get("authentication_method"),
            authentication_data=props.get("authentication_data"),
            reason_str=props.get("reason_string"),
            user_properties=_users(props),
        )
    raise AssertionError(p)


def _mqtt5_read(data: bytes) -> Any:
    packet, size = mqtt5.read(memoryview(data))
    assert size == len(data)
    return packet


def _ours_read(data: bytes, *, server: bool) -> Packet:
    decoder = MqttDecoder(server=server, protocol_level=None if server else 5)
    if server and data[0] >> 4 != 1:
        decoder.feed(encode(Connect("x"), 5))
    [packet] = decoder.feed(data)
    return packet


def _check(p: Packet, *, server: bool) -> None:
    expected = to_mqtt5(p)
    ours = encode(p, 5)
    # ours → mqtt5. mqtt5 0.8 insists on a property length in AUTH, but §3.15.2.1 lets a
    # Success AUTH without properties have remaining length 0, which is what we send.
    if ours != b"\xf0\x00":
        assert _mqtt5_read(ours) == expected
    # mqtt5 → ours
    theirs = expected.write()
    assert to_mqtt5(_ours_read(theirs, server=server)) == expected


@SETTINGS
@given(st.one_of(connects(5), client_packets(5)))
def test_client_packets_agree_with_mqtt5(p: Packet) -> None:
    _check(p, server=True)


@SETTINGS
@given(server_packets(5))
def test_server_packets_agree_with_mqtt5(p: Packet) -> None:
    _check(p, server=False)


def test_reason_code_tables_agree_with_mqtt5() -> None:
    """Our per-packet reason code sets are the ones mqtt5 derives from the same spec tables."""
    pairs = [
        (rc.CONNACK_REASON_CODES, mqtt5.ConnAckReasonCode),
        (rc.PUBACK_REASON_CODES, mqtt5.PubAckReasonCode),
        (rc.PUBREC_REASON_CODES, mqtt5.PubRecReasonCode),
        (rc.PUBREL_REASON_CODES, mqtt5.PubRelReasonCode),
        (rc.PUBCOMP_REASON_CODES, mqtt5.PubCompReasonCode),
        (rc.SUBACK_REASON_CODES, mqtt5.SubAckReasonCode),
        (rc.UNSUBACK_REASON_CODES, mqtt5.UnsubAckReasonCode),
        (rc.DISCONNECT_REASON_CODES, mqtt5.DisconnectReasonCode),
        (rc.AUTH_REASON_CODES, mqtt5.AuthReasonCode),
    ]
    for ours, theirs in pairs:
        # pyo3 enums are not iterable: collect the class attributes that are members.
        members = {
            name: int(getattr(theirs, name))
            for name in dir(theirs)
            if not name.startswith("_") and isinstance(getattr(theirs, name), theirs)
        }
        assert ours == set(members.values()), theirs.__name__
        for name, value in members.items():
            assert value in rc.ALL_REASON_CODES, name


def test_fixed_examples_agree_with_mqtt5() -> None:
    """A few hand-picked packets exercising every property type, both ways."""
    examples: list[tuple[Packet, bool]] = [
        (
            Connect(
                "client-1",
                clean_start=True,
                keep_alive=30,
                will=Will(
                    "will/topic",
                    b"bye",
                    1,
                    True,
                    {
                        "will_delay_interval": 10,
                        "payload_format_indicator": 1,
                        "message_expiry_interval": 3600,
                        "content_type": "text/plain",
                        "response_topic": "r/t",
                        "correlation_data": b"\x00\x01",
                        "user_property": [("a", "1"), ("a", "2")],
                    },
                ),
                username="user",
                password=b"secret",
                properties={
                    "session_expiry_interval": 120,
                    "receive_maximum": 20,
                    "maximum_packet_size": 1 << 20,
                    "topic_alias_maximum": 10,
                    "request_response_information": 1,
                    "request_problem_information": 0,
                    "authentication_method": "SCRAM-SHA-1",
                    "authentication_data": b"xyz",
                },
                protocol_level=5,
            ),
            True,
        ),
        (
            Publish(
                "sensors/1",
                b"22.5",
                2,
                True,
                True,
                65535,
                {
                    "subscription_identifier": [1, 268_435_455],
                    "topic_alias": 7,
                    "user_property": [("k", "v")],
                },
            ),
            False,
        ),
        (Publish("", b"x", 1, False, False, 9, {"topic_alias": 7}), True),
        (
            Connack(
                False,
                0,
                {
                    "assigned_client_identifier": "auto-1",
                    "server_keep_alive": 15,
                    "maximum_qos": 1,
                    "retain_available": 0,
                    "wildcard_subscription_available": 0,
                    "subscription_identifier_available": 0,
                    "shared_subscription_available": 0,
                    "topic_alias_maximum": 5,
                    "receive_maximum": 100,
                    "response_information": "resp/",
                    "server_reference": "other:1883",
                    "reason_string": "ok",
                },
            ),
            False,
        ),
        (Disconnect(rc.SESSION_TAKEN_OVER, {"reason_string": "taken over"}), False),
        (Disconnect(rc.DISCONNECT_WITH_WILL_MESSAGE, {"session_expiry_interval": 0}), True),
    ]
    for packet, server in examples:
        _check(packet, server=server)
