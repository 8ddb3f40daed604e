"""The value of a queue index entry: a *run* of messages stored in one object.

One entry describes up to ``MAX_RUN`` messages (what one flush wrote for one queue, or what
one claim leased to one consumer), so claims, acks and redeliveries cost meta-store writes
per run, not per message.  An entry is keyed by the sequence number of its first message
(``(ns, queue, shard, seq)``); every entry holds exactly one reference on its object.

Per message: seq, byte offset and size in the object, attempt (deliveries that failed so
far), expiry deadline in epoch ms (0: none).  In-flight entries also carry the lease:
``holder`` (the broker process), ``consumer`` (its consumer tag), ``claim_id`` (unique per
claim: an ack applies only to the claim it was delivered from) and ``deadline_ms``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import fdb.tuple as fdbtuple

VERSION = 1
MAX_RUN = 1000  # 26 bytes a message: entries stay far below the 100 KB value limit
_PREFIX = struct.Struct("<BHH")  # version, count, header length


@dataclass(slots=True)
class Run:
    object_key: str
    seqs: list[int]
    starts: list[int]
    sizes: list[int]
    attempts: list[int]
    expires: list[int]
    holder: str = ""
    consumer: str = ""
    claim_id: str = ""
    deadline_ms: int = 0
    reason: str = ""

    def __len__(self) -> int:
        return len(self.seqs)

    @property
    def first(self) -> int:
        return self.seqs[0]

    @property
    def total_size(self) -> int:
        return sum(self.sizes)

    def pick(self, indices: list[int] | range) -> Run:
        """A run of the messages at ``indices`` (lease fields kept)."""
        return Run(
            self.object_key,
            [self.seqs[i] for i in indices],
            [self.starts[i] for i in indices],
            [self.sizes[i] for i in indices],
            [self.attempts[i] for i in indices],
            [self.expires[i] for i in indices],
            self.holder,
            self.consumer,
            self.claim_id,
            self.deadline_ms,
            self.reason,
        )

    def slice(self, start: int, stop: int | None = None) -> Run:
        return self.pick(range(start, len(self.seqs) if stop is None else stop))

    def as_ready(self) -> Run:
        return Run(self.object_key, self.seqs, self.starts, self.sizes, self.attempts, self.expires)

    def leased(self, holder: str, consumer: str, claim_id: str, deadline_ms: int) -> Run:
        return Run(
            self.object_key,
            self.seqs,
            self.starts,
            self.sizes,
            self.attempts,
            self.expires,
            holder,
            consumer,
            claim_id,
            deadline_ms,
        )

    def encode(self) -> bytes:
        n = len(self.seqs)
        header = fdbtuple.pack(
            (
                self.object_key,
                self.holder,
                self.consumer,
                self.claim_id,
                self.deadline_ms,
                self.reason,
            )
        )
        return b"".join(
            (
                _PREFIX.pack(VERSION, n, len(header)),
                header,
                struct.pack(f"<{n}q", *self.seqs),
                struct.pack(f"<{n}I", *self.starts),
                struct.pack(f"<{n}I", *self.sizes),
                struct.pack(f"<{n}H", *(min(a, 0xFFFF) for a in self.attempts)),
                struct.pack(f"<{n}q", *self.expires),
            )
        )


def decode_run(raw: bytes) -> Run:
    version, n, hlen = _PREFIX.unpack_from(raw)
    if version != VERSION:
        raise ValueError(f"unknown queue entry version {version}")
    pos = _PREFIX.size
    object_key, holder, consumer, claim_id, deadline, reason = fdbtuple.unpack(
        raw[pos : pos + hlen]
    )
    pos += hlen
    seqs = list(struct.unpack_from(f"<{n}q", raw, pos))
    pos += 8 * n
    starts = list(struct.unpack_from(f"<{n}I", raw, pos))
    pos += 4 * n
    sizes = list(struct.unpack_from(f"<{n}I", raw, pos))
    pos += 4 * n
    attempts = list(struct.unpack_from(f"<{n}H", raw, pos))
    pos += 2 * n
    expires = list(struct.unpack_from(f"<{n}q", raw, pos))
    return Run(
        object_key,
        seqs,
        starts,
        sizes,
        attempts,
        expires,
        holder,
        consumer,
        claim_id,
        deadline,
        reason,
    )


def lease_of(raw: bytes) -> tuple[str, str]:
    """(holder, claim_id) of an encoded in-flight entry, without decoding the arrays."""
    _, _, hlen = _PREFIX.unpack_from(raw)
    _, holder, _, claim_id, _, _ = fdbtuple.unpack(raw[_PREFIX.size : _PREFIX.size + hlen])
    return holder, claim_id
