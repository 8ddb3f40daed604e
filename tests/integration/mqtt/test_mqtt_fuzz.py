"""Fuzzing a live MQTT listener with Hypothesis: random bytes and mutated valid packet streams,
each on a fresh connection. Afterwards the broker must still be up, serve a paho client, have
logged no exception, and count no connection that is gone."""

from __future__ import annotations

import socket

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowmq_wire.mqtt.codec import encode
from flowmq_wire.mqtt.packets import (
    Connect,
    Disconnect,
    Pingreq,
    Puback,
    Publish,
    Pubrel,
    Subscribe,
    SubscriptionOptions,
    Unsubscribe,
    Will,
)

from .conftest import HOST, roundtrip, scrape, wait_until

EXAMPLES = 200


def _stream(level: int, client_id: str) -> bytes:
    v5 = level == 5
    packets = [
        Connect(
            client_id,
            clean_start=client_id.endswith("c"),
            keep_alive=30,
            will=Will("fz/will", b"w", 1, False, {"will_delay_interval": 0} if v5 else {}),
            properties={"session_expiry_interval": 5, "receive_maximum": 4} if v5 else {},
            protocol_level=level,
        ),
        Subscribe(
            1,
            [("fz/#", SubscriptionOptions(2)), ("$share/g/fz/+", SubscriptionOptions(1))],
            {"subscription_identifier": 3} if v5 else {},
        ),
        Publish(
            "fz/a",
            b"payload",
            1,
            True,
            packet_id=2,
            properties={"topic_alias": 1, "user_property": [("k", "v")]} if v5 else {},
        ),
        Publish("fz/b", b"p2", 2, packet_id=3),
        Pubrel(3),
        Puback(1),
        Pingreq(),
        Unsubscribe(4, ["fz/#"]),
        Disconnect(0x04 if v5 else 0),
    ]
    return b"".join(encode(p, level) for p in packets)


BASES = [_stream(5, "fuzz5"), _stream(4, "fuzz4"), _stream(5, "fuzz5c"), _stream(4, "fuzz4c")]


@st.composite
def mutated(draw) -> bytes:
    data = bytearray(draw(st.sampled_from(BASES)))
    for _ in range(draw(st.integers(1, 6))):
        op = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate"]))
        i = draw(st.integers(0, len(data) - 1)) if data else 0
        if op == "flip" and data:
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "set" and data:
            data[i] = draw(st.sampled_from([0x00, 0x7F, 0x80, 0xFF, draw(st.integers(0, 255))]))
        elif op == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete" and data:
            del data[i : i + draw(st.integers(1, 8))]
        elif op == "truncate":
            del data[i:]
    return bytes(data)


def _chunked(data: st.SearchStrategy[bytes]) -> st.SearchStrategy[list[bytes]]:
    """Split the bytes at random points: the decoder must cope with any segmentation."""

    @st.composite
    def split(draw) -> list[bytes]:
        blob = draw(data)
        cuts = sorted(draw(st.lists(st.integers(0, len(blob)), max_size=4)))
        parts, last = [], 0
        for cut in cuts:
            parts.append(blob[last:cut])
            last = cut
        parts.append(blob[last:])
        return [p for p in parts if p]

    return split()


def _feed(port: int, chunks: list[bytes]) -> None:
    with socket.create_connection((HOST, port), timeout=2) as s:
        try:
            for chunk in chunks:
                s.sendall(chunk)
            s.shutdown(socket.SHUT_WR)
            while s.recv(65536):  # until the broker closes; bounded by the socket timeout
                pass
        except OSError:  # the broker closed first (reset, broken pipe, not connected, timeout)
            pass


def _connections(broker) -> float:
    return scrape(broker.http).get('mqtt_connections{namespace="default"}', 0.0)


def _run(broker, strategy) -> None:
    port = broker.ports["mqtt"]
    before = _connections(broker)

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(strategy)
    def feed(chunks: list[bytes]) -> None:
        _feed(port, chunks)

    feed()
    assert broker.proc.poll() is None, "the broker died:\n" + "".join(broker.output[-50:])
    roundtrip(port)
    # Every fuzz connection is closed: the connection gauge is back where it was.
    wait_until(lambda: _connections(broker) == before, timeout=5)


def test_fuzz_random_bytes(broker):
    random_stream = st.one_of(
        st.binary(max_size=600),
        # Random bytes after a valid CONNECT reach the post-CONNECT decoder paths.
        st.tuples(st.sampled_from(BASES), st.binary(max_size=300)).map(
            lambda t: t[0][: t[0].index(b"\x82") if b"\x82" in t[0] else 20] + t[1]
        ),
    )
    _run(broker, _chunked(random_stream))


def test_fuzz_mutated_packets(broker):
    _run(broker, _chunked(mutated()))
