"""Users in the meta store: `flowmq user`, MQTT user name/password, anonymous access."""

from __future__ import annotations

import threading
import time

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from tests.fixtures.addresses import loopback_address
from tests.fixtures.broker_process import start_broker
from tests.fixtures.cli import flowmq_user


def connect_result(port: int, protocol: int, username: str | None, password: str | None) -> int:
    """The CONNACK reason (v5) or return code (3.1.1) a paho client gets."""
    result: list[int] = []
    done = threading.Event()
    client = mqtt.Client(
        CallbackAPIVersion.VERSION2, protocol=protocol, client_id=f"c{time.monotonic_ns()}"
    )

    def on_connect(client, userdata, flags, reason_code, properties):
        result.append(reason_code.value)
        done.set()

    client.on_connect = on_connect
    client.on_connect_fail = lambda *a: done.set()
    if username is not None:
        client.username_pw_set(username, password)
    # From an address of its own: refusals must not rate-limit the next test's logins.
    client.connect("127.0.0.1", port, bind_address=loopback_address())
    client.loop_start()
    try:
        assert done.wait(10), "no CONNACK"
    finally:
        client.disconnect()
        client.loop_stop()
    return result[0]


@pytest.fixture(scope="module")
def locked_broker(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("users") / "data"
    assert flowmq_user(data_dir, "add", "alice", "--password", "wonderland").returncode == 0
    broker = start_broker(data_dir, "--allow-anonymous", "false", "--acl-default", "allow")
    yield broker
    broker.stop()


@pytest.mark.parametrize(
    ("protocol", "username", "password", "expected"),
    [
        # paho reports 3.1.1 return codes 4 and 5 as the v5 codes 0x86 and 0x87
        (mqtt.MQTTv311, "alice", "wonderland", 0),
        (mqtt.MQTTv311, "alice", "wrong", 0x86),  # return code 4: bad user name or password
        (mqtt.MQTTv311, None, None, 0x87),  # return code 5: not authorised
        (mqtt.MQTTv311, "mallory", "x", 0x86),
        (mqtt.MQTTv5, "alice", "wonderland", 0x00),
        (mqtt.MQTTv5, "alice", "wrong", 0x86),
        (mqtt.MQTTv5, None, None, 0x87),
    ],
)
def test_mqtt_login(locked_broker, protocol, username, password, expected):
    port = locked_broker.ports["mqtt"]
    assert connect_result(port, protocol, username, password) == expected


def test_user_added_while_running_can_log_in(locked_broker):
    port = locked_broker.ports["mqtt"]
    assert connect_result(port, mqtt.MQTTv5, "bob", "builder") == 0x86
    added = flowmq_user(locked_broker.data_dir, "add", "bob", stdin="builder\n")
    assert added.returncode == 0, added.stderr
    deadline = time.monotonic() + 10  # brokers pick users up with the metadata version
    while connect_result(port, mqtt.MQTTv5, "bob", "builder") != 0:
        assert time.monotonic() < deadline, "new user never accepted"


def test_user_cli_list_and_delete(tmp_path):
    data_dir = tmp_path / "d"
    assert flowmq_user(data_dir, "add", "carol", "--password", "p").returncode == 0
    assert flowmq_user(data_dir, "list").stdout.split() == ["carol"]
    assert flowmq_user(data_dir, "delete", "carol").returncode == 0
    gone = flowmq_user(data_dir, "delete", "carol")
    assert gone.returncode == 1 and "no user carol" in gone.stderr


def test_anonymous_allowed_by_default_and_known_users_still_checked(tmp_path):
    data_dir = tmp_path / "d"
    flowmq_user(data_dir, "add", "dave", "--password", "pw")
    broker = start_broker(data_dir)
    try:
        port = broker.ports["mqtt"]
        assert connect_result(port, mqtt.MQTTv5, None, None) == 0
        assert connect_result(port, mqtt.MQTTv5, "dave", "pw") == 0
        assert connect_result(port, mqtt.MQTTv5, "dave", "nope") == 0x86
    finally:
        broker.stop()
