"""MQTT session state: what survives a reconnect with clean start = 0.

A session holds the client's subscriptions, the QoS 1/2 messages in flight towards it, the
messages queued while it is offline or its window is full, and the QoS 2 packet ids it has
sent us and not yet released.  Sessions live in the broker that holds the connection; their
subscriptions are also written to the meta store so that they outlive the process (offline
queues become durable Queues when Queue storage exists).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
from collections.abc import Iterable
from typing import Any, Protocol

from flowmq_broker.mqtt.metrics import mqtt_metrics
from flowmq_core.message import Message
from flowmq_core.message_codec import decode_message, encode_message
from flowmq_wire.mqtt.packets import SubscriptionOptions

# Session expiry "never" (v5 0xFFFFFFFF; what 3.1.1 clean session = 0 means).
NEVER_EXPIRES = 0xFFFFFFFF
# Bound on messages kept for one session beyond its in-flight window: past it the oldest
# QoS 0 are dropped first, then the oldest QoS 1/2 (counted as dropped).
MAX_QUEUED = 10_000


@dataclasses.dataclass(slots=True)
class Subscription:
    topic_filter: str
    options: SubscriptionOptions
    identifier: int | None = None
    shared_group: str | None = None

    @property
    def subscribed_filter(self) -> str:
        """The filter as the client gave it: ``$share/<group>/<filter>`` for a shared one.
        It keys the session's subscriptions, names a shared group and is the route filter."""
        if self.shared_group is None:
            return self.topic_filter
        return f"$share/{self.shared_group}/{self.topic_filter}"


@dataclasses.dataclass(slots=True)
class Outgoing:
    """A QoS 1/2 PUBLISH sent and not yet acknowledged (``released``: PUBREC seen)."""

    message: Message
    qos: int
    retain: bool
    properties: dict[str, Any]
    released: bool = False


# A plain QoS 1 message in flight as it came in a run (``MqttDelivery.publish_run1``): the
# decoder's ``[topic, payload, packet, packet id]`` with ``(origin, timestamp_ms)`` of its run
# appended.  Most are acknowledged before anything needs more of them than their payload's
# size: an ``Outgoing`` is made of one only then (``Session.outgoing``: a resend, a takeover).
RunItem = list


class SessionConnection(Protocol):
    """What the broker-wide MQTT state and the delivery module (``flowmq_broker.mqtt.delivery``)
    use of a client's connection (an ``MqttConnection``, which they must not import: it sits
    above them)."""

    transport: asyncio.Transport | None
    session: Session | None
    level: int  # the client's protocol level: 4 (3.1.1) or 5
    m: Any  # its namespace's metrics (flowmq_broker.mqtt.metrics)
    # What the client told us in CONNECT (v5): its receive maximum, maximum packet size (None:
    # the protocol's) and topic alias maximum; and the aliases we gave it, topic -> alias.
    client_receive_maximum: int
    client_max_packet: int | None
    client_alias_maximum: int
    out_aliases: dict[str, int]
    # Output written and not yet flushed: its size, and whether the socket buffer is over its
    # high-water mark (pause_writing); PUBLISH packets and payload bytes to count at flush.
    out_bytes: int
    writing_paused: bool
    out_count: int
    out_payload: int

    def write(self, data: bytes) -> None:
        """Add ``data`` to what goes out at the next flush."""

    def backlog(self) -> int:
        """Bytes written but not yet taken by the client."""
        ...

    def take_over(self) -> None:
        """Another connection with the same client id arrived: hand the session over."""

    def flush(self) -> None:
        """Write out what was sent since the last flush."""

    def send_queued(self) -> None:
        """Send what waits in the session's queue, as far as the client's window allows."""

    def shutdown(self) -> None:
        """The broker is stopping: disconnect."""


