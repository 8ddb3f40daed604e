"""Work queues: competing consumers, redelivery after a consumer dies, max retries into the
dead-letter topic, TTL, the size limit and publisher confirms."""

from __future__ import annotations

import socket
import struct
import threading
import time

import pika
import pytest

from tests.integration.amqp.conftest import TIMEOUT, connect, drain, nothing_more

pytestmark = pytest.mark.timeout(60)


def test_three_competing_consumers(broker, amqp, uid) -> None:
    q = f"compete-{uid}"
    ch = amqp().channel()
    ch.queue_declare(q, durable=True)
    n = 300
    seen: dict[int, list[bytes]] = {0: [], 1: [], 2: []}
    lock = threading.Lock()
    total = [0]
    stop = threading.Event()
    started = threading.Barrier(4)

    def consume(i: int) -> None:
        conn = connect(broker.ports["amqp"])
        c = conn.channel()
        c.basic_qos(prefetch_count=10)
        started.wait()
        try:
            for method, _, body in c.consume(q, inactivity_timeout=0.1):
                if stop.is_set():
                    break
                if method is None:
                    continue
                with lock:
                    seen[i].append(body)
                    total[0] += 1
                    if total[0] >= n:
                        stop.set()
                time.sleep(0.001)  # a little work, so that all three get some
                c.basic_ack(method.delivery_tag)
            c.cancel()
        finally:
            conn.close()

    threads = [threading.Thread(target=consume, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    started.wait()
    ch.confirm_delivery()
    for i in range(n):
        ch.basic_publish("", q, b"%d" % i)
    assert stop.wait(TIMEOUT * 3)
    for t in threads:
        t.join(TIMEOUT)
    everything = [b for bodies in seen.values() for b in bodies]
    assert sorted(everything) == sorted(b"%d" % i for i in range(n))  # each once, none lost
    assert all(seen[i] for i in range(3)), {i: len(v) for i, v in seen.items()}


def test_killed_consumer_messages_are_redelivered(broker, amqp, uid) -> None:
    q = f"killed-{uid}"
    ch = amqp().channel()
    ch.queue_declare(q, durable=True)
    ch.confirm_delivery()
    for i in range(5):
        ch.basic_publish("", q, b"k%d" % i)
    victim = connect(broker.ports["amqp"])
    vch = victim.channel()
    vch.basic_qos(prefetch_count=3)
    held = drain(vch, q, 3, ack=False)
    assert len(held) == 3
    # Crash: reset the socket without closing the channel or the connection.
    sock = victim._impl._transport._sock  # noqa: SLF001
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()
    got = drain(amqp().channel(), q, 5)
    by_body = {body: m.redelivered for m, _, body in got}
    assert sorted(by_body) == [b"k%d" % i for i in range(5)]
    for _, _, body in held:
        assert by_body[body] is True
    assert sum(by_body.values()) == 3


def test_max_retries_then_dead_letter_topic(amqp, uid) -> None:
    ch = amqp().channel()
    dlq = f"dlq-{uid}"
    ch.queue_declare(dlq, durable=True)
    q = f"retry-{uid}"
    ch.queue_declare(
        q,
        durable=True,
        arguments={
            "x-delivery-limit": 2,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": dlq,
        },
    )
    ch.confirm_delivery()
    ch.basic_publish("", q, b"poison", pika.BasicProperties(headers={"origin": "test"}))
    flags = []
    for _ in range(3):
        ((method, _, body),) = drain(ch, q, 1, ack=False)
        flags.append(method.redelivered)
        ch.basic_reject(method.delivery_tag, requeue=True)
    assert flags == [False, True, True]
    ((_, props, body),) = drain(ch, dlq, 1)
    assert body == b"poison"
    assert props.headers["origin"] == "test"
    assert props.headers["x-death-queue"] == q
    nothing_more(ch, q)


def test_reject_without_requeue_dead_letters_at_once(amqp, uid) -> None:
    ch = amqp().channel()
    dlq = f"dlq2-{uid}"
    ch.queue_declare(dlq, durable=True)
    q = f"rej-{uid}"
    ch.queue_declare(q, durable=True, arguments={"x-dead-letter-topic": dlq})
    ch.confirm_delivery()
    ch.basic_publish("", q, b"bad")
    ((method, _, _),) = drain(ch, q, 1, ack=False)
    ch.basic_reject(method.delivery_tag, requeue=False)
    ((_, props, body),) = drain(ch, dlq, 1)
    assert body == b"bad" and props.headers["x-death-reason"] == "rejected"


def test_ttl_expiry(amqp, uid) -> None:
    ch = amqp().channel()
    q = f"ttl-{uid}"
    ch.queue_declare(q, durable=True, arguments={"x-message-ttl": 1000})
    ch.confirm_delivery()
    ch.basic_publish("", q, b"queue-ttl")
    ch.basic_publish("", q, b"short", pika.BasicProperties(expiration="100"))
    time.sleep(1.3)
    ch.basic_publish("", q, b"fresh")
    got = drain(ch, q, 1)
    assert [body for _, _, body in got] == [b"fresh"]
    nothing_more(ch, q, 0.3)


def test_size_limit_nacks_confirmed_publishes(amqp, uid) -> None:
    ch = amqp().channel()
    q = f"full-{uid}"
    ch.queue_declare(q, durable=True, arguments={"x-max-length-bytes": 1})  # 1 MiB
    ch.confirm_delivery()
    body = b"x" * 200_000
    accepted = 0
    with pytest.raises(pika.exceptions.NackError):
        for _ in range(10):
            ch.basic_publish("", q, body)
            accepted += 1
    assert 3 <= accepted <= 5
    assert ch.queue_declare(q, passive=True).method.message_count == accepted
    drain(ch, q, 1)  # room again
    ch.basic_publish("", q, body)


def test_size_limit_without_confirms_closes_the_channel(amqp, uid) -> None:
    conn = amqp()
    ch = conn.channel()
    q = f"full2-{uid}"
    ch.queue_declare(q, durable=True, arguments={"x-max-length-bytes": 1})
    reasons = []
    ch._impl.add_on_close_callback(lambda _ch, reason: reasons.append(reason))  # noqa: SLF001
    for _ in range(20):
        if ch.is_closed:
            break
        ch.basic_publish("", q, b"x" * 200_000)
        conn.process_data_events(0.05)
    deadline = time.monotonic() + TIMEOUT
    while not reasons and time.monotonic() < deadline:
        conn.process_data_events(0.1)
    assert reasons[0].reply_code == 406
    assert "full" in reasons[0].reply_text
