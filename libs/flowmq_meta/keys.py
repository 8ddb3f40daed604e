"""The key schema: every subspace of the meta store, named in one place.

Keys are FoundationDB tuples (``fdb.tuple``, pure Python, no native client needed), so the
byte order of keys is the tuple order on every backend: ints sort numerically (negative before
positive), strings and bytes lexicographically, and a tuple sorts before its extensions —
which is what makes range reads such as "every chunk of partition p from offset o" work.

Each subspace is a one-element tuple prefix with a short name; the names are part of the
on-disk format, so never rename one in place.
"""

from __future__ import annotations

from typing import Any

import fdb.tuple as fdbtuple


class Subspace:
    """A tuple prefix: ``pack(*items)`` builds a key, ``unpack`` recovers the items,
    ``range(*items)`` gives ``(begin, end)`` covering every key that extends ``items``."""

    __slots__ = ("prefix", "raw")

    def __init__(self, prefix: tuple[Any, ...], raw: bytes = b"") -> None:
        self.prefix = prefix
        self.raw = raw + fdbtuple.pack(prefix)

    def pack(self, *items: Any) -> bytes:
        return fdbtuple.pack(items, prefix=self.raw)

    def unpack(self, key: bytes) -> tuple[Any, ...]:
        if not self.contains(key):
            raise ValueError(f"key {key!r} is not in subspace {self.prefix!r}")
        return fdbtuple.unpack(key, prefix_len=len(self.raw))

    def range(self, *items: Any) -> tuple[bytes, bytes]:
        """Keys strictly extending ``items`` (the key ``pack(*items)`` itself excluded, as in
        ``fdb.tuple.range``)."""
        packed = self.pack(*items)
        return packed + b"\x00", packed + b"\xff"

    def contains(self, key: bytes) -> bool:
        return key.startswith(self.raw)

    def subspace(self, *items: Any) -> Subspace:
        """A nested subspace, e.g. one stream's partitions."""
        return Subspace(items, raw=self.raw)

    def __repr__(self) -> str:
        return f"Subspace({self.prefix!r})"


# Global metadata version: 8-byte little-endian int (encode_int), bumped by every metadata
# change in the same transaction as the change (see changelog.py).
META_VERSION: bytes = fdbtuple.pack(("meta_version",))

# (version,) -> JSON {"kind", "payload", "version"}: the change log anti-entropy replays.
CHANGELOG = Subspace(("changelog",))

# (ns,) -> namespace settings (JSON).
NAMESPACES = Subspace(("ns",))

# (ns, name) -> destination definition (JSON: type, options).
DESTINATIONS = Subspace(("dest",))

# (ns, "canonical", canonical topic) and (ns, "kafka", name with '.' folded to '_') -> the
# destination name holding it: makes names unique after mapping (DESIGN.md §3 collisions).
DESTINATION_NAMES = Subspace(("dest_name",))

# Subscription routes (DESIGN.md §4: filter -> node).  (node, ns, filter) -> b"": the node
# has at least one local subscriber on ``filter`` (``$share/<group>/<filter>`` for a shared
# group).  Written only by that node, cleared by a survivor when it dies.
ROUTES = Subspace(("route",))

# (node,) -> JSON {"token", "seq"}: the version of the node's routes.  ``token`` is new at
# every start of the node, ``seq`` counts its route changes: peers compare it with what they
# applied (anti-entropy) and clear a dead node's routes only if its token is still the same.
ROUTE_VERSIONS = Subspace(("route_v",))

# (ns, stream, partition, base_offset) -> chunk location (object key, byte range, record
# count, max timestamp).  base_offset is an int, so a reverse range read from an offset finds
# the chunk containing it.
STREAM_INDEX = Subspace(("s_idx",))

# (ns, stream, partition) -> next offset (high watermark), 8-byte int; watched by long polls.
STREAM_HWM = Subspace(("s_hwm",))

# (ns, group, stream, partition) -> committed offset + metadata of a consumer group.
GROUP_OFFSETS = Subspace(("g_off",))

# (ns, group) -> 8-byte int: the group's latest generation, stored by its coordinator before
# the members learn it; an OffsetCommit of an older generation is refused in its write
# transaction (group_offsets.py), so a deposed coordinator's delayed write cannot land.
GROUP_GENERATIONS = Subspace(("g_gen",))

# (ns, queue, shard, seq) -> body location of a ready message; sharded so appends do not all
# hit one key range.
QUEUE_READY = Subspace(("q_ready",))

# (ns, queue, shard, seq) -> lease (consumer, deadline, attempt) of a claimed message.
QUEUE_INFLIGHT = Subspace(("q_lease",))

# (ns, queue, seq) -> dead-lettered message (location, reason, attempts).
QUEUE_DEAD = Subspace(("q_dead",))

