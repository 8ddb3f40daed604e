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
