"""AMQP size and count limits (docs/operations.md#limits), on a broker started with small
ones: each is exceeded by one client, which gets RabbitMQ's refusal, while another client
keeps being served; each refusal is counted in limits_rejections_count."""

from __future__ import annotations

import struct
import urllib.request
from collections.abc import Iterator

import pika
import pytest
from pamqp import commands

from tests.fixtures.broker_process import BrokerProcess
from tests.fixtures.brokers import broker_fixtures
from tests.integration.amqp.conftest import RawAmqp, connect, drain

pytestmark = pytest.mark.timeout(60)

FRAME_MAX = 8192
CHANNEL_MAX = 16
MAX_MESSAGE = 64 * 1024
MAX_UNACKED = 5


small_broker, _ = broker_fixtures(
    "amqp-limits",
    "--amqp-frame-max", str(FRAME_MAX),
    "--amqp-channel-max", str(CHANNEL_MAX),
    "--amqp-max-message-bytes", str(MAX_MESSAGE),
    "--amqp-max-unacked", str(MAX_UNACKED),
)  # fmt: skip


@pytest.fixture
def clients(small_broker) -> Iterator[tuple]:
    """(a pika connection factory, a raw client factory) on the small broker."""
    made: list = []

    def amqp() -> pika.BlockingConnection:
        made.append(connect(small_broker.ports["amqp"]))
        return made[-1]

    def raw() -> RawAmqp:
        made.append(RawAmqp(small_broker.ports["amqp"]))
        return made[-1]

    yield amqp, raw
    for c in made:
        try:
            c.close()
        except Exception:
            pass


def _rejections(broker: BrokerProcess, limit: str) -> float:
    with urllib.request.urlopen(broker.http + "/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(f'limits_rejections_count{{limit="{limit}"}} '):
                return float(line.split()[-1])
    return 0.0


def _works(conn: pika.BlockingConnection, queue: str, body: bytes) -> bool:
    ch = conn.channel()
    ch.queue_declare(queue)
    ch.confirm_delivery()
    ch.basic_publish("", queue, body)
    got = drain(ch, queue, 1)
    ch.close()
    return [b for _, _, b in got] == [body]


def _open_channel(client: RawAmqp, number: int) -> None:
    client.send((commands.Channel.Open(), number))
    client.expect(commands.Channel.OpenOk)


def _body_frame(channel: int, body: bytes) -> bytes:
    return struct.pack(">BHI", 3, channel, len(body)) + body + b"\xce"


def test_frame_max_is_offered_and_enforced(small_broker, clients, uid):
    amqp, raw = clients
    bystander = amqp()
    assert bystander._impl.params.frame_max == FRAME_MAX  # negotiated down by pika
    client = raw()
    client.send_raw(b"AMQP\x00\x00\x09\x01")
    client.expect(commands.Connection.Start)
    client.send((commands.Connection.StartOk(response="\0guest\0guest", mechanism="PLAIN"), 0))
    tune = client.expect(commands.Connection.Tune)
    assert (tune.frame_max, tune.channel_max) == (FRAME_MAX, CHANNEL_MAX)
    client.send((commands.Connection.TuneOk(CHANNEL_MAX, 4096, 0), 0))  # the client's lower
    client.send((commands.Connection.Open(virtual_host="/"), 0))
    client.expect(commands.Connection.OpenOk)
    _open_channel(client, 1)
    before = _rejections(small_broker, "amqp_frame_max")
    client.send((commands.Basic.Publish(exchange="", routing_key=f"q-{uid}"), 1))
    client.send_raw(_body_frame(1, b"x" * 4096))  # 4,104 bytes framed: past the 4,096 agreed
    assert client.closed_with().reply_code == 501
    assert _rejections(small_broker, "amqp_frame_max") == before + 1
    assert _works(bystander, f"by-{uid}", b"y" * (3 * FRAME_MAX))  # split into frames


def test_a_channel_above_channel_max_is_refused(small_broker, clients):
    amqp, raw = clients
    bystander = amqp()
    client = raw()
    client.handshake()
    _open_channel(client, CHANNEL_MAX)
    before = _rejections(small_broker, "amqp_channel_max")
    client.send((commands.Channel.Open(), CHANNEL_MAX + 1))
    assert client.closed_with().reply_code == 504
    assert _rejections(small_broker, "amqp_channel_max") == before + 1
    assert bystander.channel().is_open


def test_a_message_past_max_message_bytes_closes_the_channel_406(small_broker, clients, uid):
    amqp, _ = clients
    conn, bystander = amqp(), amqp()
    before = _rejections(small_broker, "amqp_message_bytes")
    assert _works(conn, f"q-{uid}", b"m" * MAX_MESSAGE)  # at the limit
    ch = conn.channel()
    ch.confirm_delivery()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.basic_publish("", f"q-{uid}", b"m" * (MAX_MESSAGE + 1))
    assert info.value.reply_code == 406
    assert "larger than configured max size" in info.value.reply_text
    assert conn.is_open
    assert _rejections(small_broker, "amqp_message_bytes") == before + 1
    assert _works(bystander, f"by-{uid}", b"still")


def test_unfinished_bodies_of_a_connection_are_bounded(small_broker, clients, uid):
    """Four bodies at the limit may be in progress at once; the fifth channel's passes it."""
    amqp, raw = clients
    bystander = amqp()
    client = raw()
    client.handshake()
    chunk = b"p" * (FRAME_MAX - 8)
    before = _rejections(small_broker, "amqp_partial_bytes")
    for channel in range(1, 6):
        _open_channel(client, channel)
        client.send((commands.Basic.Publish(exchange="", routing_key=f"q-{uid}"), channel))
        client.send_raw(
            struct.pack(">BHIHHQH", 2, channel, 14, 60, 0, MAX_MESSAGE, 0) + b"\xce"
            + b"".join(_body_frame(channel, chunk) for _ in range(7))  # 57,288 of 65,536
        )  # fmt: skip
    close = client.expect(commands.Channel.Close)
    assert close.reply_code == 406 and "unfinished message bodies" in close.reply_text
    assert _rejections(small_broker, "amqp_partial_bytes") == before + 1
    assert _works(bystander, f"by-{uid}", b"still")


def test_a_consumer_without_prefetch_stops_at_max_unacked(small_broker, clients, uid):
    amqp, _ = clients
    conn = amqp()
    ch = conn.channel()
    queue = f"q-{uid}"
    ch.queue_declare(queue)
    ch.confirm_delivery()
    for i in range(4 * MAX_UNACKED + 2):
        ch.basic_publish("", queue, b"%d" % i)
    consumer = conn.channel()  # no Basic.Qos
    got = drain(consumer, queue, 3 * MAX_UNACKED, ack=False, timeout=1.5)
    assert len(got) == MAX_UNACKED
    consumer.basic_ack(got[-1][0].delivery_tag, multiple=True)
    more = drain(consumer, queue, MAX_UNACKED, ack=True, timeout=1.5)
    assert len(more) == MAX_UNACKED
    # Basic.Get too: past the bound the channel gets Get-Empty until it acks.
    getter = conn.channel()
    gets = [getter.basic_get(queue) for _ in range(MAX_UNACKED + 1)]
    assert [g[0] is not None for g in gets] == [True] * MAX_UNACKED + [False]
    getter.basic_ack(gets[-2][0].delivery_tag, multiple=True)
    assert getter.basic_get(queue)[0] is not None
