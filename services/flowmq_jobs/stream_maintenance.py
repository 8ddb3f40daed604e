"""Stream upkeep: retention, compaction, removal of deleted streams' data, object GC.

Every step is a meta-store transaction that is safe to run from several brokers at once
(retention and compaction detect each other; GC claims what it deletes), so each broker
simply runs this job; there is no leader.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

from flowmq_commit.gc import collect_garbage
from flowmq_kas3.compaction import compact_partition
from flowmq_kas3.retention import RetentionPolicy, apply_retention, delete_partition
from flowmq_meta import keys
from flowmq_meta.api import MetaStore
from flowmq_meta.catalog import STREAM, Destination
from flowmq_objstore.api import ObjectStore

log = logging.getLogger(__name__)

INTERVAL_S = 30.0


def policy_of(dest: Destination) -> RetentionPolicy:
    """Kafka semantics: -1 (or absent) means unlimited."""
    ms = dest.options.get("retention_ms", -1)
    size = dest.options.get("retention_bytes", -1)
    return RetentionPolicy(
        None if ms is None or ms < 0 else ms, None if size is None or size < 0 else size
    )


@dataclasses.dataclass(eq=False)
class StreamMaintenance:
    """Retention, compaction, deleted streams' partitions and object GC, one pass at a time."""

    meta: MetaStore
    objects: ObjectStore
    destinations: Callable[[], list[Destination]]
    node_id: str

    async def run_once(self) -> None:
        streams = {(d.namespace, d.name): d for d in self.destinations() if d.type == STREAM}
        for (namespace, name), dest in streams.items():
            policy = policy_of(dest)
            for partition in range(dest.options.get("partitions", 1)):
                p = (namespace, name, partition)
                if policy.retention_ms is not None or policy.retention_bytes is not None:
                    await apply_retention(self.meta, p, policy)
                await compact_partition(self.meta, self.objects, p, node_id=self.node_id)
        for namespace, name, partition in await self._stored_partitions():
            if (namespace, name) not in streams:
                removed = await delete_partition(self.meta, (namespace, name, partition))
                log.info(
                    "removed %d chunks of deleted stream %s/%s[%d]",
                    removed,
                    namespace,
                    name,
                    partition,
                )
        await collect_garbage(self.meta, self.objects)

    async def _stored_partitions(self) -> list[tuple[str, str, int]]:
        begin, end = keys.STREAM_HWM.range()
        rows = await self.meta.transact(lambda tr: tr.get_range(begin, end))
        return [keys.STREAM_HWM.unpack(key) for key, _ in rows]
