"""The authorisation hook (in-process broker): a deny means SUBACK 0x87 / PUBACK 0x87 in v5,
SUBACK 0x80 in 3.1.1, and a denied PUBLISH reaches nobody."""

from __future__ import annotations

import pytest

from flowmq_broker.mqtt.server import Authorizer
from flowmq_meta.users import create_user
from flowmq_wire.mqtt.packets import Publish, Pubrec, SubscriptionOptions, Will

from .conftest import Paho, RawClient, connected, subscribed


class DenySecret(Authorizer):
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str | None]] = []

    def allow(self, client_id: str, username: str | None, action: str, topic: str) -> bool:
        self.calls.append((action, topic, username))
        return "secret" not in topic.split("/")


@pytest.fixture
def authz(inproc_broker):
    hook = DenySecret()

    def install() -> None:
        inproc_broker.broker.mqtt.authorizer = hook

    inproc_broker.call(install)
    return hook


@pytest.fixture
def clients(inproc_broker):
    made: list[Paho] = []
    raws: list[RawClient] = []
    port = inproc_broker.ports["mqtt"]

    class Make:
        @staticmethod
        def paho(client_id: str, **kwargs) -> Paho:
            c = Paho(port, client_id, **kwargs)
            made.append(c)
            return c

        @staticmethod
        def raw(level: int) -> RawClient:
            c = RawClient(port, level)
            raws.append(c)
            return c

    yield Make
    for c in made:
        c.close()
    for r in raws:
        r.close()


def test_denied_subscribe_v5_and_v311(inproc_broker, authz, clients):
    broker = inproc_broker.broker
    inproc_broker.run(create_user(broker.meta, "alice", "pw"))
    inproc_broker.run(broker.users.refresh())
    v5 = clients.raw(5)
    v5.connect("sub5", username="alice", password=b"pw")
    assert v5.subscribe(
        ("a/secret/x", SubscriptionOptions(1)), ("a/open", SubscriptionOptions(1))
    ) == [0x87, 1]
    v311 = clients.raw(4)
    v311.connect("sub4")
    assert v311.subscribe(("secret/#", SubscriptionOptions(1)), "open/#") == [0x80, 0]
    assert ("subscribe", "a/secret/x", "alice") in authz.calls


class DenySecretSubscriptionsOf(Authorizer):
    """Denies one client's subscriptions to filters with a ``secret`` level; allows everything
    else, publishes to ``secret/...`` included."""

    def __init__(self, client_id: str) -> None:
        self.client_id = client_id

    def allow(self, client_id: str, username: str | None, action: str, topic: str) -> bool:
        refused = action == "subscribe" and client_id == self.client_id
        return not (refused and "secret" in topic.split("/"))


def test_denied_subscribe_is_not_active(inproc_broker, clients):
    """A refused filter matches nothing, checked against a control client granted the same
    filter: the publish reaches the control, and not the refused client."""

    def install() -> None:
        inproc_broker.broker.mqtt.authorizer = DenySecretSubscriptionsOf("denied-sub")

    inproc_broker.call(install)
    sub = connected(clients.paho, "denied-sub", v5=True)
    assert sub.subscribe("secret/#", 1) == [0x87]
    assert sub.subscribe("open/#", 1) == [1]
    control = subscribed(clients.paho, "control-sub", "secret/#", 1, v5=True)
    pub = connected(clients.paho, "pub")
    assert pub.publish("secret/x", b"secret", 1) == 0
    pub.publish("open/x", b"open", 1)
    m = control.get()
    assert (m.topic, m.payload) == ("secret/x", b"secret")
    # Both go to the refused client's one session in publish order: had the refused filter
    # been bound, the secret message would come before the open one.
    m = sub.get()
    assert (m.topic, m.payload) == ("open/x", b"open")
    sub.expect_none()


def test_denied_publish_v5_puback_and_pubrec_0x87(authz, clients):
    spy = subscribed(clients.paho, "spy", "#", 2, v5=True)

    pub = clients.raw(5)
    pub.connect("pub5")
    assert pub.publish("secret/one", b"no", 1).reason_code == 0x87
    pub.send(Publish("secret/two", b"no", 2, packet_id=77))
    rec = pub.expect(Pubrec)
    assert (rec.packet_id, rec.reason_code) == (77, 0x87)
    pub.publish("open/one", b"yes", 1)
    m = spy.get()
    assert m.payload == b"yes"
    spy.expect_none()


def test_denied_publish_v311_is_not_delivered(authz, clients):
    spy = subscribed(clients.paho, "spy4", "#", 1, v5=False)
    pub = clients.raw(4)
    pub.connect("pub4")
    # 3.1.1 has no negative acknowledgement: the PUBACK comes (or the connection is closed),
    # and the message goes nowhere.
    pub.send(Publish("secret/x", b"no", 1, packet_id=1))
    pub.send(Publish("open/x", b"yes", 0))
    assert spy.get().payload == b"yes"
    spy.expect_none()


def test_denied_will_is_not_published(authz, clients):
    spy = subscribed(clients.paho, "willspy", "#", 1, v5=True)
    c = clients.raw(5)
    ack = c.connect("willer", will=Will("secret/will", b"no"), expect_success=False)
    # Refusing the CONNECT (0x87) is one way; accepting it and never publishing the will is
    # the other. Publishing a will to a topic the client may not publish to is not.
    assert ack.reason_code in (0, 0x87)
    c.kill()
    spy.expect_none()
