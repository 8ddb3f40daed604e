"""Everyday AMQP with real clients: declare, publish with confirms, consume, get, recover,
mandatory returns, properties end to end, pub/sub through exclusive queues; pika's
BlockingConnection and SelectConnection, and aio-pika."""

from __future__ import annotations

import asyncio
import threading
import time

import aio_pika
import pika
import pytest

from tests.integration.amqp.conftest import HOST, TIMEOUT, drain, nothing_more

pytestmark = pytest.mark.timeout(60)


def test_work_queue_round_trip_with_confirms(amqp, uid) -> None:
    ch = amqp().channel()
    ok = ch.queue_declare(f"work-{uid}", durable=True)
    assert ok.method.queue == f"work-{uid}" and ok.method.message_count == 0
    ch.confirm_delivery()
    for i in range(50):
        ch.basic_publish("", f"work-{uid}", b"m%d" % i, pika.BasicProperties(delivery_mode=2))
    assert ch.queue_declare(f"work-{uid}", passive=True).method.message_count == 50
    got = drain(ch, f"work-{uid}", 50)
    assert [body for _, _, body in got] == [b"m%d" % i for i in range(50)]
    assert not any(m.redelivered for m, _, _ in got)
    assert got[0][0].exchange == "" and got[0][0].routing_key == f"work-{uid}"
    nothing_more(ch, f"work-{uid}")


def test_properties_kept_end_to_end(amqp, uid) -> None:
    ch = amqp().channel()
    ch.queue_declare(f"props-{uid}", durable=True)
    props = pika.BasicProperties(
        content_type="application/json",
        content_encoding="utf-8",
        headers={"str": "v", "int": 7, "bool": True, "nested": {"a": [1, "x"]}},
        delivery_mode=2,
        priority=3,
        correlation_id="corr-1",
        reply_to="replies",
        expiration="60000",
        message_id="mid-1",
        timestamp=1_700_000_000,
        type="event",
        user_id="guest",
        app_id="tests",
    )
    ch.confirm_delivery()
    ch.basic_publish("", f"props-{uid}", b"{}", props)
    ((_, got, body),) = drain(ch, f"props-{uid}", 1)
    assert body == b"{}"
    for name in (
        "content_type",
        "content_encoding",
        "headers",
        "delivery_mode",
        "priority",
        "correlation_id",
        "reply_to",
        "expiration",
        "message_id",
        "timestamp",
        "type",
        "user_id",
        "app_id",
    ):
        assert getattr(got, name) == getattr(props, name), name


def test_basic_get_qos_recover_and_cancel(amqp, uid) -> None:
    ch = amqp().channel()
    q = f"get-{uid}"
    ch.queue_declare(q, durable=True)
    assert ch.basic_get(q) == (None, None, None)
    ch.confirm_delivery()
    for i in range(3):
        ch.basic_publish("", q, b"%d" % i)
    method, _, body = ch.basic_get(q)
    assert body == b"0" and method.message_count == 2 and not method.redelivered
    ch.basic_recover(requeue=True)  # the unacked "0" goes back
    ch.basic_qos(prefetch_count=1)
    got = []

    def on_message(channel, method, props, body):
        got.append((method.redelivered, body))
        channel.basic_ack(method.delivery_tag)

    tag = ch.basic_consume(q, on_message)
    deadline = time.monotonic() + TIMEOUT
    while len(got) < 3 and time.monotonic() < deadline:
        ch.connection.process_data_events(0.1)
    ch.basic_cancel(tag)
    assert sorted(got) == [(False, b"1"), (False, b"2"), (True, b"0")]


def test_nack_multiple_requeues(amqp, uid) -> None:
    ch = amqp().channel()
    q = f"nack-{uid}"
    ch.queue_declare(q, durable=True)
    ch.confirm_delivery()
    for i in range(4):
        ch.basic_publish("", q, b"%d" % i)
    first = drain(ch, q, 4, ack=False)
    ch.basic_nack(first[-1][0].delivery_tag, multiple=True, requeue=True)
    again = drain(ch, q, 4)
    assert sorted(body for _, _, body in again) == [b"0", b"1", b"2", b"3"]
    assert all(m.redelivered for m, _, _ in again)