class Session:
    def __init__(self, client_id: str, namespace: str) -> None:
        self.client_id = client_id
        self.namespace = namespace
        # The user it belongs to (None: anonymous): its subscriptions are that user's grants.
        self.username: str | None = None
        self.subscriptions: dict[str, Subscription] = {}
        self.expiry_interval = 0
        self.connection: SessionConnection | None = None
        # QoS 1/2 messages in flight, by packet id: read them with ``outgoing``.
        self.inflight: dict[int, Outgoing | RunItem] = {}
        self.inflight_bytes = 0  # payload bytes of ``inflight`` (add_inflight, remove_inflight)
        self.queue: collections.deque[tuple[Message, int, bool, dict[str, Any]]] = (
            collections.deque()
        )
        self.incoming_qos2: set[int] = set()
        self.unsent: collections.deque[int] = collections.deque()  # in flight, not yet resent
        self._plain: list[Subscription] = []
        self._plain_key = -1
        self._subs_version = 0
        self._next_packet_id = 1
        self.expiry_handle: Any = None
        self.will_handle: Any = None  # a will waiting out its delay interval
        self.pending_will: Any = None  # …and the function that publishes it
        # Messages may be waiting in the session's offline store (flowmq_broker.mqtt.offline):
        # set when storing, and for a session restored from elsewhere (not known).
        self.stored = False
        # Connected, with its stored backlog still being read (offline.py ``start_drain``):
        # its new QoS 1/2 messages are stored behind the backlog, not sent from memory.
        self.draining = False
        self.pending_stores: set[Any] = set()  # stores not yet durable
        # The offline store's queue name, made at the first store (offline.py): one string
        # for all of them, not one per store waiting for its flush.
        self.store_name: str | None = None
        # Taken from another node's record (adopted, ``MqttServer.restore_sessions``): a kick
        # from a node that resumed it on that record as it was before is stale, not obeyed.
        self.adopted = False

    @property
    def online(self) -> bool:
        return self.connection is not None

    def plain_subscriptions(self) -> list[Subscription]:
        """The non-shared subscriptions, recomputed only when the subscriptions changed."""
        if self._plain_key != self._subs_version:
            self._plain = [s for s in self.subscriptions.values() if s.shared_group is None]
            self._plain_key = self._subs_version
        return self._plain

    def subscriptions_changed(self) -> None:
        """Call after every change to ``subscriptions``."""
        self._subs_version += 1

    def add_inflight(self, packet_id: int, out: Outgoing) -> None:
        self.inflight[packet_id] = out
        self.inflight_bytes += len(out.message.payload)

    def add_run_inflight(self, items: list[RunItem], window: int, max_bytes: int) -> list[int]:
        """Put the first ``items`` of a run in flight, as many as fit in ``window`` messages
        and ``max_bytes`` payload bytes, each under the packet id ``allocate_packet_id``
        would give it; those packet ids."""
        inflight = self.inflight
        used = self.inflight_bytes
        packet_id = self._next_packet_id
        ids: list[int] = []
        for item in items:
            if len(inflight) >= window or used >= max_bytes:
                break
            while packet_id in inflight:  # the window is below 65535: one is free
                packet_id = packet_id % 65535 + 1
            inflight[packet_id] = item
            ids.append(packet_id)
            used += len(item[1])
            packet_id = packet_id % 65535 + 1
        self._next_packet_id = packet_id
        self.inflight_bytes = used
        return ids

    def outgoing(self, packet_id: int) -> Outgoing | None:
        """The message in flight under ``packet_id`` (None: none)."""
        out = self.inflight.get(packet_id)
        if isinstance(out, list):
            out = self.inflight[packet_id] = _run_outgoing(out)
        return out

    def outgoings(self) -> list[tuple[int, Outgoing]]:
        """Every message in flight with its packet id, in the order they were sent."""
        outgoing = self.outgoing
        return [(packet_id, outgoing(packet_id)) for packet_id in list(self.inflight)]  # type: ignore[misc]

    def remove_inflight(self, packet_id: int) -> Outgoing | RunItem | None:
        """Forget the message in flight under ``packet_id``; what it was (None: none)."""
        out = self.inflight.pop(packet_id, None)
        if out is None:
            return None
        self.inflight_bytes -= len(out[1]) if isinstance(out, list) else len(out.message.payload)
        return out

    def remove_inflight_run(self, packet_ids: Iterable[int]) -> tuple[int, list[Outgoing]]:
        """``remove_inflight`` of each of ``packet_ids`` (a run of PUBACKs) in one pass; how
        many were in flight, and those of them that were ``Outgoing`` records (not a run's
        items as they came), whose properties may ask for more on release."""
        inflight = self.inflight
        removed = freed = 0
        records: list[Outgoing] = []
        for packet_id in packet_ids:
            out = inflight.pop(packet_id, None)
            if out is not None:
                removed += 1
                if isinstance(out, list):
                    freed += len(out[1])
                else:
                    freed += len(out.message.payload)
                    records.append(out)
        self.inflight_bytes -= freed
        return removed, records

    def allocate_packet_id(self) -> int:
        """The next packet id not in flight (1..65535, wrapping)."""
        for _ in range(65535):
            packet_id = self._next_packet_id
            self._next_packet_id = packet_id % 65535 + 1
            if packet_id not in self.inflight:
                return packet_id
        raise RuntimeError("no free packet identifier")  # window is far below 65535

    def persistent(self) -> bool:
        return self.expiry_interval > 0

    @classmethod
    def from_record(cls, record: dict[str, Any], namespace: str) -> Session:
        """The session a stored record describes: offline, its subscriptions not yet bound."""
        session = cls(record["client_id"], namespace)
        session.expiry_interval = record["expiry_interval"]
        session.username = record.get("user")
        for item in record["subscriptions"]:
            sub = Subscription(
                item["filter"],
                SubscriptionOptions(*item["options"]),
                item.get("identifier"),
                item.get("shared_group"),
            )
            session.subscriptions[sub.subscribed_filter] = sub
        session.subscriptions_changed()
        session.stored = True
        return session

    def export_state(self) -> dict[str, Any]:
        """Everything a session takeover on another node needs (DESIGN.md §6): the record,
        the messages in flight with their packet ids, the queue, the QoS 2 ids received."""
        return {
            "record": self.to_record(),
            "inflight": [
                [packet_id, encode_message(o.message), o.qos, o.retain, o.properties, o.released]
                for packet_id, o in self.outgoings()
            ],
            "queue": [
                [encode_message(m), qos, retain, extra] for m, qos, retain, extra in self.queue
            ],
            "incoming_qos2": sorted(self.incoming_qos2),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any], namespace: str) -> Session:
        session = cls.from_record(state["record"], namespace)
        for packet_id, data, qos, retain, properties, released in state["inflight"]:
            session.add_inflight(
                packet_id, Outgoing(decode_message(data), qos, retain, properties, released)
            )
        for data, qos, retain, extra in state["queue"]:
            session.queue.append((decode_message(data), qos, retain, extra))
        session.incoming_qos2 = set(state["incoming_qos2"])
        return session

    def to_record(self) -> dict[str, Any]:
        return {
            "client_id": self.client_id,
            "user": self.username,
            "expiry_interval": self.expiry_interval,
            "subscriptions": [
                {
                    "filter": sub.topic_filter,
                    "options": list(sub.options),
                    "identifier": sub.identifier,
                    "shared_group": sub.shared_group,
                }
                for sub in self.subscriptions.values()
            ],
        }


