"""CONNECT with user name and password: users live in the meta store (``flowmq user add``),
anonymous clients are allowed or refused by configuration."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fixtures.broker_process import BrokerProcess, start_broker
from tests.fixtures.cli import flowmq_user

from .conftest import ROLES, Paho, RawClient, wait_until


def _user_add(data_dir, name: str, password: str) -> None:
    done = flowmq_user(data_dir, "add", name, "--password", password)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(scope="module")
def closed_broker(tmp_path_factory) -> Iterator[BrokerProcess]:
    """A broker that refuses anonymous clients and knows user alice."""
    data = tmp_path_factory.mktemp("auth") / "data"
    data.mkdir(parents=True)
    _user_add(data, "alice", "wonderland")
    proc = start_broker(data, *ROLES, "--allow-anonymous", "false")
    yield proc
    proc.stop()


def _connack(port: int, level: int, **kwargs):
    c = RawClient(port, level)
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
    assert ack.reason_code in ((0x87, 0x86) if level == 5 else (5, 4))


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
        lambda: _connack(port, 5, username="carol", password=b"nope").reason_code == 0x86,
        timeout=10,
        step=0.2,
    )
    assert _connack(port, 4, username="carol", password=b"nope").reason_code == 4
    assert _connack(port, 5, username="carol", password=b"secret").reason_code == 0
    assert _connack(port, 5).reason_code == 0  # anonymous is fine here


def test_enhanced_authentication_method_is_refused(broker):
    """No AUTH methods are supported: a CONNECT asking for one gets 0x8C."""
    ack = _connack(broker.ports["mqtt"], 5, properties={"authentication_method": "SCRAM-SHA-256"})
    assert ack.reason_code == 0x8C
