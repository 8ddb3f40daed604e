"""Property tests: decode(encode(p)) == p for every packet type, both levels, both directions,
and incremental decoding gives the same packets wherever the stream is split."""

from __future__ import annotations

from array import array

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from wire_mqtt_strategies import (
    client_packets,
    connects,
    levels,
    publishes,
    server_packets,
)

from flowmq_wire.mqtt import (
    Auth,
    Connack,
    Connect,
    Disconnect,
    MqttDecoder,
    Packet,
    PreparedPublish,
    ProtocolViolation,
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
    encode,
    encode_pubacks,
    encode_publish,
)
from flowmq_wire.mqtt import reason_codes as rc

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def client_sessions(draw: st.DrawFn) -> tuple[int, list]:
    level = draw(levels)
    return level, [draw(connects(level)), *draw(st.lists(client_packets(level), max_size=8))]


@st.composite
def server_sessions(draw: st.DrawFn) -> tuple[int, list]:
    level = draw(levels)
    return level, draw(st.lists(server_packets(level), min_size=1, max_size=8))


def _feed_split(decoder: MqttDecoder, stream: bytes, cuts: list[int]) -> list:
    out = []
    prev = 0
    for cut in [*sorted(cuts), len(stream)]:
        out += decoder.feed(stream[prev:cut])
        prev = cut
    return out


@SETTINGS
@given(client_sessions())
def test_client_to_server_roundtrip_whole_stream(session: tuple[int, list]) -> None:
    level, packets = session
    stream = b"".join(encode(p, level) for p in packets)
    decoder = MqttDecoder(server=True)
    assert decoder.feed(stream) == packets
    assert decoder.protocol_level == level
    assert decoder.connected
    assert decoder.buffered == 0


def _is_plain(p: Packet) -> bool:
    return (
        isinstance(p, Publish)
        and not (p.qos or p.retain or p.dup or p.properties)
        and bool(p.topic)
    )


@SETTINGS
@given(client_sessions(), st.data())
def test_plain_tuples_carry_plain_qos0_publish_as_received(
    session: tuple[int, list], data: st.DataObject
) -> None:
    """``plain_tuples``: a plain QoS 0 PUBLISH is (topic, payload, its bytes as received);
    every other packet decodes as before, wherever the stream is split."""
    level, packets = session
    packets += [Publish("plain/topic", b"payload"), Publish("plain/topic", b"", retain=True)]
    encoded = [encode(p, level) for p in packets]
    stream = b"".join(encoded)
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=10))
    expected = [
        (p.topic, p.payload, raw) if _is_plain(p) else p
        for p, raw in zip(packets, encoded, strict=True)
    ]
    assert _feed_split(MqttDecoder(plain_tuples=True), stream, cuts) == expected


def _plain_qos1_form(p: Packet, raw: bytes) -> object:
    """What ``plain_qos1`` makes of ``p``: a list for a plain QoS 1 PUBLISH, the packet id for a
    plain PUBACK, ``p`` itself otherwise."""
    if (
        isinstance(p, Publish)
        and p.qos == 1
        and not (p.retain or p.dup or p.properties)
        and bool(p.topic)
    ):
        return [p.topic, p.payload, raw, p.packet_id]
    if isinstance(p, Puback) and not (p.reason_code or p.properties):
        return p.packet_id
    return p


def _ids_spread(decoded: list) -> list:
    """``decoded`` with each run of plain PUBACKs (an array of packet ids) spread out."""
    out: list = []
    for item in decoded:
        if isinstance(item, array):
            assert item.typecode == "H" and len(item)
            out += list(item)
        else:
            out.append(item)
    return out


