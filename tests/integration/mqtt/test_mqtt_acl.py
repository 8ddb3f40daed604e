"""MQTT authorization with real clients (paho 3.1.1 and 5, a raw codec client) against an
in-process broker whose ACL rules are made through the admin API:

- a denied SUBSCRIBE gets 0x87 (5.0) / 0x80 (3.1.1) and is not active — a publish to it
  reaches a control client granted the same filter, never the refused one;
- a denied PUBLISH gets PUBACK/PUBREC 0x87 (5.0), or the usual PUBACK and is dropped (3.1.1);
- wills and retained messages follow the publish rules; a denied will refuses CONNECT;
- ``acl_default deny`` refuses what no rule allows, CONNECT included; an explicit deny wins;
- a rule change applies at once: live subscriptions it denies stop, cached decisions go.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from flowmq_meta.users import create_user, set_groups
from flowmq_wire.mqtt.packets import Publish, Pubrec, Will
from tests.fixtures.brokers import logged_errors
from tests.fixtures.inprocess import broker_config
from tests.fixtures.threaded_broker import ThreadedBroker

from .conftest import HOST, TIMEOUT, Paho, RawClient, http

TOKEN = "acl-token"
NOT_AUTHORIZED = 0x87


class AclBroker(ThreadedBroker):
    """An in-process broker (MQTT + admin API) with users alice, bob and carol (password
    "pw"); ``rule(...)`` adds an ACL rule through the admin API."""

    def __init__(self, data_dir, acl_default: str) -> None:
        config = broker_config(
            data_dir, node_id="acl", token=TOKEN, roles=["mqtt", "admin"], acl_default=acl_default
        )
        super().__init__(config, timeout=TIMEOUT)
        self.made: list[Paho | RawClient] = []

    def add_users(self) -> None:
        meta = self.broker.meta
        for name in ("alice", "bob", "carol"):
            self.run(create_user(meta, name, "pw"))
        self.run(self.broker.metadata_changed())

    @property
    def http(self) -> str:
        return f"http://{HOST}:{self.ports['http']}"

    def rule(self, principal: str, resource: str, action: str, effect: str = "allow") -> str:
        status, body = http(
            self.http,
            "POST",
            "/api/v1/acls",
            TOKEN,
            {
                "principal": principal,
                "namespace": "default",
                "resource": resource,
                "action": action,
                "effect": effect,
            },
        )
        assert status == 201, body
        return body["data"]["id"]

    def delete_rule(self, rule_id: str) -> None:
        status, body = http(self.http, "DELETE", f"/api/v1/acls/{rule_id}", TOKEN)
        assert status == 200, body

    def paho(self, client_id: str, user: str | None = None, **kwargs) -> Paho:
        client = Paho(self.ports["mqtt"], client_id, **kwargs)
        if user is not None:
            client.client.username_pw_set(user, "pw")
        self.made.append(client)
        return client

    def connected(self, client_id: str, user: str | None = None, **kwargs) -> Paho:
        client = self.paho(client_id, user, **kwargs)
        client.connect()
        return client

    def raw(self, level: int) -> RawClient:
        client = RawClient(self.ports["mqtt"], level)
        self.made.append(client)
        return client

    def close_clients(self) -> None:
        for client in self.made:
            client.close()


def _broker(tmp_path, caplog, acl_default: str) -> Iterator[AclBroker]:
    tb = AclBroker(tmp_path / "data", acl_default)
    tb.start()
    tb.add_users()
    yield tb
    tb.close_clients()
    errors = logged_errors(caplog)
    tb.stop()
    assert not errors, errors


@pytest.fixture
def open_broker(tmp_path, caplog) -> Iterator[AclBroker]:
    """acl_default allow: only deny rules restrict."""
    yield from _broker(tmp_path, caplog, "allow")


@pytest.fixture
def closed_broker(tmp_path, caplog) -> Iterator[AclBroker]:
    """acl_default deny: nothing without a rule."""
    yield from _broker(tmp_path, caplog, "deny")


# --- SUBSCRIBE ---------------------------------------------------------------------------------
@pytest.mark.parametrize("v5", [True, False])
def test_denied_subscribe_gets_its_code_and_is_not_active(open_broker, v5):
    b = open_broker
    b.rule("alice", "secret/#", "subscribe", "deny")
    refused = b.connected(f"refused-{v5}", "alice", v5=v5)
    assert refused.subscribe("secret/#", 1) == [NOT_AUTHORIZED if v5 else 0x80]
    assert refused.subscribe("open/#", 1) == [1]
    control = b.connected(f"control-{v5}", "bob", v5=v5)
    assert control.subscribe("secret/#", 1) == [1]
    pub = b.connected(f"pub-{v5}", "carol")
    assert pub.publish("secret/x", b"secret", 1) == 0
    assert pub.publish("open/x", b"open", 1) == 0
    m = control.get()
    assert (m.topic, m.payload) == ("secret/x", b"secret")  # the positive control
    # Both would reach the refused client's one session in publish order: had the refused
    # filter been bound, the secret message would come first.
    m = refused.get()
    assert (m.topic, m.payload) == ("open/x", b"open")
    refused.expect_none()


def test_a_subscription_must_be_wholly_allowed(open_broker):
    b = open_broker
    b.rule("*", "sensors/secret/#", "subscribe", "deny")
    c = b.connected("wide", "alice")
    assert c.subscribe("sensors/#", 0) == [NOT_AUTHORIZED]  # would include sensors/secret
    assert c.subscribe("sensors/+/temp", 0) == [NOT_AUTHORIZED]
    assert c.subscribe("sensors/open/#", 0) == [0]
    assert c.subscribe("$share/g/sensors/secret/x", 0) == [NOT_AUTHORIZED]


# --- PUBLISH -------------------------------------------------------------------------------------
def test_denied_publish_v5_gets_0x87_and_reaches_nobody(open_broker):
    b = open_broker
    b.rule("*", "secret/#", "publish", "deny")
    spy = b.connected("spy5", "bob")
    assert spy.subscribe("#", 2) == [2]
    pub = b.connected("pub5", "alice")
    assert pub.publish("secret/one", b"no", 1) == NOT_AUTHORIZED
    raw = b.raw(5)
    raw.connect("raw5", username="alice", password=b"pw")
    raw.send(Publish("secret/two", b"no", 2, packet_id=77))
    rec = raw.expect(Pubrec)
    assert (rec.packet_id, rec.reason_code) == (77, NOT_AUTHORIZED)
    assert pub.publish("open/one", b"yes", 1) == 0
    assert spy.get().payload == b"yes"
    spy.expect_none()


def test_denied_publish_v311_is_acknowledged_and_dropped(open_broker):
    b = open_broker
    b.rule("alice", "secret/#", "publish", "deny")
    spy = b.connected("spy4", "bob", v5=False)
    assert spy.subscribe("#", 1) == [1]
    pub = b.connected("pub4", "alice", v5=False)
    assert pub.publish("secret/x", b"no", 1) == 0  # PUBACK, as Mosquitto: no error in 3.1.1
    assert pub.publish("secret/y", b"no", 2) == 0  # PUBREC … PUBCOMP
    pub.publish("open/x", b"yes", 0)
    assert spy.get().payload == b"yes"
    spy.expect_none()


def test_explicit_deny_beats_allow(closed_broker):
    b = closed_broker
    b.rule("alice", "t/#", "all")
    b.rule("alice", "t/secret", "publish", "deny")
    alice = b.connected("alice", "alice")
    assert alice.subscribe("t/#", 1) == [1]
    assert alice.publish("t/open", b"ok", 1) == 0
    assert alice.publish("t/secret", b"no", 1) == NOT_AUTHORIZED
    assert alice.get().payload == b"ok"
    alice.expect_none()


# --- acl_default deny ------------------------------------------------------------------------------
@pytest.mark.parametrize("level", [5, 4])
def test_default_deny_refuses_connect_without_any_rule(closed_broker, level):
    for user in (None, "alice"):
        c = closed_broker.raw(level)  # the exact CONNACK code (paho maps 5 to 0x87)
        password = None if user is None else b"pw"
        ack = c.connect(f"nobody-{user}", username=user, password=password, expect_success=False)
        assert ack.reason_code == (NOT_AUTHORIZED if level == 5 else 5)
        c.wait_closed()
    closed_broker.rule("alice", "t/x", "publish")
    c = closed_broker.raw(level)
    assert c.connect("somebody", username="alice", password=b"pw").reason_code == 0


def test_default_deny_allows_only_what_a_rule_allows(closed_broker):
    b = closed_broker
    b.rule("alice", "t/#", "publish")
    b.rule("bob", "t/#", "subscribe")
    bob = b.connected("bob", "bob")
    assert bob.subscribe("t/#", 1) == [1]
    assert bob.subscribe("u/#", 1) == [NOT_AUTHORIZED]
    alice = b.connected("alice", "alice")
    assert alice.subscribe("t/#", 1) == [NOT_AUTHORIZED]
    assert alice.publish("u/1", b"no", 1) == NOT_AUTHORIZED
    assert alice.publish("t/1", b"yes", 1) == 0
    assert bob.get().payload == b"yes"
    bob.expect_none()


def test_group_principals(closed_broker):
    b = closed_broker
    b.rule("group:ops", "ops/#", "all")
    with pytest.raises(AssertionError, match="0x87"):
        b.connected("carol-before", "carol")
    b.run(set_groups(b.broker.meta, "carol", ["ops"]))
    b.run(b.broker.metadata_changed())
    carol = b.connected("carol", "carol")
    assert carol.subscribe("ops/#", 1) == [1]
    assert carol.publish("ops/x", b"hi", 1) == 0
    assert carol.get().payload == b"hi"


# --- wills and retained messages ----------------------------------------------------------------------
@pytest.mark.parametrize("level", [5, 4])
def test_a_will_the_client_may_not_publish_refuses_connect(open_broker, level):
    b = open_broker
    b.rule("alice", "secret/#", "publish", "deny")
    spy = b.connected(f"willspy-{level}", "bob")
    assert spy.subscribe("#", 1) == [1]
    c = b.raw(level)
    ack = c.connect(
        f"willer-{level}",
        will=Will("secret/will", b"no"),
        username="alice",
        password=b"pw",
        expect_success=False,
    )
    assert ack.reason_code == (NOT_AUTHORIZED if level == 5 else 5)
    c.kill()
    spy.expect_none()


def test_a_will_denied_after_connect_is_not_published(open_broker):
    b = open_broker
    spy = b.connected("spy", "bob")
    assert spy.subscribe("will/#", 1) == [1]
    c = b.raw(5)
    c.connect("willer", will=Will("will/alice", b"bye"), username="alice", password=b"pw")
    b.rule("alice", "will/#", "publish", "deny")
    c.kill()
    spy.expect_none()
    # The positive control: the same will, still allowed, is published.
    d = b.raw(5)
    d.connect("willer2", will=Will("will/carol", b"bye"), username="carol", password=b"pw")
    d.kill()
    assert spy.get().payload == b"bye"


def test_a_denied_retained_publish_is_not_retained(open_broker):
    b = open_broker
    b.rule("alice", "retained/secret", "publish", "deny")
    alice = b.connected("retainer", "alice")
    assert alice.publish("retained/secret", b"no", 1, retain=True) == NOT_AUTHORIZED
    assert alice.publish("retained/open", b"yes", 1, retain=True) < 0x80  # 0x10: no subscriber
    late = b.connected("late", "bob")
    assert late.subscribe("retained/#", 1) == [1]
    m = late.get()
    assert (m.topic, m.payload, m.retain) == ("retained/open", b"yes", True)
    late.expect_none()


# --- changes ----------------------------------------------------------------------------------------
def test_a_rule_change_applies_at_once(open_broker):
    b = open_broker
    alice = b.connected("live", "alice")
    assert alice.subscribe("live/#", 1) == [1]
    control = b.connected("live-control", "bob")
    assert control.subscribe("live/#", 1) == [1]
    pub = b.connected("live-pub", "carol")
    assert pub.publish("live/1", b"before", 1) == 0  # cached: carol may publish live/1
    assert alice.get().payload == b"before" and control.get().payload == b"before"

    denied_sub = b.rule("alice", "live/#", "subscribe", "deny")
    denied_pub = b.rule("carol", "live/1", "publish", "deny")
    assert pub.publish("live/1", b"denied", 1) == NOT_AUTHORIZED  # the cache was cleared
    assert pub.publish("live/2", b"after", 1) == 0
    assert control.get().payload == b"after"
    alice.expect_none()  # her live subscription was dropped

    b.delete_rule(denied_sub)
    b.delete_rule(denied_pub)
    assert pub.publish("live/1", b"again", 1) == 0
    assert control.get().payload == b"again"
    alice.expect_none()  # dropped means gone, until she subscribes again
    assert alice.subscribe("live/#", 1) == [1]
    assert pub.publish("live/1", b"back", 1) == 0
    assert alice.get().payload == b"back"


def test_a_rule_change_applies_at_once_to_plain_qos0(open_broker):
    """A connection forwards plain QoS 0 messages on a topic it already checked without
    asking the ACLs again (flowmq_broker.mqtt.delivery): a rule change still applies to the
    very next message."""
    b = open_broker
    control = b.connected("q0-control", "bob")
    assert control.subscribe("q0/#", 0) == [0]
    pub = b.connected("q0-pub", "carol")
    for payload in (b"first", b"checked"):  # the second goes by the remembered check
        pub.publish("q0/1", payload, 0)
        assert control.get().payload == payload

    denied = b.rule("carol", "q0/1", "publish", "deny")
    pub.publish("q0/1", b"denied", 0)
    pub.publish("q0/2", b"after", 0)
    assert control.get().payload == b"after"  # "denied" never came first

    b.delete_rule(denied)
    pub.publish("q0/1", b"again", 0)
    assert control.get().payload == b"again"