def test_mandatory_unroutable_is_returned(amqp, uid) -> None:
    ch = amqp().channel()
    ch.confirm_delivery()
    with pytest.raises(pika.exceptions.UnroutableError):
        ch.basic_publish("amq.topic", f"nobody.{uid}", b"x", mandatory=True)
    ch.basic_publish("amq.topic", f"nobody.{uid}", b"x")  # not mandatory: dropped quietly


def test_exclusive_queues_pub_sub(amqp, uid) -> None:
    publisher = amqp().channel()
    publisher.exchange_declare(f"news-{uid}", "topic", durable=True)
    publisher.exchange_declare(f"all-{uid}", "fanout")
    subs = []
    for _ in range(2):
        ch = amqp().channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        assert q.startswith("amq.gen-")
        ch.queue_bind(q, f"news-{uid}", "sport.*")
        ch.queue_bind(q, f"all-{uid}")
        subs.append((ch, q))
    publisher.basic_publish(f"news-{uid}", "sport.football", b"goal")
    publisher.basic_publish(f"news-{uid}", "weather.today", b"rain")  # not bound
    publisher.basic_publish(f"all-{uid}", "ignored", b"everyone")
    for ch, q in subs:
        got = drain(ch, q, 2)
        assert sorted(body for _, _, body in got) == [b"everyone", b"goal"]
        assert {m.exchange for m, _, _ in got} == {f"news-{uid}", f"all-{uid}"}


def test_exclusive_queue_goes_with_its_connection(amqp, uid) -> None:
    conn = amqp()
    q = conn.channel().queue_declare(f"excl-{uid}", exclusive=True).method.queue
    conn.close()
    ch = amqp().channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_declare(q, passive=True)
    assert info.value.reply_code == 404


def test_select_connection(broker, uid) -> None:
    """pika's asynchronous client: declare, confirm, publish, consume, ack."""
    q = f"select-{uid}"
    got: list[bytes] = []
    confirmed: list[int] = []
    done = threading.Event()
    state: dict = {}

    def on_open(conn):
        conn.channel(on_open_callback=on_channel)

    def on_channel(ch):
        state["ch"] = ch
        ch.queue_declare(q, durable=True, callback=on_declared)

    def on_declared(_frame):
        ch = state["ch"]
        ch.confirm_delivery(lambda f: confirmed.append(f.method.delivery_tag), callback=on_confirm)

    def on_confirm(_frame):
        ch = state["ch"]
        for i in range(20):
            ch.basic_publish("", q, b"s%d" % i)
        ch.basic_qos(prefetch_count=5, callback=lambda _f: ch.basic_consume(q, on_message))

    def on_message(ch, method, props, body):
        got.append(body)
        ch.basic_ack(method.delivery_tag)
        if len(got) == 20:
            done.set()
            ch.connection.close()

    conn = pika.SelectConnection(
        pika.ConnectionParameters(HOST, broker.ports["amqp"]), on_open_callback=on_open
    )
    timer = threading.Timer(TIMEOUT, lambda: conn.ioloop.add_callback_threadsafe(conn.ioloop.stop))
    timer.start()
    try:
        conn.ioloop.start()
    finally:
        timer.cancel()
    assert done.is_set()
    assert got == [b"s%d" % i for i in range(20)]
    assert confirmed and max(confirmed) == 20


def test_aio_pika(broker, uid) -> None:
    async def main() -> list[bytes]:
        conn = await aio_pika.connect(f"amqp://guest:guest@{HOST}:{broker.ports['amqp']}/")
        async with conn:
            ch = await conn.channel(publisher_confirms=True)
            await ch.set_qos(prefetch_count=10)
            queue = await ch.declare_queue(f"aio-{uid}", durable=True)
            exchange = await ch.declare_exchange(f"aiox-{uid}", aio_pika.ExchangeType.DIRECT)
            await queue.bind(exchange, routing_key="k")
            for i in range(10):
                await exchange.publish(
                    aio_pika.Message(b"a%d" % i, headers={"n": i}, content_type="text/plain"),
                    routing_key="k",
                )
            got = []
            async with queue.iterator() as it:
                async for message in it:
                    async with message.process():
                        assert message.headers["n"] == int(message.body[1:])
                        got.append(message.body)
                    if len(got) == 10:
                        break
            return got

    assert asyncio.run(asyncio.wait_for(main(), TIMEOUT)) == [b"a%d" % i for i in range(10)]


