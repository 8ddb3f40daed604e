"""Consumer groups for operators: list, describe (members, committed offsets, lag) and reset
offsets (DESIGN.md §5 Stream, §9).

Committed offsets live in the meta store (``GroupOffsetStore``), so any broker lists and
describes them; members live only in the memory of the group's coordinator, the broker with
the Kafka listener that rendezvous hashing picks for the group.  A reset rewrites committed
offsets, which a live member would overwrite with its next commit and which would move a
consumer's position under it: it is refused while the group has members, and — since only the
coordinator knows them — on a broker that does not coordinate the group.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from flowmq_core.errors import FlowMQError, NotFound
from flowmq_core.message import now_ms
from flowmq_core.periodic import PeriodicTask
from flowmq_kas3.store import StreamStore
from flowmq_meta.api import MetaStore
from flowmq_meta.catalog import STREAM, Catalog
from flowmq_meta.group_offsets import CommittedOffset, GroupOffsetStore
from flowmq_metrics import kafka_consumer_group_lag

if TYPE_CHECKING:
    from flowmq_broker.kafka.server import KafkaServer

EARLIEST = "earliest"
LATEST = "latest"
# kafka_consumer_group_lag: how often the coordinator re-reads its groups' lag, and how many
# groups one broker exports at most (a series per group: Prometheus cost stays bounded).
LAG_EXPORT_S = 15.0
MAX_EXPORTED_GROUPS = 1000


class GroupConflict(FlowMQError):
    """The reset would race a live consumer of the group (HTTP 409)."""

    code = "group_active"


class NotCoordinator(FlowMQError):
    """This broker cannot see the group's members (HTTP 409)."""

    code = "not_coordinator"