# (ns, topic) -> retained message (MQTT), small enough to inline.
RETAINED = Subspace(("retained",))

# (ns, client_id) -> persistent session state (subscriptions, expiry).
SESSIONS = Subspace(("session",))

# (name,) -> user record (password hash, attributes).
USERS = Subspace(("user",))

# (rule id,) -> JSON rule {"id", "principal", "namespace", "resource", "action", "effect"}
# (flowmq_meta.acls; the id is a hash of the rule's content, so a rule exists once).
ACLS = Subspace(("acl",))

# JSON {"version", "count"} of the ACL rules: bumped by every ACL change in the same
# transaction, so a broker reloads its rules only when this moved (one small read).
ACL_VERSION: bytes = fdbtuple.pack(("acl_version",))

# (object key,) -> 8-byte reference count of a shared segment object (atomic add).
OBJECT_REFS = Subspace(("obj_ref",))

# (object key,) -> reason/time: objects whose last reference is gone, deleted by the GC job
# (a durable list, so a crash between unreferencing and deleting leaves no orphan).
OBJECTS_TO_DELETE = Subspace(("obj_del",))

# (node_id,) -> node record (address, ports, last seen) for membership bootstrap.
NODES = Subspace(("node",))

# (name,) -> cluster-wide setting (JSON).
SETTINGS = Subspace(("setting",))

# Added by flowmq_kas3: (ns, stream, partition) -> 8-byte sum of the byte sizes of the
# partition's index entries, kept with atomic adds at append and subtracted by retention, so
# retention by bytes needs no scan of the index.
STREAM_BYTES = Subspace(("s_bytes",))

# Added by the Kafka adapter: ("next_id",) -> 8-byte next idempotent producer id to hand out;
# ("seq", ns, stream, partition, producer_id) -> tuple (epoch, (first seq, last seq, base
# offset) of the producer's last batches), written in the flush transaction of each batch so
# duplicate detection survives restarts and works on any broker.
KAFKA_PRODUCERS = Subspace(("k_prod",))

ALL_SUBSPACES: dict[str, Subspace] = {
    "CHANGELOG": CHANGELOG,
    "NAMESPACES": NAMESPACES,
    "DESTINATIONS": DESTINATIONS,
    "DESTINATION_NAMES": DESTINATION_NAMES,
    "ROUTES": ROUTES,
    "ROUTE_VERSIONS": ROUTE_VERSIONS,
    "STREAM_INDEX": STREAM_INDEX,
    "STREAM_HWM": STREAM_HWM,
    "GROUP_OFFSETS": GROUP_OFFSETS,
    "GROUP_GENERATIONS": GROUP_GENERATIONS,
    "QUEUE_READY": QUEUE_READY,
    "QUEUE_INFLIGHT": QUEUE_INFLIGHT,
    "QUEUE_DEAD": QUEUE_DEAD,
    "RETAINED": RETAINED,
    "SESSIONS": SESSIONS,
    "USERS": USERS,
    "ACLS": ACLS,
    "OBJECT_REFS": OBJECT_REFS,
    "OBJECTS_TO_DELETE": OBJECTS_TO_DELETE,
    "NODES": NODES,
    "SETTINGS": SETTINGS,
    "STREAM_BYTES": STREAM_BYTES,
    "KAFKA_PRODUCERS": KAFKA_PRODUCERS,
}

# Added by flowmq_queue: (ns, queue, counter) -> 8-byte int kept with atomic adds, so no
# per-message read is needed.  Counters: "seq" (next sequence number; requeues bump it too, so
# a watch on it wakes idle consumers on other brokers), "count" (messages stored: ready, in
# flight or being dead-lettered), "bytes" (their body bytes: max_size_mb), "inflight" (leased).
QUEUE_STATS = Subspace(("q_stats",))

# Added by the AMQP adapter: (ns, exchange) -> JSON {"type", "durable", "auto_delete",
# "internal", "arguments"} of a declared exchange: its type decides how a publish to it maps
# onto canonical topics (DESIGN.md section 3), so every broker must know it.
AMQP_EXCHANGES = Subspace(("amqp_x",))

ALL_SUBSPACES.update({"QUEUE_STATS": QUEUE_STATS, "AMQP_EXCHANGES": AMQP_EXCHANGES})

# Added by the admin API's scoped tokens (flowmq_meta.tokens): (token id,) -> JSON {"id",
# "namespace", "role", "description", "created_at_ms", "sha256"}: a namespace-scoped admin
# token, kept as the SHA-256 of its secret only.
ADMIN_TOKENS = Subspace(("admin_token",))

ALL_SUBSPACES.update({"ADMIN_TOKENS": ADMIN_TOKENS})