@SETTINGS
@given(client_sessions(), st.data())
def test_plain_qos1_carries_plain_qos1_publish_and_puback_as_received(
    session: tuple[int, list], data: st.DataObject
) -> None:
    """``plain_qos1``: a plain QoS 1 PUBLISH is [topic, payload, its bytes, packet id], a run of
    plain PUBACKs an array of their packet ids; every other packet (QoS 0 too) decodes as before, wherever the
    stream is split."""
    level, packets = session
    packets += [
        Publish("plain/topic", b"payload", qos=1, packet_id=7),
        Publish("plain/topic", b"", qos=1, packet_id=65535),
        Publish("plain/topic", b"x", qos=1, retain=True, packet_id=8),
        Publish("plain/topic", b"x", qos=1, dup=True, packet_id=9),
        Puback(7),
        Puback(8, rc.NO_MATCHING_SUBSCRIBERS) if level == 5 else Puback(8),
        *(Puback(i) for i in range(1, data.draw(st.integers(1, 300)))),
        Publish("plain/topic", b"payload", qos=1, packet_id=7),
        Puback(65535),
    ]
    encoded = [encode(p, level) for p in packets]
    stream = b"".join(encoded)
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=10))
    expected = [_plain_qos1_form(p, raw) for p, raw in zip(packets, encoded, strict=True)]
    assert _ids_spread(_feed_split(MqttDecoder(plain_qos1=True), stream, cuts)) == expected
    for got, p in zip(expected, packets, strict=True):
        if isinstance(got, list) and got[1]:
            # The packet id sits right before the payload (v5: and the empty properties).
            at = len(got[2]) - len(got[1]) - (3 if level == 5 else 2)
            assert (got[2][at] << 8) | got[2][at + 1] == p.packet_id


@SETTINGS
@given(st.lists(st.integers(1, 65535), min_size=1, max_size=600), st.data())
def test_encode_pubacks_gives_the_pubacks_of_a_run(ids: list[int], data: st.DataObject) -> None:
    """One write of PUBACKs for a run: what ``encode`` gives for each, joined; a run of plain
    ones decodes (``plain_qos1``) as their packet ids however the reads cut it."""
    assert encode_pubacks(ids) == b"".join(encode(Puback(i), 4) for i in ids)
    assert encode_pubacks(ids, rc.NO_MATCHING_SUBSCRIBERS) == b"".join(
        encode(Puback(i, rc.NO_MATCHING_SUBSCRIBERS), 5) for i in ids
    )
    stream = encode(Connect("c", protocol_level=4), 4) + encode_pubacks(ids)
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=6))
    decoded = _feed_split(MqttDecoder(plain_qos1=True), stream, cuts)
    assert _ids_spread(decoded[1:]) == ids


def test_a_puback_with_packet_id_0_in_a_run_is_refused_after_the_ones_before() -> None:
    decoder = MqttDecoder(plain_qos1=True)
    decoder.feed(encode(Connect("c", protocol_level=4), 4))
    try:
        decoder.feed(encode_pubacks([1, 2]) + b"\x40\x02\x00\x00" + encode_pubacks([3]))
    except ProtocolViolation as exc:
        assert _ids_spread(exc.packets) == [1, 2]
    else:
        raise AssertionError("PUBACK 0 accepted")


@SETTINGS
@given(server_sessions())
def test_server_to_client_roundtrip_whole_stream(session: tuple[int, list]) -> None:
    level, packets = session
    stream = b"".join(encode(p, level) for p in packets)
    assert MqttDecoder(server=False, protocol_level=level).feed(stream) == packets


@SETTINGS
@given(client_sessions(), st.data())
def test_client_to_server_split_anywhere(session: tuple[int, list], data: st.DataObject) -> None:
    level, packets = session
    stream = b"".join(encode(p, level) for p in packets)
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=10))
    assert _feed_split(MqttDecoder(), stream, cuts) == packets


@SETTINGS
@given(server_sessions(), st.data())
def test_server_to_client_split_anywhere(session: tuple[int, list], data: st.DataObject) -> None:
    level, packets = session
    stream = b"".join(encode(p, level) for p in packets)
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=10))
    decoder = MqttDecoder(server=False, protocol_level=level)
    assert _feed_split(decoder, stream, cuts) == packets
    assert decoder.buffered == 0