class GroupAdmin:
    def __init__(
        self,
        meta: MetaStore,
        catalog: Catalog,
        streams: StreamStore,
        kafka: Callable[[], KafkaServer | None],
        nodes: Callable[[], Awaitable[list[dict[str, Any]]]],
    ) -> None:
        self.catalog = catalog
        self.streams = streams
        self._kafka = kafka
        self._nodes = nodes
        self._own_offsets = GroupOffsetStore(meta)
        self._lag_export = PeriodicTask("consumer-lag-export", LAG_EXPORT_S, self.export_lag)
        self._exported: set[tuple[str, str]] = set()

    @property
    def offsets(self) -> GroupOffsetStore:
        kafka = self._kafka()
        return kafka.offsets if kafka is not None else self._own_offsets

    def start(self) -> None:
        self._lag_export.start()

    async def close(self) -> None:
        await self._lag_export.stop()
        await self._own_offsets.close()

    async def export_lag(self) -> None:
        """Set ``kafka_consumer_group_lag`` for the groups with committed offsets that this
        broker coordinates — members or not: a group whose consumers are down is the one
        whose lag grows — and drop the series of groups it no longer exports."""
        kafka = self._kafka()
        exported: set[tuple[str, str]] = set()
        if kafka is not None:
            for namespace in await self.catalog.list_namespaces():
                ns = namespace["name"]
                for group in await self.offsets.groups(ns):
                    if len(exported) >= MAX_EXPORTED_GROUPS:
                        break
                    if not kafka.owns_group(group):
                        continue
                    try:
                        lag = (await self.describe(ns, group))["lag"]
                    except NotFound:  # its offsets went away meanwhile
                        continue
                    kafka_consumer_group_lag.labels(ns, group).set(lag)
                    exported.add((ns, group))
        for gone in self._exported - exported:
            kafka_consumer_group_lag.remove(*gone)
        self._exported = exported

    # --- views ------------------------------------------------------------------------------

    def _coordination(self, ns: str, group: str) -> dict[str, Any]:
        """Who coordinates ``group`` and, if this broker does, its state and members."""
        kafka = self._kafka()
        if kafka is None:
            return {"coordinator": None, "state": None, "members": None}
        coordinator = kafka.cluster.coordinator(group).name
        if not kafka.owns_group(group):
            return {"coordinator": coordinator, "state": None, "members": None}
        live = kafka.live_group(ns, group)
        if live is None:
            return {"coordinator": coordinator, "state": "Empty", "members": []}
        members = [
            {
                "member_id": m.member_id,
                "group_instance_id": m.group_instance_id,
                "client_id": m.client_id,
                "client_host": m.client_host,
            }
            for m in live.members.values()
        ]
        return {"coordinator": coordinator, "state": live.state.value, "members": members}

    async def list(self, ns: str) -> list[dict[str, Any]]:
        names = set(await self.offsets.groups(ns))
        kafka = self._kafka()
        if kafka is not None:
            names.update(kafka.live_group_ids(ns))
        out = []
        for group in sorted(names):
            info = self._coordination(ns, group)
            members = info["members"]
            out.append(
                {
                    "group": group,
                    "namespace": ns,
                    "coordinator": info["coordinator"],
                    "state": info["state"],
                    "members": None if members is None else len(members),
                }
            )
        return out

    async def describe(self, ns: str, group: str) -> dict[str, Any]:
        committed = await self.offsets.fetch(ns, group)
        info = self._coordination(ns, group)
        if not committed and not info["members"]:
            kafka = self._kafka()
            if kafka is None or kafka.live_group(ns, group) is None:
                raise NotFound(f"consumer group {group!r} has no members and no offsets")
        by_stream: dict[str, list[tuple[int, CommittedOffset]]] = {}
        for (stream, partition), offset in committed.items():
            by_stream.setdefault(stream, []).append((partition, offset))
        rows = []
        for stream in sorted(by_stream):
            parts = sorted(by_stream[stream])
            ends = await self._end_offsets(ns, stream, [p for p, _ in parts])
            for (partition, c), end in zip(parts, ends, strict=True):
                rows.append(
                    {
                        "stream": stream,
                        "partition": partition,
                        "committed_offset": c.offset,
                        "end_offset": end,
                        "lag": max(0, end - c.offset) if c.offset >= 0 else end,
                        "metadata": c.metadata,
                        "commit_timestamp_ms": c.commit_timestamp_ms,
                    }
                )
        return {
            "group": group,
            "namespace": ns,
            **info,
            "offsets": rows,
            "lag": sum(row["lag"] for row in rows),
        }

    async def _end_offsets(self, ns: str, stream: str, partitions: list[int]) -> list[int]:
        out = []
        for partition in partitions:
            out.append(await self.streams.high_watermark(ns, stream, partition))
        return out

    # --- reset ------------------------------------------------------------------------------

    async def _check_idle(self, ns: str, group: str) -> None:
        kafka = self._kafka()
        if kafka is None:
            kafka_nodes = [
                n["node_id"]
                for n in await self._nodes()
                if n.get("status") == "up" and "kafka" in n.get("roles", [])
            ]
            if kafka_nodes:
                raise NotCoordinator(
                    f"this broker has no Kafka listener, so it cannot see the members of "
                    f"group {group!r}; reset its offsets through a broker that has one "
                    f"({', '.join(sorted(kafka_nodes))})",
                    details={"kafka_nodes": sorted(kafka_nodes)},
                )
            return
        if not kafka.owns_group(group):
            coordinator = kafka.cluster.coordinator(group).name
            raise NotCoordinator(
                f"group {group!r} is coordinated by node {coordinator}: reset its offsets "
                f"through that broker's admin API",
                details={"coordinator": coordinator},
            )
        live = kafka.live_group(ns, group)
        if live is not None and live.members:
            raise GroupConflict(
                f"group {group!r} has {len(live.members)} live member(s); stop its consumers "
                f"before resetting its offsets",
                details={"members": sorted(live.members)},
            )

    async def reset(
        self, ns: str, group: str, stream: str, to: str | int, partition: int | None
    ) -> dict[str, Any]:
        """Set the committed offsets of ``group`` on ``stream`` (one partition or all) to the
        log start (``earliest``), the end (``latest``) or an offset (clamped into the log)."""
        dest = await self.catalog.get_destination(ns, stream, STREAM)
        partitions = int(dest.options.get("partitions", 1))
        if partition is not None and not 0 <= partition < partitions:
            raise NotFound(
                f"stream {stream!r} has no partition {partition} (it has {partitions})",
            )
        await self._check_idle(ns, group)
        chosen = [partition] if partition is not None else list(range(partitions))
        stamp = now_ms()
        entries = []
        for p in chosen:
            info = await self.streams.partition_info(ns, stream, p)
            if to == EARLIEST:
                offset = info.log_start_offset
            elif to == LATEST:
                offset = info.high_watermark
            else:
                offset = min(max(int(to), info.log_start_offset), info.high_watermark)
            entries.append((stream, p, CommittedOffset(offset, None, -1, stamp)))
        await self.offsets.commit(ns, group, entries)
        return {
            "group": group,
            "namespace": ns,
            "stream": stream,
            "offsets": [{"partition": p, "offset": c.offset} for _, p, c in entries],
        }
