"""Every reply code the spec defines for what we refuse, provoked at least once: soft errors
close the channel, hard errors the connection, and other connections are unaffected."""

from __future__ import annotations

import struct

import pika
import pytest
from pamqp import body as pbody
from pamqp import commands, frame, header

from tests.fixtures.broker_process import start_broker
from tests.fixtures.cli import flowmq_user
from tests.integration.amqp.conftest import connect, drain

pytestmark = pytest.mark.timeout(60)


def channel_error(conn: pika.BlockingConnection, action) -> pika.exceptions.ChannelClosedByBroker:
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        action(ch)
    assert conn.is_open  # a soft error closes only the channel
    return info.value


def connection_error(
    conn: pika.BlockingConnection, action
) -> pika.exceptions.ConnectionClosedByBroker:
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        action(ch)
    return info.value


def test_404_not_found(amqp, uid) -> None:
    conn = amqp()
    err = channel_error(conn, lambda ch: ch.queue_declare(f"missing-{uid}", passive=True))
    assert err.reply_code == 404 and f"missing-{uid}" in err.reply_text
    err = channel_error(conn, lambda ch: ch.exchange_declare(f"nox-{uid}", passive=True))
    assert err.reply_code == 404

    def publish_to_missing_exchange(ch):
        ch.confirm_delivery()
        ch.basic_publish(f"nox-{uid}", "k", b"x")

    assert channel_error(conn, publish_to_missing_exchange).reply_code == 404
    err = channel_error(conn, lambda ch: ch.basic_consume(f"missing-{uid}", lambda *a: None))
    assert err.reply_code == 404


def test_406_precondition_failed(amqp, uid) -> None:
    conn = amqp()
    ch = conn.channel()
    ch.exchange_declare(f"x-{uid}", "topic")
    err = channel_error(conn, lambda c: c.exchange_declare(f"x-{uid}", "fanout"))
    assert err.reply_code == 406 and "inequivalent" in err.reply_text
    ch.queue_declare(f"q-{uid}", durable=True, arguments={"x-message-ttl": 5000})
    err = channel_error(
        conn,
        lambda c: c.queue_declare(f"q-{uid}", durable=True, arguments={"x-message-ttl": 9000}),
    )
    assert err.reply_code == 406 and "x-message-ttl" in err.reply_text

    def ack_unknown(c):
        c.basic_ack(12345)
        c.queue_declare(f"q-{uid}", passive=True)

    err = channel_error(conn, ack_unknown)
    assert err.reply_code == 406 and "unknown delivery tag" in err.reply_text

    def delete_if_empty(c):
        c.confirm_delivery()
        c.basic_publish("", f"q-{uid}", b"x")
        c.queue_delete(f"q-{uid}", if_empty=True)

    assert channel_error(conn, delete_if_empty).reply_code == 406


def test_403_access_refused(amqp, uid) -> None:
    conn = amqp()
    err = channel_error(conn, lambda ch: ch.queue_declare(f"amq.{uid}", durable=True))
    assert err.reply_code == 403

    def bind_default(ch):
        ch.queue_declare(f"b-{uid}", durable=True)
        ch.queue_bind(f"b-{uid}", "", "k")

    assert channel_error(conn, bind_default).reply_code == 403
    assert channel_error(conn, lambda ch: ch.exchange_delete("amq.topic")).reply_code == 403


def test_403_login_refused(tmp_path) -> None:
    data_dir = tmp_path / "data"
    add = flowmq_user(data_dir, "add", "alice", "--password", "wonderland")
    assert add.returncode == 0, add.stderr
    proc = start_broker(data_dir, "--allow-anonymous", "false", "--acl-default", "allow")
    try:
        port = proc.ports["amqp"]
        good = connect(port, credentials=pika.PlainCredentials("alice", "wonderland"))
        good.close()
        for user, password in (("alice", "wrong"), ("guest", "guest")):
            with pytest.raises(pika.exceptions.ProbableAuthenticationError) as info:
                connect(port, credentials=pika.PlainCredentials(user, password))
            assert "(403) 'ACCESS_REFUSED" in str(info.value)
    finally:
        proc.stop()


def test_405_resource_locked(amqp, uid) -> None:
    owner = amqp().channel()
    owner.queue_declare(f"mine-{uid}", exclusive=True)
    other = amqp()
    err = channel_error(other, lambda ch: ch.queue_declare(f"mine-{uid}", exclusive=True))
    assert err.reply_code == 405
    err = channel_error(other, lambda ch: ch.basic_consume(f"mine-{uid}", lambda *a: None))
    assert err.reply_code == 405


def test_403_exclusive_consumer(amqp, uid) -> None:
    ch = amqp().channel()
    ch.queue_declare(f"ex-{uid}", durable=True)
    ch.basic_consume(f"ex-{uid}", lambda *a: None, exclusive=True)
    err = channel_error(amqp(), lambda c: c.basic_consume(f"ex-{uid}", lambda *a: None))
    assert err.reply_code == 403


