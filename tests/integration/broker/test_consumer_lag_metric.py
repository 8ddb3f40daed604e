"""``kafka_consumer_group_lag``: the group's coordinator exports end offsets minus committed
offsets for every group with committed offsets, members or not, and follows each change."""

from __future__ import annotations

from flowmq_metrics.registry import REGISTRY


def lag(group: str) -> float | None:
    return REGISTRY.get_sample_value(
        "kafka_consumer_group_lag", {"namespace": "default", "group": group}
    )


async def test_lag_of_a_group_without_members_follows_commits(broker, api) -> None:
    assert (await api.call("POST", "/api/v1/streams", json={"name": "lagged"}))[0] == 201
    batch = {"messages": [{"payload": f"m{i}"} for i in range(6)]}
    status, _ = await api.call("POST", "/api/v1/topics/lagged/messages/batch", json=batch)
    assert status == 200
    assert lag("readers") is None  # no offsets committed: no series

    reset = {"stream": "lagged", "to": 2}
    assert (await api.call("POST", "/api/v1/groups/readers/reset-offsets", json=reset))[0] == 200
    await broker.group_admin.export_lag()
    assert lag("readers") == 4

    reset = {"stream": "lagged", "to": "latest"}
    assert (await api.call("POST", "/api/v1/groups/readers/reset-offsets", json=reset))[0] == 200
    await broker.group_admin.export_lag()
    assert lag("readers") == 0