def test_queue_purge_and_delete(amqp, uid) -> None:
    ch = amqp().channel()
    q = f"purge-{uid}"
    ch.queue_declare(q, durable=True)
    ch.confirm_delivery()
    for _ in range(5):
        ch.basic_publish("", q, b"x")
    assert ch.queue_purge(q).method.message_count == 5
    ch.basic_publish("", q, b"y")
    assert ch.queue_delete(q).method.message_count == 1
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_declare(q, passive=True)
    assert info.value.reply_code == 404


def test_bindings_of_durable_queues_are_stored(amqp, uid, broker) -> None:
    ch = amqp().channel()
    q = f"bound-{uid}"
    ch.queue_declare(q, durable=True)
    ch.queue_bind(q, "amq.topic", f"orders.{uid}.*")
    ch.confirm_delivery()
    ch.basic_publish("amq.topic", f"orders.{uid}.new", b"o1")
    ch.queue_unbind(q, "amq.topic", f"orders.{uid}.*")
    ch.basic_publish("amq.topic", f"orders.{uid}.new", b"o2")
    got = drain(ch, q, 2, timeout=1.5)
    assert [body for _, _, body in got] == [b"o1"]
    assert got[0][0].routing_key == f"orders.{uid}.new"


def test_heartbeats_keep_an_idle_connection(broker) -> None:
    conn = connect_heartbeat(broker.ports["amqp"], 1)
    try:
        conn.sleep(3.0)  # pika answers the broker's heartbeats while sleeping
        assert conn.is_open
        conn.channel().queue_declare("", exclusive=True)
    finally:
        conn.close()


def connect_heartbeat(port: int, heartbeat: int) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(HOST, port, heartbeat=heartbeat))


def test_channel_flow_pauses_deliveries(raw, amqp, uid) -> None:
    from pamqp import commands

    q = f"flow-{uid}"
    ch = amqp().channel()
    ch.queue_declare(q, durable=True)
    client = raw()
    client.handshake()
    client.send((commands.Channel.Open(), 1))
    client.expect(commands.Channel.OpenOk)
    client.send((commands.Channel.Flow(active=False), 1))
    assert client.expect(commands.Channel.FlowOk).active is False
    client.send((commands.Basic.Consume(queue=q, consumer_tag="f", no_ack=True), 1))
    client.expect(commands.Basic.ConsumeOk)
    ch.confirm_delivery()
    ch.basic_publish("", q, b"held")
    with pytest.raises(TimeoutError):
        client.recv(timeout=0.5)
    client.send((commands.Channel.Flow(active=True), 1))
    assert client.expect(commands.Channel.FlowOk).active is True
    _, deliver = client.recv()
    assert isinstance(deliver, commands.Basic.Deliver) and deliver.consumer_tag == "f"


def test_a_get_after_a_publish_on_the_same_channel_sees_it(raw, uid) -> None:
    """RabbitMQ orders a channel's methods toward a queue: a Basic.Get sent right behind a
    Basic.Publish (here in the same TCP write, without confirms) gets that message, though
    storing it in a durable queue takes a flush."""
    from pamqp import body, commands, header

    q = f"order-{uid}"
    client = raw()
    client.handshake()
    client.send((commands.Channel.Open(), 1))
    client.expect(commands.Channel.OpenOk)
    client.send((commands.Queue.Declare(queue=q, durable=True), 1))
    client.expect(commands.Queue.DeclareOk)
    payload = b"published first"
    client.send(
        (commands.Basic.Publish(exchange="", routing_key=q), 1),
        (header.ContentHeader(0, len(payload), commands.Basic.Properties(delivery_mode=2)), 1),
        (body.ContentBody(payload), 1),
        (commands.Basic.Get(queue=q, no_ack=True), 1),
    )
    _, answer = client.recv()
    assert isinstance(answer, commands.Basic.GetOk), answer
    client.recv()  # the content header
    assert client.recv()[1].value == payload
