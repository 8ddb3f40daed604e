"""The stream maintenance job: retention by bytes, deleted streams' data, object GC, and what
it logs through an object store outage."""

from __future__ import annotations

import asyncio
import logging

from benchmarks.chaos import S3Objects
from flowmq_commit import GroupCommitBatcher
from flowmq_commit.batcher import STORE_FAILURES
from flowmq_core.periodic import PeriodicTask
from flowmq_jobs.stream_maintenance import StreamMaintenance, policy_of
from flowmq_kas3 import PageCache, StreamStore, build_batch
from flowmq_meta import keys, open_meta_store
from flowmq_meta.catalog import Destination
from flowmq_objstore import open_object_store


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


async def test_an_object_store_outage_is_one_warning_and_its_end_one_info(tmp_path, caplog):
    """While the object store is down every maintenance run fails (here compaction cannot
    read the chunks it merges): that is logged once, a WARNING line without a traceback,
    and its end once, an INFO line, not an ERROR with a traceback per run (issue #11)."""
    caplog.set_level(logging.INFO, logger="flowmq_core.periodic")
    s3 = S3Objects(tmp_path)  # chaos.py's S3 outage: moto stopped, then started again
    meta = open_meta_store(f"sqlite:///{tmp_path / 'meta.db'}")
    objects = open_object_store(s3.url)
    batcher = GroupCommitBatcher(meta, objects, node_id="n1", flush_interval=0.002)
    await batcher.start()
    task = None
    try:
        store = StreamStore(meta, objects, batcher, PageCache(1 << 20))
        for i in range(3):  # three small chunks: compaction has a run to merge
            await store.append("default", "events", 0, build_batch([(None, b"%d" % i, [], 1)]))
        stream = Destination("stream", "default", "events", ["events"], {})
        job = StreamMaintenance(meta, objects, lambda: [stream], "n1")
        runs = {"failed": 0, "ok": 0}
        failed_thrice, recovered = asyncio.Event(), asyncio.Event()

        async def counted() -> None:
            try:
                await job.run_once()
            except Exception:
                runs["failed"] += 1
                if runs["failed"] == 3:
                    failed_thrice.set()
                raise
            runs["ok"] += 1
            recovered.set()

        task = PeriodicTask("stream-maintenance", 0.05, counted, faults=STORE_FAILURES)
        s3.break_()
        task.start()
        await asyncio.wait_for(failed_thrice.wait(), 60)
        s3.repair()
        await asyncio.wait_for(recovered.wait(), 60)
    finally:
        if task is not None:
            await task.stop()
        await batcher.close()
        await objects.close()
        await meta.close()
        s3.close()
    told = [r for r in caplog.records if r.name == "flowmq_core.periodic"]
    assert [r.levelname for r in told] == ["WARNING", "INFO"], [r.getMessage() for r in told]
    assert "storage unavailable" in told[0].getMessage() and told[0].exc_info is None
    assert "available again" in told[1].getMessage()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
