"""The stream maintenance job: retention by bytes, deleted streams' data, object GC."""

from __future__ import annotations

from flowmq_jobs.stream_maintenance import StreamMaintenance, policy_of
from flowmq_meta import keys
from flowmq_meta.catalog import Destination


async def publish(api, topic: str, count: int) -> None:
    for i in range(count):
        status, _ = await api.call(
            "POST", f"/api/v1/topics/{topic}/messages", json={"payload": "x" * 100 + str(i)}
        )
        assert status == 200


def test_policy_maps_kafka_minus_one_to_unlimited():
    dest = Destination(
        "stream", "default", "s", ["s"], {"retention_ms": -1, "retention_bytes": 500}
    )
    assert (policy_of(dest).retention_ms, policy_of(dest).retention_bytes) == (None, 500)


async def test_retention_by_bytes_drops_the_oldest_chunks(api, broker):
    await api.call("POST", "/api/v1/streams", json={"name": "small", "retention_bytes": 300})
    await publish(api, "small", 10)  # one flush per HTTP publish: ten chunks of ~180 bytes
    before = await broker.streams.partition_info("default", "small", 0)
    job = StreamMaintenance(broker.meta, broker.objects, broker.router.destinations, "test")
    await job.run_once()
    after = await broker.streams.partition_info("default", "small", 0)
    assert before.log_start_offset == 0 and after.high_watermark == before.high_watermark == 10
    assert after.log_start_offset > 0, "old chunks removed"
    assert 300 <= after.size_bytes < before.size_bytes
    fetched = await broker.streams.fetch("default", "small", 0, after.log_start_offset, 1 << 20)
    assert fetched.records  # what remains is readable


async def test_deleted_stream_data_is_removed(api, broker):
    await api.call("POST", "/api/v1/streams", json={"name": "gone"})
    await publish(api, "gone", 3)
    hwm_key = keys.STREAM_HWM.pack("default", "gone", 0)
    assert await broker.meta.get(hwm_key) is not None
    await api.call("DELETE", "/api/v1/streams/gone")
    job = StreamMaintenance(broker.meta, broker.objects, broker.router.destinations, "test")
    await job.run_once()
    assert await broker.meta.get(hwm_key) is None
    begin, end = keys.STREAM_INDEX.range("default", "gone")
    assert await broker.meta.transact(lambda tr: tr.get_range(begin, end)) == []