_PLAIN_EXTRA: dict[str, Any] = {"subscription_identifier": []}


def plain_message(
    topic: str, payload: bytes, qos: int, timestamp_ms: int, extra: dict[str, Any]
) -> Message:
    """A plain MQTT message (no retain, no properties) as routed: ``extra`` is its
    read-only properties (its publisher's client id, ``origin``)."""
    # Positional: keyword construction of a slotted dataclass is measurably slower here.
    return Message(topic, payload, qos, False, [], timestamp_ms, None, None, None, "mqtt", extra)


def _run_outgoing(item: RunItem) -> Outgoing:
    topic, payload, _, _, (origin, timestamp_ms) = item
    message = plain_message(topic, payload, 1, timestamp_ms, {"origin": origin})
    return Outgoing(message, 1, False, _PLAIN_EXTRA)


def delivery_extra(identifiers: list[int], shared: str | None) -> dict[str, Any]:
    """What a queued or in-flight message carries besides itself (read only: the common
    one, no identifiers and no group, is shared)."""
    if shared is None:
        if not identifiers:
            return _PLAIN_EXTRA
        return {"subscription_identifier": identifiers}
    return {"subscription_identifier": identifiers, "shared": shared}


def session_enqueue(
    session: Session,
    message: Message,
    qos: int,
    retain: bool,
    identifiers: list[int],
    shared: str | None = None,
) -> None:
    if len(session.queue) >= MAX_QUEUED:
        session.queue.popleft()
        mqtt_metrics(session.namespace).dropped.inc()
    session.queue.append((message, qos, retain, delivery_extra(identifiers, shared)))
