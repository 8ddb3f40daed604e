"""CONNECT with user name and password: users live in the meta store (``flowmq user add``),
anonymous clients are allowed or refused by configuration."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from flowmq_wire.mqtt.packets import (
    Connack,
    Connect,
    Pingreq,
    Publish,
    Subscribe,
    SubscriptionOptions,
)
from tests.fixtures.addresses import connect_from, loopback_address
from tests.fixtures.broker_process import BrokerProcess, start_broker
from tests.fixtures.cli import flowmq_user

from .conftest import HOST, ROLES, Paho, RawClient, http, wait_until


def _user_add(data_dir, name: str, password: str) -> None:
    done = flowmq_user(data_dir, "add", name, "--password", password)
    assert done.returncode == 0, done.stdout + done.stderr


def _user_add_in(data_dir, name: str, password: str, namespace: str) -> None:
    done = flowmq_user(data_dir, "add", name, "--password", password, "--namespace", namespace)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(scope="module")
def closed_broker(tmp_path_factory) -> Iterator[BrokerProcess]:
    """A broker that refuses anonymous clients and knows user alice."""
    data = tmp_path_factory.mktemp("auth") / "data"
    data.mkdir(parents=True)
    _user_add(data, "alice", "wonderland")
    # Authentication is under test: authorization is left open (acl_default would be deny).
    proc = start_broker(data, *ROLES, "--allow-anonymous", "false", "--acl-default", "allow")
    yield proc
    proc.stop()


def _connack(port: int, level: int, *, source: str | None = None, **kwargs):
    """The CONNACK a raw client gets, connecting from ``source`` (by default an address of
    its own, so that refusals in one test never rate-limit another)."""
    c = RawClient(port, level, sock=connect_from(HOST, port, source))
    try:
        ack = c.connect(f"auth-{level}", expect_success=False, **kwargs)
        if ack.reason_code:
            c.wait_closed()
        return ack
    finally:
        c.close()


@pytest.mark.parametrize("level", [4, 5])
def test_known_user_with_right_password_connects(closed_broker, level):
    ack = _connack(closed_broker.ports["mqtt"], level, username="alice", password=b"wonderland")
    assert ack.reason_code == 0


@pytest.mark.parametrize(
    ("username", "password"),
    [("alice", b"wrong"), ("alice", None), ("mallory", b"wonderland")],
)
@pytest.mark.parametrize("level", [4, 5])
def test_bad_credentials_are_refused(closed_broker, level, username, password):
    ack = _connack(closed_broker.ports["mqtt"], level, username=username, password=password)
    assert ack.reason_code == (0x86 if level == 5 else 4)  # bad user name or password


@pytest.mark.parametrize("level", [4, 5])
def test_anonymous_refused_when_not_allowed(closed_broker, level):
    ack = _connack(closed_broker.ports["mqtt"], level)
    assert ack.reason_code == (0x87 if level == 5 else 5)  # not authorized


def test_refusals_are_logged_with_address_and_reason_but_no_password(closed_broker):
    source = loopback_address()
    port = closed_broker.ports["mqtt"]
    assert _connack(port, 5, source=source, username="alice", password=b"pw-xyzzy").reason_code
    assert _connack(port, 5, source=source, username="mallory", password=b"pw-plugh").reason_code
    assert _connack(port, 4, source=source).reason_code == 5

    def refusals() -> list[str] | None:
        found = [x for x in closed_broker.output if f"mqtt {source}:" in x and "refused" in x]
        return found if len(found) >= 3 else None

    lines = wait_until(refusals, timeout=10)
    assert "bad_password" in lines[0] and "'alice'" in lines[0]
    assert "unknown_user" in lines[1] and "'mallory'" in lines[1]
    assert "anonymous clients are not allowed" in lines[2]
    assert not [line for line in closed_broker.output if "pw-xyzzy" in line or "pw-plugh" in line]


@pytest.mark.parametrize("level", [4, 5])
def test_failed_logins_from_one_address_are_rate_limited(closed_broker, level):
    """Five failures within a minute block the address for a minute, the right password
    included (0x9F Connection rate exceeded; 3.1.1: 3 Server unavailable); other addresses
    are unaffected."""
    port = closed_broker.ports["mqtt"]
    source = loopback_address()
    for _ in range(5):
        ack = _connack(port, level, source=source, username="alice", password=b"guess")
        assert ack.reason_code == (0x86 if level == 5 else 4)
    right = {"username": "alice", "password": b"wonderland"}
    assert _connack(port, level, source=source, **right).reason_code == (0x9F if level == 5 else 3)
    assert _connack(port, level, **right).reason_code == 0  # from another address


def test_packets_sent_with_connect_wait_for_the_login(closed_broker):
    """CONNECT, SUBSCRIBE and PUBLISH in one write: the login is checked off the event loop
    while the later packets wait, then they are handled in order after the CONNACK."""
    port = closed_broker.ports["mqtt"]
    c = RawClient(port, 5, sock=connect_from(HOST, port))
    try:
        c.send(
            Connect("held-1", True, 60, None, "alice", b"wonderland", {}, protocol_level=5),
            Subscribe(1, [("held/t", SubscriptionOptions(qos=1))], {}),
            Publish("held/t", b"after-login", 1, False, False, 2),
            Pingreq(),
        )
        ack = c.recv()
        assert isinstance(ack, Connack) and ack.reason_code == 0
        kinds = [type(c.recv()).__name__ for _ in range(4)]
        # The delivery and the PUBACK may come in either order; both after the SUBACK.
        assert kinds[0] == "Suback" and sorted(kinds[1:]) == ["Pingresp", "Puback", "Publish"]
    finally:
        c.close()


def test_packets_sent_with_a_refused_connect_are_dropped(closed_broker):
    port = closed_broker.ports["mqtt"]
    c = RawClient(port, 5, sock=connect_from(HOST, port))
    try:
        c.send(
            Connect("held-2", True, 60, None, "alice", b"wrong", {}, protocol_level=5),
            Publish("held/refused", b"never", 1, False, False, 1),
        )
        assert c.recv().reason_code == 0x86
        assert c.wait_closed() == []
    finally:
        c.close()


def test_paho_with_credentials(closed_broker):
    c = Paho(closed_broker.ports["mqtt"], "paho-alice", v5=True)
    try:
        c.client.username_pw_set("alice", "wonderland")
        c.connect()
        c.subscribe("auth/x", 1)
        c.publish("auth/x", b"authenticated", 1)
        assert c.get().payload == b"authenticated"
    finally:
        c.close()


def test_user_added_while_running_can_connect(closed_broker):
    port = closed_broker.ports["mqtt"]
    assert _connack(port, 5, username="bob", password=b"builder").reason_code != 0
    _user_add(closed_broker.data_dir, "bob", "builder")
    # The broker learns about the new user from the meta store (polled, bounded).
    wait_until(
        lambda: _connack(port, 5, username="bob", password=b"builder").reason_code == 0,
        timeout=10,
        step=0.2,
    )


def test_known_user_needs_the_right_password_even_when_anonymous_allowed(broker):
    """With anonymous clients allowed, a known user name with a wrong password is still
    refused (it would otherwise be a way around the password)."""
    _user_add(broker.data_dir, "carol", "secret")
    port = broker.ports["mqtt"]
    # Once the broker has picked the user up from the meta store (polled, bounded)…
    wait_until(
        lambda: _connack(port, 5, username="carol", password=b"secret").reason_code == 0,
        timeout=10,
        step=0.2,
    )
    assert _connack(port, 5, username="carol", password=b"nope").reason_code == 0x86
    assert _connack(port, 4, username="carol", password=b"nope").reason_code == 4
    assert _connack(port, 5).reason_code == 0  # anonymous is fine here


@pytest.mark.parametrize("level", [4, 5])
@pytest.mark.parametrize("password", [b"anything", None])
def test_unknown_user_is_refused_even_when_anonymous_allowed(broker, level, password):
    """A user name that is not a user is refused, never taken as anonymous."""
    ack = _connack(broker.ports["mqtt"], level, username="nobody-here", password=password)
    assert ack.reason_code == (0x86 if level == 5 else 4)
    assert _connack(broker.ports["mqtt"], level).reason_code == 0  # anonymous: allowed here


def test_a_user_is_confined_to_its_namespace(broker, uid):
    """A user's namespace is its connection's: its topics are not the default namespace's
    (DESIGN.md §12, namespaces are tenants)."""
    status, _ = http(broker.http, "POST", "/api/v1/namespaces", broker.token, {"name": f"t-{uid}"})
    assert status == 201
    _user_add_in(broker.data_dir, f"ten-{uid}", "pw", f"t-{uid}")
    port = broker.ports["mqtt"]
    wait_until(
        lambda: _connack(port, 5, username=f"ten-{uid}", password=b"pw").reason_code == 0,
        timeout=10,
        step=0.2,
    )
    tenant = Paho(port, f"tenant-{uid}")
    anonymous = Paho(port, f"anon-{uid}")
    try:
        tenant.client.username_pw_set(f"ten-{uid}", "pw")
        tenant.connect()
        anonymous.connect()
        tenant.subscribe(f"ns/{uid}", 1)
        anonymous.subscribe(f"ns/{uid}", 1)
        anonymous.publish(f"ns/{uid}", b"default namespace", 1)
        assert anonymous.get().payload == b"default namespace"
        tenant.publish(f"ns/{uid}", b"tenant namespace", 1)
        assert tenant.get().payload == b"tenant namespace"
        tenant.expect_none()
        anonymous.expect_none()
    finally:
        tenant.close()
        anonymous.close()


def test_enhanced_authentication_method_is_refused(broker):
    """No AUTH methods are supported: a CONNECT asking for one gets 0x8C."""
    ack = _connack(broker.ports["mqtt"], 5, properties={"authentication_method": "SCRAM-SHA-256"})
    assert ack.reason_code == 0x8C
