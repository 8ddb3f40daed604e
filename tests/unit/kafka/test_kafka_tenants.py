"""Kafka tenants (``flowmq_broker.kafka.tenants``): one per namespace, made on first use and
dropped once idle, so their number stays bounded by the namespaces in use."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from flowmq_broker.kafka.tenants import Tenants


def _tenants(deleted: list[tuple[str, str]] | None = None) -> Tenants:
    services = SimpleNamespace(config=SimpleNamespace(kafka_auto_create_topics=True))

    async def forget(namespace: str, name: str) -> None:
        if deleted is not None:
            deleted.append((namespace, name))

    return Tenants(services, forget)  # type: ignore[arg-type]


def test_one_tenant_per_namespace_each_with_its_own_topics_and_groups():
    tenants = _tenants()
    a = tenants.get("a")
    assert tenants.get("a") is a
    assert a.topics.namespace == "a" and a.namespace == "a"
    b = tenants.get("b")
    assert b.topics is not a.topics and b.coordinator is not a.coordinator
    assert tenants.default.namespace == "default"


def test_idle_tenants_are_dropped_but_default_and_tenants_with_groups_stay():
    tenants = _tenants()
    a = tenants.get("a")
    tenants.attach(a)
    tenants.attach(a)
    tenants.detach(a)
    assert tenants.find("a") is a  # one connection left
    tenants.detach(a)
    assert tenants.find("a") is None
    tenants.attach(tenants.default)
    tenants.detach(tenants.default)
    assert tenants.find("default") is tenants.default

    b = tenants.get("b")
    tenants.attach(b)
    b.coordinator.groups["g"] = object()  # type: ignore[assignment]
    tenants.detach(b)
    assert tenants.find("b") is b  # its group state lives on without connections


def test_deleting_a_topic_forgets_it_in_its_namespace():
    deleted: list[tuple[str, str]] = []
    tenants = _tenants(deleted)

    async def run() -> None:
        for callback in tenants.get("a").topics.on_deleted:
            await callback("orders")

    asyncio.run(run())
    assert deleted == [("a", "orders")]
