"""Whatever bytes arrive, the decoder either returns packets or raises MqttCodecError —
never another exception, which the broker would not catch as a protocol error."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from wire_mqtt_strategies import client_packets, connects, levels, server_packets

from flowmq_wire.mqtt import MqttCodecError, MqttDecoder, Puback, Publish, encode

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _feed_all(decoder: MqttDecoder, chunks: list[bytes]) -> None:
    try:
        for chunk in chunks:
            decoder.feed(chunk)
    except MqttCodecError:
        pass


def _server_decoder(data: st.DataObject) -> MqttDecoder:
    """A server's decoder, as is or as the broker's MQTT listener sets it up (plain PUBLISH
    packets and runs of PUBACKs without packet objects)."""
    as_broker = data.draw(st.booleans())
    return MqttDecoder(plain_tuples=as_broker, plain_qos1=as_broker)


def _mutate(data: st.DataObject, stream: bytes) -> bytes:
    buf = bytearray(stream)
    for _ in range(data.draw(st.integers(1, 4))):
        if not buf:
            break
        i = data.draw(st.integers(0, len(buf) - 1))
        action = data.draw(st.sampled_from(["flip", "set", "delete", "insert"]))
        if action == "flip":
            buf[i] ^= 1 << data.draw(st.integers(0, 7))
        elif action == "set":
            buf[i] = data.draw(st.integers(0, 255))
        elif action == "delete":
            del buf[i]
        else:
            buf.insert(i, data.draw(st.integers(0, 255)))
    return bytes(buf)


def _split(data: st.DataObject, stream: bytes) -> list[bytes]:
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=4)))
    bounds = [0, *cuts, len(stream)]
    return [stream[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


@SETTINGS
@given(levels, st.binary(max_size=200), st.data())
def test_random_bytes_after_connect(level: int, junk: bytes, data: st.DataObject) -> None:
    decoder = _server_decoder(data)
    decoder.feed(encode(data.draw(connects(level)), level))
    _feed_all(decoder, _split(data, junk))


@SETTINGS
@given(st.binary(max_size=120), st.data())
def test_random_first_bytes(junk: bytes, data: st.DataObject) -> None:
    _feed_all(_server_decoder(data), _split(data, b"\x10" + junk))


@SETTINGS
@given(levels, st.data())
def test_mutated_client_streams(level: int, data: st.DataObject) -> None:
    packets = [data.draw(connects(level)), *data.draw(st.lists(client_packets(level), max_size=4))]
    stream = _mutate(data, b"".join(encode(p, level) for p in packets))
    _feed_all(_server_decoder(data), _split(data, stream))


@SETTINGS
@given(levels, st.data())
def test_mutated_server_streams(level: int, data: st.DataObject) -> None:
    packets = data.draw(st.lists(server_packets(level), min_size=1, max_size=4))
    stream = _mutate(data, b"".join(encode(p, level) for p in packets))
    _feed_all(MqttDecoder(server=False, protocol_level=level), _split(data, stream))


@SETTINGS
@given(levels, st.data())
def test_mutated_qos1_runs_as_the_broker_reads_them(level: int, data: st.DataObject) -> None:
    """Runs of PUBACKs and QoS 1 PUBLISH packets (what the broker's listener decodes a run at
    a time), mutated: packets or MqttCodecError, nothing else."""
    ids = st.integers(0, 65535)
    packets = [
        data.draw(connects(level)),
        *(Puback(i) for i in data.draw(st.lists(ids, min_size=1, max_size=40))),
        *(
            Publish("t/1", b"p" * i, 1, packet_id=i + 1)
            for i in range(data.draw(st.integers(0, 5)))
        ),
        *(Puback(i) for i in data.draw(st.lists(ids, max_size=40))),
    ]
    stream = _mutate(data, b"".join(encode(p, level) for p in packets))  # id 0 refused too
    _feed_all(MqttDecoder(plain_tuples=True, plain_qos1=True), _split(data, stream))
