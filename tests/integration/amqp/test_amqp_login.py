"""Logins (Connection.StartOk, PLAIN and AMQPLAIN) against the users in the meta store,
checked off the event loop and rate limited per client address; a user opens only its own
namespace's virtual host.  Refusals are 403 ACCESS_REFUSED and 530 NOT_ALLOWED."""

from __future__ import annotations

from collections.abc import Iterator

import pika
import pytest
from pamqp import commands, encode

from tests.fixtures.addresses import loopback_address
from tests.fixtures.broker_process import BrokerProcess, start_broker
from tests.fixtures.cli import flowmq_user
from tests.fixtures.waiting import wait_until
from tests.integration.mqtt.conftest import http

from .conftest import Closed, RawAmqp, connect


def _user_add(data_dir, name: str, password: str, *more: str) -> None:
    done = flowmq_user(data_dir, "add", name, "--password", password, *more)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(scope="module")
def users_broker(tmp_path_factory) -> Iterator[BrokerProcess]:
    """Loopback, so anonymous clients are allowed; users alice (namespace default) and bob
    (namespace tenant-b)."""
    data_dir = tmp_path_factory.mktemp("amqp-login") / "data"
    _user_add(data_dir, "alice", "wonderland")
    broker = start_broker(data_dir, "--roles", "amqp,admin")
    status, _ = http(broker.http, "POST", "/api/v1/namespaces", broker.token, {"name": "tenant-b"})
    assert status == 201
    _user_add(data_dir, "bob", "builder", "--namespace", "tenant-b")
    wait_until(lambda: open_answer(broker, "bob", "builder") is not None, 10, 0.2, "bob known")
    yield broker
    broker.stop()


def start_ok(
    broker: BrokerProcess,
    user: str,
    password: str,
    *,
    mechanism: str = "PLAIN",
    source: str | None = None,
) -> tuple[RawAmqp, object]:
    """Connection.Start, StartOk; returns the client and what answered (Tune or Close)."""
    client = RawAmqp(broker.ports["amqp"], source or loopback_address())
    client.send_raw(b"AMQP\x00\x00\x09\x01")
    client.expect(commands.Connection.Start)
    if mechanism == "PLAIN":
        response = f"\0{user}\0{password}"
    else:
        table = encode.field_table({"LOGIN": user, "PASSWORD": password})[4:]
        response = table.decode("latin-1")
    client.send((commands.Connection.StartOk(response=response, mechanism=mechanism), 0))
    return client, client.recv()[1]


def open_answer(
    broker: BrokerProcess, user: str, password: str, vhost: str = "/", **kwargs
) -> object | None:
    """The answer to Connection.Open after a successful login; None if the login failed."""
    client, answer = start_ok(broker, user, password, **kwargs)
    try:
        if not isinstance(answer, commands.Connection.Tune):
            return None
        client.send((commands.Connection.TuneOk(answer.channel_max, answer.frame_max, 0), 0))
        client.send((commands.Connection.Open(virtual_host=vhost), 0))
        return client.recv()[1]
    finally:
        client.close()


def refused(answer: object, code: int = 403) -> bool:
    return isinstance(answer, commands.Connection.Close) and answer.reply_code == code


@pytest.mark.parametrize("mechanism", ["PLAIN", "AMQPLAIN"])
def test_user_logs_in(users_broker, mechanism):
    answer = open_answer(users_broker, "alice", "wonderland", mechanism=mechanism)
    assert isinstance(answer, commands.Connection.OpenOk)


def test_pika_user_logs_in_and_is_refused_with_a_wrong_password(users_broker):
    port = users_broker.ports["amqp"]
    conn = connect(port, credentials=pika.PlainCredentials("alice", "wonderland"))
    conn.channel().queue_declare("", exclusive=True)
    conn.close()
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as info:
        connect(port, credentials=pika.PlainCredentials("alice", "wrong"))
    assert "(403) 'ACCESS_REFUSED" in str(info.value)


@pytest.mark.parametrize("mechanism", ["PLAIN", "AMQPLAIN"])
def test_unknown_user_is_refused_even_when_anonymous_allowed(users_broker, mechanism):
    _, answer = start_ok(users_broker, "nobody-here", "x", mechanism=mechanism)
    assert refused(answer)
    # Anonymous logins are allowed on this loopback broker: empty, and pika's defaults.
    assert isinstance(open_answer(users_broker, "", ""), commands.Connection.OpenOk)
    assert isinstance(open_answer(users_broker, "guest", "guest"), commands.Connection.OpenOk)
    connect(users_broker.ports["amqp"]).close()


