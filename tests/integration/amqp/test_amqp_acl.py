"""AMQP authorization with pika against a broker process with ``--acl-default deny``, rules
made through the admin API: vhost access, exchange and queue declare/delete, bind, publish
and consume are refused with 403 ACCESS_REFUSED (Connection.Close for the vhost, Channel.Close
for the rest, as RabbitMQ), and what a rule allows works; an explicit deny wins."""

from __future__ import annotations

from collections.abc import Iterator

import pika
import pika.exceptions
import pytest

from tests.fixtures.acl import add_rule, deny_by_default_broker
from tests.fixtures.broker_process import BrokerProcess
from tests.fixtures.cluster import http
from tests.integration.amqp.conftest import connect, drain
from tests.integration.amqp.test_amqp_errors import channel_error

pytestmark = pytest.mark.timeout(90)
ACCESS_REFUSED = 403


@pytest.fixture(scope="module")
def broker(tmp_path_factory) -> Iterator[BrokerProcess]:
    data = tmp_path_factory.mktemp("amqp-acl") / "data"
    proc = deny_by_default_broker(data, "amqp,admin", ("alice", "bob"))
    add_rule(proc, "alice", "queue:jobs.*", "create")
    add_rule(proc, "alice", "queue:jobs.*", "consume")
    add_rule(proc, "alice", "jobs/#", "publish")
    add_rule(proc, "alice", "jobs/secret", "publish", "deny")
    add_rule(proc, "alice", "news/#", "subscribe")
    # A queue alice may not read, made by the operator.
    http("POST", f"{proc.http}/api/v1/queues", {"name": "closed.q"}, proc.token)
    yield proc
    proc.stop()


def login(broker: BrokerProcess, user: str, password: str = "pw") -> pika.BlockingConnection:
    return connect(broker.ports["amqp"], credentials=pika.PlainCredentials(user, password))


@pytest.fixture
def alice(broker) -> Iterator[pika.BlockingConnection]:
    conn = login(broker, "alice")
    yield conn
    if conn.is_open:
        conn.close()


@pytest.mark.parametrize(("user", "password"), [("bob", "pw"), ("guest", "guest")])
def test_vhost_access_needs_a_rule(broker, user, password):
    """bob has no rule; guest/guest is anonymous (the ``*`` principal), which has none."""
    params = pika.ConnectionParameters(
        "127.0.0.1", broker.ports["amqp"], credentials=pika.PlainCredentials(user, password)
    )
    # Connection.Close during Connection.Open: pika reports it as a probable access denial.
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as refused:
        pika.BlockingConnection(params)
    assert '(403) "ACCESS_REFUSED - access to vhost' in str(refused.value)


def test_declare_and_delete(alice):
    ch = alice.channel()
    ch.queue_declare("jobs.a", durable=True)  # create queue:jobs.* allows it
    err = channel_error(alice, lambda c: c.queue_declare("other.q", durable=True))
    assert err.reply_code == ACCESS_REFUSED
    err = channel_error(alice, lambda c: c.queue_declare("", exclusive=True))  # amq.gen-…
    assert err.reply_code == ACCESS_REFUSED
    err = channel_error(alice, lambda c: c.exchange_declare("alice-x", "topic"))
    assert err.reply_code == ACCESS_REFUSED
    ch.queue_declare("closed.q", durable=True)  # exists: redeclaring creates nothing
    err = channel_error(alice, lambda c: c.queue_delete("jobs.a"))
    assert err.reply_code == ACCESS_REFUSED
    err = channel_error(alice, lambda c: c.queue_purge("closed.q"))
    assert err.reply_code == ACCESS_REFUSED


def test_bind_needs_subscribe_on_the_whole_filter(alice):
    ch = alice.channel()
    ch.queue_declare("jobs.bound", durable=True)
    ch.queue_bind("jobs.bound", "amq.topic", "news.#")
    err = channel_error(alice, lambda c: c.queue_bind("jobs.bound", "amq.topic", "secret.#"))
    assert err.reply_code == ACCESS_REFUSED
    err = channel_error(alice, lambda c: c.queue_bind("jobs.bound", "amq.topic", "#"))
    assert err.reply_code == ACCESS_REFUSED  # would include topics beyond news/#


def test_publish_and_consume(alice):
    ch = alice.channel()
    ch.confirm_delivery()
    ch.queue_declare("jobs.work", durable=True)
    ch.basic_publish("", "jobs.work", b"job-1")  # topic jobs/work: allowed, confirmed
    got = drain(ch, "jobs.work", 1)
    assert [body for _, _, body in got] == [b"job-1"]

    def publish(key: str):
        def action(c):
            c.confirm_delivery()
            c.basic_publish("", key, b"no")

        return action

    assert channel_error(alice, publish("other.work")).reply_code == ACCESS_REFUSED
    assert channel_error(alice, publish("jobs.secret")).reply_code == ACCESS_REFUSED  # deny wins
    err = channel_error(alice, lambda c: c.basic_consume("closed.q", lambda *a: None))
    assert err.reply_code == ACCESS_REFUSED
    err = channel_error(alice, lambda c: c.basic_get("closed.q"))
    assert err.reply_code == ACCESS_REFUSED
