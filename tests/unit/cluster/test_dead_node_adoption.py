"""A survivor adopts a dead node's persistent MQTT sessions even when, at first, a record
named another process of that node than the one it knew: real links on loopback, one shared
in-memory meta store, the MQTT server's own adoption."""

from __future__ import annotations

import pytest

from flowmq_broker import cluster as cluster_module
from flowmq_broker.cluster import ClusterRouting
from flowmq_broker.mqtt.server import MqttServer
from flowmq_broker.mqtt.session import Session, Subscription
from flowmq_broker.routing import Router
from flowmq_core.message import Message
from flowmq_meta import keys
from flowmq_meta.memory import MemoryMetaStore
from flowmq_wire.mqtt.packets import SubscriptionOptions
from tests.fixtures.waiting import wait_until_async

pytestmark = pytest.mark.timeout(30)
KEY = ("default", "k")


def broker(node_id: str, meta: MemoryMetaStore) -> tuple[ClusterRouting, MqttServer]:
    cluster = ClusterRouting(node_id, meta)
    mqtt = MqttServer(Router(forwarder=cluster), meta, None, None, node_id=node_id, cluster=cluster)
    cluster.on_node_dead.append(mqtt.adopt_sessions)  # what MqttServer.start does
    return cluster, mqtt


async def test_a_session_another_process_of_a_dead_node_held_is_adopted_once_it_is_gone(
    monkeypatch,
) -> None:
    """a knows c's process from before a restart; c's new process stored the session and
    then died too.  a's first adoption finds the record of a process it did not know, and
    keeps c's routes (refusing, rather than clearing them under a live holder); before, that
    was final: the session stayed on no node and every QoS 1 message for it was refused
    until its client reconnected.  Looked at again, c is still gone: a adopts it."""
    monkeypatch.setattr(cluster_module, "ADOPT_RETRY_S", 0.2)
    meta = MemoryMetaStore()
    (a, a_mqtt), (c, _) = broker("a", meta), broker("c", meta)
    ports = {"a": await a.start(0, a_mqtt.router), "c": await c.start(0, Router(forwarder=c))}
    members = [(name, "127.0.0.1", port) for name, port in ports.items()]
    a.set_members(members)
    c.set_members(members)
    try:
        c.local_added("default", "own/#")
        await wait_until_async(lambda: a.nodes_matching("default", "own/x"), 5, what="c's route")
        a.forward("default", Message("own/x", b"hello"), frozenset())  # a's link reaches c
        await wait_until_async(lambda: a.links.incarnation_of("c"), 5, what="a link to c")
        _, c_later = broker("c", meta)  # a process of c that a never reached
        session = Session("k", "default")
        session.expiry_interval = 300
        sub = Subscription("own/#", SubscriptionOptions(qos=1))
        session.subscriptions[sub.subscribed_filter] = sub
        assert await c_later.save_session(session)
        await c.links.stop()  # c dies without a word
        a.node_gone("c")
        await wait_until_async(lambda: KEY in a_mqtt.sessions, 5, what="the session adopted")
        assert await a_mqtt.owns_session(*KEY)
        begin, end = keys.ROUTES.range("c")
        assert await meta.transact(lambda tr: tr.get_range(begin, end)) == []
    finally:
        await a.stop()
        await c.stop()