@settings(max_examples=50, deadline=None)
@given(levels, st.data())
def test_byte_at_a_time(level: int, data: st.DataObject) -> None:
    packets = [data.draw(connects(level)), *data.draw(st.lists(client_packets(level), max_size=4))]
    stream = b"".join(encode(p, level) for p in packets)
    decoder = MqttDecoder()
    out = []
    for i in range(len(stream)):
        out += decoder.feed(stream[i : i + 1])
    assert out == packets


@SETTINGS
@given(levels, st.data())
def test_encode_publish_and_prepared_match_encode(level: int, data: st.DataObject) -> None:
    p: Publish = data.draw(publishes(level))
    expected = encode(p, level)
    assert (
        encode_publish(p.topic, p.payload, p.qos, p.retain, p.dup, p.packet_id, p.properties, level)
        == expected
    )
    assert (
        encode_publish(
            p.topic.encode(), p.payload, p.qos, p.retain, p.dup, p.packet_id, p.properties, level
        )
        == expected
    )
    if "subscription_identifier" not in p.properties:
        prepared = PreparedPublish(p.topic, p.payload, p.properties, level)
        assert prepared.encode(p.qos, p.retain, p.dup, p.packet_id) == expected
        # Re-stamping the same prepared message for another subscriber stays consistent.
        assert prepared.encode(p.qos, p.retain, p.dup, p.packet_id) == expected


def _v4_projection(p: Packet) -> Packet:
    """What a 3.1.1 peer receives when ``p`` (a v5 packet) is encoded at level 4."""
    if isinstance(p, Connect):
        will = p.will and Will(p.will.topic, p.will.payload, p.will.qos, p.will.retain)
        return Connect(
            p.client_id, p.clean_start, p.keep_alive, will, p.username, p.password, {}, 4
        )
    if isinstance(p, Connack):
        return Connack(p.session_present, rc.connack_v5_to_v311(p.reason_code))
    if isinstance(p, Publish):
        return Publish(p.topic, p.payload, p.qos, p.retain, p.dup, p.packet_id)
    if isinstance(p, Puback | Pubrec | Pubrel | Pubcomp):
        return p.__class__(p.packet_id)
    if isinstance(p, Subscribe):
        return Subscribe(p.packet_id, [(f, SubscriptionOptions(o.qos)) for f, o in p.subscriptions])
    if isinstance(p, Suback):
        return Suback(p.packet_id, [rc.suback_v5_to_v311(c) for c in p.reason_codes])
    if isinstance(p, Unsubscribe):
        return Unsubscribe(p.packet_id, p.filters)
    if isinstance(p, Unsuback):
        return Unsuback(p.packet_id)
    if isinstance(p, Disconnect):
        return Disconnect()
    return p


def _v4_expressible(p: Packet) -> bool:
    # AUTH does not exist in 3.1.1; an empty topic only makes sense with a v5 topic alias;
    # a 3.1.1 password needs a user name.
    if isinstance(p, Auth):
        return False
    if isinstance(p, Publish):
        return bool(p.topic)
    if isinstance(p, Connect):
        return p.password is None or p.username is not None
    return True


@SETTINGS
@given(st.data())
def test_level4_encoding_drops_v5_fields(data: st.DataObject) -> None:
    """A v5 packet encoded for a 3.1.1 connection decodes as its 3.1.1 projection."""
    server = [p for p in data.draw(st.lists(server_packets(5), max_size=6)) if _v4_expressible(p)]
    server = [p for p in server if not isinstance(p, Disconnect)]
    stream = b"".join(encode(p, 4) for p in server)
    decoded = MqttDecoder(server=False, protocol_level=4).feed(stream)
    assert decoded == [_v4_projection(p) for p in server]

    connect = data.draw(connects(5))
    if connect.username is None:
        connect.password = None
    client = [connect, *data.draw(st.lists(client_packets(5), max_size=6))]
    client = [p for p in client if _v4_expressible(p)]
    stream = b"".join(encode(p, 4) for p in client)
    assert MqttDecoder().feed(stream) == [_v4_projection(p) for p in client]