def test_refusals_are_logged_with_address_and_reason_but_no_password(users_broker):
    source = loopback_address()
    assert refused(start_ok(users_broker, "alice", "pw-xyzzy", source=source)[1])
    assert refused(start_ok(users_broker, "mallory", "pw-plugh", source=source)[1])

    def refusals() -> list[str] | None:
        found = [
            x for x in users_broker.output if f"connection {source}:" in x and "login refused" in x
        ]
        return found if len(found) >= 4 else None  # the reason, then the Connection.Close

    lines = wait_until(refusals, 10, what="logged refusals")
    assert any("bad_password" in x and "'alice'" in x for x in lines)
    assert any("unknown_user" in x and "'mallory'" in x for x in lines)
    assert not [x for x in users_broker.output if "pw-xyzzy" in x or "pw-plugh" in x]


def test_failed_logins_from_one_address_are_rate_limited(users_broker):
    source = loopback_address()
    for _ in range(5):
        assert refused(start_ok(users_broker, "alice", "guess", source=source)[1])
    # Blocked now, the right password included; other addresses are not.
    assert refused(start_ok(users_broker, "alice", "wonderland", source=source)[1])
    answer = open_answer(users_broker, "alice", "wonderland")
    assert isinstance(answer, commands.Connection.OpenOk)
    # The log is read from the broker's output by a thread: wait for the line, not a moment.
    wait_until(
        lambda: any(
            f"connection {source}:" in x and "rate_limited" in x for x in users_broker.output
        ),
        10,
        0.1,
        "the rate_limited log line",
    )


def test_a_user_opens_only_its_own_namespace(users_broker):
    # bob belongs to tenant-b: "/" (or empty) is tenant-b, naming it works, others are 530.
    assert isinstance(open_answer(users_broker, "bob", "builder"), commands.Connection.OpenOk)
    answer = open_answer(users_broker, "bob", "builder", vhost="tenant-b")
    assert isinstance(answer, commands.Connection.OpenOk)
    assert refused(open_answer(users_broker, "bob", "builder", vhost="default"), 530)
    assert refused(open_answer(users_broker, "alice", "wonderland", vhost="tenant-b"), 530)


def test_a_users_slash_vhost_is_its_namespace(users_broker, uid):
    """A queue bob declares on "/" lives in tenant-b: an anonymous client on "/" (default)
    does not see it, one on vhost tenant-b does."""
    port = users_broker.ports["amqp"]
    bob = connect(port, credentials=pika.PlainCredentials("bob", "builder"))
    try:
        bob.channel().queue_declare(f"tenant-q-{uid}", durable=True)
    finally:
        bob.close()
    other = connect(port)
    try:
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as missing:
            other.channel().queue_declare(f"tenant-q-{uid}", passive=True)
        assert missing.value.reply_code == 404
    finally:
        other.close()
    tenant = connect(port, virtual_host="tenant-b")
    try:
        tenant.channel().queue_declare(f"tenant-q-{uid}", passive=True)
    finally:
        tenant.close()


def test_guest_is_a_user_once_one_has_the_name(tmp_path):
    """guest/guest (AMQP clients' default) is anonymous only while no user is called guest."""
    data_dir = tmp_path / "data"
    _user_add(data_dir, "guest", "not-guest")
    broker = start_broker(data_dir, "--roles", "amqp,admin")
    try:
        assert refused(start_ok(broker, "guest", "guest")[1])
        assert isinstance(open_answer(broker, "guest", "not-guest"), commands.Connection.OpenOk)
    finally:
        broker.stop()


def test_anonymous_refused_when_not_allowed(tmp_path):
    broker = start_broker(tmp_path / "data", "--roles", "amqp,admin", "--allow-anonymous", "false")
    try:
        for user, password in (("", ""), ("guest", "guest")):
            client, answer = start_ok(broker, user, password)
            assert refused(answer)
            client.send((commands.Connection.CloseOk(), 0))
            with pytest.raises(Closed):
                client.recv()
            client.close()
    finally:
        broker.stop()
