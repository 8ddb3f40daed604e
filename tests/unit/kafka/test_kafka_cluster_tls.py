"""The Kafka cluster view carries each broker's TLS port (``kafka_tls`` of the node table),
and a TLS client is told TLS ports."""

from __future__ import annotations

from flowmq_broker.kafka.cluster import ClusterView, KafkaNode


async def test_node_table_tls_ports_reach_the_view():
    rows = [
        {"node_id": "me", "self": True, "status": "up", "ports": {"kafka": 9092}},
        {
            "node_id": "b",
            "status": "up",
            "host": "10.0.0.2",
            "ports": {"kafka": 19092, "kafka_tls": 19093},
        },
        {"node_id": "c", "status": "up", "host": "10.0.0.3", "ports": {"kafka": 29092}},
    ]

    async def table():
        return rows

    view = ClusterView("me", table)
    view.local = KafkaNode("me", view.local.id, None, 9092)
    view.set_tls_port(9093)
    await view.refresh()
    ports = {n.name: (n.port_for(False), n.port_for(True)) for n in view.nodes}
    # c has no TLS listener: a TLS client is told its plain port
    assert ports == {"me": (9092, 9093), "b": (19092, 19093), "c": (29092, 29092)}
    assert view.local.tls_port == 9093


async def test_a_peer_on_loopback_is_advertised_where_the_client_reached_us():
    """Host mode's processes reach each other over loopback; a client on another host must
    be sent to this host's address for them, not to 127.0.0.1."""
    rows = [
        {"node_id": "h-p1", "status": "up", "host": "127.0.0.1", "ports": {"kafka": 40001}},
        {"node_id": "far", "status": "up", "host": "10.0.0.2", "ports": {"kafka": 9092}},
    ]

    async def table():
        return rows

    view = ClusterView("h-p0", table)
    view.start(40000)
    await view.refresh()
    await view.stop()
    hosts = {n.name: n.host for n in view.nodes}
    assert hosts == {"h-p0": None, "h-p1": None, "far": "10.0.0.2"}