def test_530_not_allowed(amqp, raw, uid) -> None:
    client = raw()
    answer = client.handshake(vhost=f"/nowhere-{uid}")
    assert isinstance(answer, commands.Connection.Close) and answer.reply_code == 530

    amqp().channel().queue_declare(f"t-{uid}", durable=True)
    client = raw()
    client.handshake()
    client.send((commands.Channel.Open(), 1))
    client.expect(commands.Channel.OpenOk)
    consume = commands.Basic.Consume(queue=f"t-{uid}", consumer_tag="same")
    client.send((consume, 1))
    client.expect(commands.Basic.ConsumeOk)
    client.send((consume, 1))  # pika refuses to send this, so a raw client does
    assert client.closed_with().reply_code == 530


def test_540_not_implemented(amqp) -> None:
    err = connection_error(amqp(), lambda ch: ch.basic_qos(prefetch_size=1024))
    assert err.reply_code == 540
    assert connection_error(amqp(), lambda ch: ch.tx_select()).reply_code == 540
    assert connection_error(amqp(), lambda ch: ch.basic_recover(requeue=False)).reply_code == 540


def test_540_for_an_unknown_method_behind_a_declare_in_the_same_write(amqp, raw, uid) -> None:
    """The unknown method waits behind the Declare (which needs the meta store): it is
    still refused with 540, not dropped with an exception inside the broker."""
    bystander = amqp().channel()
    client = raw()
    client.handshake()
    client.send((commands.Channel.Open(), 1))
    client.expect(commands.Channel.OpenOk)
    unknown = b"\x00\x63\x00\x01"
    declare = frame.marshal(commands.Queue.Declare(queue=f"q-{uid}"), 1)
    client.send_raw(declare + struct.pack(">BHI", 1, 1, len(unknown)) + unknown + b"\xce")
    client.expect(commands.Queue.DeclareOk)
    assert client.closed_with().reply_code == 540
    assert bystander.queue_declare(f"by-{uid}").method.queue == f"by-{uid}"


def test_504_channel_error(raw) -> None:
    client = raw()
    assert isinstance(client.handshake(), commands.Connection.OpenOk)
    client.send((commands.Channel.Open(), 1))
    client.expect(commands.Channel.OpenOk)
    client.send((commands.Channel.Open(), 1))
    assert client.closed_with().reply_code == 504
    other = raw()
    other.handshake()
    other.send((commands.Basic.Qos(prefetch_count=1), 7))  # never opened
    assert other.closed_with().reply_code == 504


def test_505_unexpected_frame(raw) -> None:
    client = raw()
    client.handshake()
    client.send((commands.Channel.Open(), 1))
    client.expect(commands.Channel.OpenOk)
    body = b"stray"
    client.send_raw(struct.pack(">BHI", 3, 1, len(body)) + body + b"\xce")
    assert client.closed_with().reply_code == 505


def test_501_frame_error_leaves_other_connections_alone(amqp, raw, uid) -> None:
    bystander = amqp().channel()
    bystander.queue_declare(f"by-{uid}", durable=True)
    client = raw()
    client.handshake()
    client.send_raw(struct.pack(">BHI", 1, 0, 4) + b"\x00\x0a\x00\x0a" + b"\x00")  # bad end
    assert client.closed_with().reply_code == 501
    bad_header = raw()
    bad_header.send_raw(b"AMQP\x01\x01\x00\x09")
    assert bad_header.sock.recv(8) == b"AMQP\x00\x00\x09\x01"
    bystander.confirm_delivery()
    bystander.basic_publish("", f"by-{uid}", b"still here")
    assert [b for _, _, b in drain(bystander, f"by-{uid}", 1)] == [b"still here"]


def test_502_syntax_error(raw) -> None:
    client = raw()
    client.handshake()
    client.send((commands.Channel.Open(), 1))
    client.expect(commands.Channel.OpenOk)
    truncated = b"\x00\x32\x00\x0a\x00\x00\x05ab"  # Queue.Declare cut inside the name
    client.send_raw(struct.pack(">BHI", 1, 1, len(truncated)) + truncated + b"\xce")
    assert client.closed_with().reply_code == 502


def test_a_refused_publish_among_publishes_read_together(amqp, raw, uid) -> None:
    """Publishes that arrive in one read are handled as a run: the one to a missing exchange
    still closes the channel with 404 naming Basic.Publish, the publish before it is stored
    and the one after it dropped, as when they come one at a time."""
    queue = f"run-{uid}"
    ch = amqp().channel()
    ch.queue_declare(queue, durable=True)
    client = raw()
    client.open_channel()

    def publish(exchange: str, data: bytes) -> bytes:
        return (
            frame.marshal(commands.Basic.Publish(exchange=exchange, routing_key=queue), 1)
            + frame.marshal(header.ContentHeader(0, len(data), commands.Basic.Properties()), 1)
            + frame.marshal(pbody.ContentBody(data), 1)
        )

    client.send_raw(publish("", b"first") + publish(f"nowhere-{uid}", b"no") + publish("", b"x"))
    close = client.expect(commands.Channel.Close)
    assert close.reply_code == 404 and (close.class_id, close.method_id) == (60, 40)
    assert [b for _, _, b in drain(ch, queue, 2, timeout=2)] == [b"first"]
