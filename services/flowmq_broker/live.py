"""Live figures and reads for the operations surface (admin API, ``flowmq`` CLI).

Read-only over the meta store's keys, which every broker shares, so any broker answers for
the whole cluster: a stream partition's end offset is its high watermark
(``STREAM_HWM``), its start the first index entry, its size ``STREAM_BYTES`` and its
segments the index entries (chunks) in ``STREAM_INDEX``; a queue's ready and unacknowledged
counts are its ``QUEUE_STATS`` counters.  Consumer counts are this broker's own (a queue's
consumers on other brokers are theirs to tell).  ``read_stream`` is the operator's fetch:
records decoded, nothing committed.
"""

from __future__ import annotations

from typing import Any

from flowmq_kas3 import index
from flowmq_kas3.records import Record, decode_batch, iter_batches
from flowmq_kas3.store import StreamStore
from flowmq_meta import Transaction, decode_int
from flowmq_queue import QueueEngine
from flowmq_queue import index as queue_index

# Index entries counted per partition: a partition past it reports this many (at least).
MAX_SEGMENTS_COUNTED = 100_000
# Bytes fetched per round of a stream read; a read of ``limit`` records may take several.
READ_FETCH_BYTES = 1024 * 1024
READ_MAX_ROUNDS = 16


def _partition_counts(tr: Transaction, ns: str, stream: str, partitions: int) -> dict[str, Any]:
    starts, ends, sizes, segments = [], [], [], []
    for partition in range(partitions):
        p = (ns, stream, partition)
        hwm = index.read_hwm(tr, p)
        begin, end = index.partition_range(p)
        entries = tr.get_range(begin, end, limit=MAX_SEGMENTS_COUNTED)
        starts.append(index.decode_entry(*entries[0]).base_offset if entries else hwm)
        ends.append(hwm)
        sizes.append(decode_int(tr.get(index.bytes_key(p))))
        segments.append(len(entries))
    return {
        "start_offsets": starts,
        "end_offsets": ends,
        "bytes": sum(sizes),
        "segments": sum(segments),
        "messages": sum(e - s for s, e in zip(starts, ends, strict=True)),
    }


class LiveViews:
    def __init__(self, streams: StreamStore, queues: QueueEngine) -> None:
        self.streams = streams
        self.queues = queues
        self.meta = streams.meta

    async def stream_counts(self, ns: str, stream: str, partitions: int) -> dict[str, Any]:
        return await self.meta.transact(lambda tr: _partition_counts(tr, ns, stream, partitions))

    async def end_offsets(self, ns: str, stream: str, partitions: int) -> list[int]:
        def txn(tr: Transaction) -> list[int]:
            return [index.read_hwm(tr, (ns, stream, p)) for p in range(partitions)]

        return await self.meta.transact(txn)

    async def queue_counts(self, ns: str, queue: str) -> dict[str, Any]:
        stats = await self.queues.stats(ns, queue)
        total, inflight = stats[queue_index.COUNT], stats[queue_index.INFLIGHT]
        return {
            "ready": max(0, total - inflight),
            "unacked": max(0, inflight),
            "consumers": self.queues.consumer_count(ns, queue),
            "bytes": max(0, stats[queue_index.BYTES]),
        }

    async def read_stream(
        self,
        ns: str,
        stream: str,
        partition: int,
        offset: int | None,
        limit: int,
        wait_ms: int = 0,
    ) -> dict[str, Any]:
        """Up to ``limit`` records of one partition from ``offset`` (None: the log start),
        waiting up to ``wait_ms`` for the first one if there is none yet.  Raises
        ``OffsetOutOfRange`` outside [log start, high watermark]."""
        store = self.streams
        if offset is None:
            offset = await store.log_start_offset(ns, stream, partition)
        records: list[Record] = []
        position = offset
        result = await store.fetch(ns, stream, partition, position, READ_FETCH_BYTES)
        if not result.records and wait_ms > 0:
            await store.wait_for_data(ns, stream, partition, position, wait_ms / 1000)
            result = await store.fetch(ns, stream, partition, position, READ_FETCH_BYTES)
        for _ in range(READ_MAX_ROUNDS):
            if not result.records:
                break
            position = _decode_from(result.records, position, limit - len(records), records)
            if len(records) >= limit or position >= result.high_watermark:
                break
            result = await store.fetch(ns, stream, partition, position, READ_FETCH_BYTES)
        return {
            "records": records,
            "next_offset": position,
            "high_watermark": result.high_watermark,
            "log_start_offset": result.log_start_offset,
        }


def _decode_from(buf: bytearray, offset: int, room: int, out: list[Record]) -> int:
    """Append the records of ``buf``'s batches at or past ``offset`` to ``out`` (at most
    ``room``); returns the offset to read next."""
    view = memoryview(buf)
    position = offset
    for info in iter_batches(buf):
        batch = view[info.position : info.position + info.size]
        base = int.from_bytes(batch[:8], "big", signed=True)
        batch_end = base + info.offset_count
        if batch_end <= position:
            continue
        for record in decode_batch(batch):
            if record.offset < position:
                continue
            if room <= 0:
                return position
            out.append(record)
            room -= 1
            position = record.offset + 1
        position = max(position, batch_end)
    return position
