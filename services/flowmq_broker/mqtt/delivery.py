"""MQTT delivery and flow control: from a routed message to bytes in subscribers' buffers.

Owns what every connection shares on the way out (DESIGN.md §11):

* the route plans: per (namespace, topic) the subscribers and other destinations a topic
  reaches, built once and dropped when the router's ``generation`` moves (any bind or
  unbind), so a run of PUBLISH packets matches each distinct topic once;
* the encodings of the message being fanned out, one per outgoing shape (protocol level,
  retain flag), shared by every subscriber of that shape; a QoS 0 PUBLISH whose outgoing
  bytes equal the incoming ones is forwarded as those bytes;
* runs of plain QoS 0 PUBLISH packets on one topic, from a local publisher's read or from a
  peer's ``fwdr`` frame (``flowmq_broker.cluster``): written to each subscriber as the bytes
  they came in, joined, one write per subscriber per run; what they bring to other nodes is
  queued per (node, publisher) and goes in one frame per read (``send_forwards``);
* runs of plain QoS 1 PUBLISH packets on one topic from a local publisher, when nothing is
  waited for (``in_memory_only``, ``publish_run1``): to each subscriber of the publisher's
  protocol level the packets as they came, joined, with packet ids of its own patched in;
* the output batching: connections written to during a read are flushed once, one
  ``transport.write`` each, when the read is done;
* flow control, told explicitly where a message came from (``source``: the publishing
  connection, the peer link, or None for the broker's own messages): a publisher is paused
  while a session it feeds has too many QoS 1/2 messages waiting, or while a link it forwards
  into is blocked, or while durable writes lag (``Backpressure``: the publisher of a
  message with a durable destination); a peer link is paused while a subscriber it feeds
  cannot keep up; a local
  QoS 0 message for a subscriber whose buffer passed ``WRITE_HIGH_WATER`` is dropped.

The connection module depends on this one, never the reverse: a connection is seen here only
through ``SessionConnection`` (``flowmq_broker.mqtt.session``).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import math
from collections.abc import Callable
from typing import Any

from flowmq_broker.backpressure import Backpressure
from flowmq_broker.mqtt.metrics import mqtt_metrics
from flowmq_broker.mqtt.offline import OfflineStore
from flowmq_broker.mqtt.session import (
    Outgoing,
    Session,
    SessionConnection,
    Subscription,
    delivery_extra,
    plain_message,
    session_enqueue,
)
from flowmq_broker.routing import Binding, DestinationType, DestinationUnavailable, Router
from flowmq_cluster.link import Link
from flowmq_core.message import Message, now_ms
from flowmq_core.topics import matches
from flowmq_wire.mqtt.codec import MqttDecoder, PreparedPublish, encode_publish

SUBSCRIPTION = "subscription"
SHARED = "shared"
# A session with more QoS 1/2 messages waiting than this pauses reading from publishers until
# it is below RESUME_BELOW: bounded memory without dropping acknowledged messages.
PAUSE_ABOVE = 1000
RESUME_BELOW = 500
# Past this many bytes waiting in the socket buffer a QoS 0 delivery is dropped (and counted):
# a subscriber that stops reading must not grow the broker's memory without bound.
WRITE_HIGH_WATER = 4 * 1024 * 1024
# Default bound on the payload bytes of QoS 1/2 messages in flight to one subscriber (config
# ``mqtt_max_inflight_bytes``); past it further messages wait in the session's queue.
DEFAULT_MAX_INFLIGHT_BYTES = 16 * 1024 * 1024
# Message properties an MQTT 5 subscriber gets as the publisher sent them.
PASSTHROUGH = ("payload_format_indicator", "response_topic", "correlation_data")

_NO_IDS: list[int] = []

# Where a message comes from, for flow control: the publishing connection, the peer link,
# or None (a will, an HTTP publish, a retained message: nothing to slow down).
Source = SessionConnection | Link | None


# A plain subscriber in a route plan: its session's key, the subscriptions of that session
# the topic matched, and that subscription if it is the only one and carries no subscription
# identifier (then a QoS 0 message needs no PUBLISH of the subscriber's own).
PlainTarget = tuple[tuple[str, str], list[Subscription], Subscription | None]


class RoutePlan:
    """Where one topic goes: the plain subscribers, every other binding with its destination
    type, and the other nodes with plain routes for it (``nodes``).  ``direct``: a plain QoS
    0 message goes by this plan alone (no Stream, Queue or shared group here or elsewhere,
    and every node in ``nodes`` takes runs: ``Forwarder.remote_nodes``)."""

    __slots__ = ("bindings", "plain", "others", "nodes", "direct")

    def __init__(
        self,
        bindings: frozenset[Binding],
        plain: list[PlainTarget],
        others: list[tuple[DestinationType, Binding]],
        nodes: list[str],
        one_at_a_time: bool,
    ) -> None:
        self.bindings = bindings
        self.plain = plain
        self.others = others
        self.nodes = nodes
        self.direct = not others and not one_at_a_time


class MqttDelivery:
    def __init__(
        self,
        router: Router,
        sessions: dict[tuple[str, str], Session],
        shared_groups: dict[tuple[str, str], list[str]],
        *,
        offline: OfflineStore | None = None,
        max_inflight_bytes: int = DEFAULT_MAX_INFLIGHT_BYTES,
        pressure: Backpressure | None = None,
    ) -> None:
        self.router = router
        # Durable writes lagging (alone: never): publishers of durable messages wait.
        self.pressure = pressure if pressure is not None else Backpressure()
        self.sessions = sessions
        self.shared_groups = shared_groups
        self.offline = offline
        self.max_inflight_bytes = max_inflight_bytes
        self.dirty: list[SessionConnection] = []
        self._flush_scheduled = False
        self.congested: set[Session] = set()
        self.paused: set[SessionConnection] = set()
        # Cross-node flow control: publishers paused while a link to a peer is blocked, and
        # inbound links paused while a subscriber they feed cannot take more.
        self.link_paused: set[SessionConnection] = set()
        self.holding: dict[Link, set[SessionConnection]] = {}
        self.links_blocked = False  # a forward just went into a blocked link (on_links_blocked)
        self._encode_cache_key: Any = None
        self._encode_cache: dict[Any, Any] = {}
        self._plans: dict[str, dict[str, RoutePlan]] = {}
        self._plans_generation = -1
        self._tally: dict[str, list[int]] = {}  # namespace -> [messages, deliveries] (count)
        # Runs of plain QoS 0 packets for other nodes, (node, publisher) -> the frame's
        # [namespace, origin, level, runs]: one frame each per read (send_forwards).
        self._outbox: dict[tuple[str, SessionConnection], list[Any]] = {}
        self._shared_turn = itertools.count()
        self.subscription_type = _SubscriptionType(self)
        self.shared_type = _SharedType(self)
        router.register_type(self.subscription_type)
        router.register_type(self.shared_type)

    # --- routing ----------------------------------------------------------------------------
    def plans(self, namespace: str) -> dict[str, RoutePlan]:
        """Topic → plan of ``namespace``, valid until the routes change: call once per run of
        PUBLISH packets, then look topics up (``plan``) in what it returned."""
        router = self.router
        if self._plans_generation != router.generation:
            self._plans_generation = router.generation
            self._plans = {}
        plans = self._plans.get(namespace)
        if plans is None:
            plans = self._plans[namespace] = {}
        return plans

    def plan(self, plans: dict[str, RoutePlan], namespace: str, topic: str) -> RoutePlan:
        """The plan of ``topic`` from ``plans`` (``plans(namespace)``), made on first use."""
        plan = plans.get(topic)
        if plan is not None:
            return plan
        router = self.router
        bindings = router.match(namespace, topic)
        plain: list[PlainTarget] = []
        others: list[tuple[DestinationType, Binding]] = []
        for binding in bindings:
            if binding.type == SUBSCRIPTION:
                key = (binding.namespace, binding.name)
                session = self.sessions.get(key)
                if session is None:
                    continue
                subs = matching_subscriptions(session, topic)
                if subs:
                    single = subs[0] if len(subs) == 1 and not subs[0].identifier else None
                    plain.append((key, subs, single))
                continue
            dest_type = router.destination_type(binding)
            if dest_type is None:
                raise DestinationUnavailable(
                    f"topic {topic!r} matches {binding.type} {binding.name!r}, "
                    f"but this broker does not serve {binding.type}s yet"
                )
            others.append((dest_type, binding))
        nodes: list[str] = []
        one_at_a_time = False
        forwarder = router.forwarder
        if forwarder is not None and forwarder.remote:
            nodes, one_at_a_time = forwarder.remote_nodes(namespace, topic)
        if len(plans) >= 10_000:  # many distinct topics: start over rather than grow
            plans.clear()
        plan = plans[topic] = RoutePlan(bindings, plain, others, nodes, one_at_a_time)
        return plan

    def dispatch(
        self, namespace: str, message: Message, source: Source
    ) -> tuple[frozenset[Binding], list[Any]]:
        """Route ``message`` (as ``Router.dispatch``, with the source told to every MQTT
        destination); the bindings, and what completes when the durable ones have it.
        Raises ``DestinationUnavailable``."""
        router = self.router
        forwarder = router.forwarder
        if forwarder is not None and forwarder.remote:  # other nodes may want it: the router
            self.links_blocked = False
            result = router.dispatch(namespace, message, source=source)
            if self.links_blocked:
                self.links_blocked = False
                self.pause_for_links(source)
            return result
        plan = self.plan(self.plans(namespace), namespace, message.topic)
        pending: list[Any] = []
        sessions = self.sessions
        for key, subs, _ in plan.plain:
            session = sessions.get(key)
            if session is not None:
                result = self.deliver(session, message, subs, None, source)
                if result is not None:
                    pending.append(result)
        for dest_type, binding in plan.others:
            result = dest_type.accept_from(binding, message, source)
            if result is not None:
                pending.append(result)
        self.count(namespace, 1, len(plan.bindings))
        return plan.bindings, pending

    def count(self, namespace: str, messages: int, deliveries: int) -> None:
        """Count ``messages`` routed here by route plan, with their ``deliveries`` to
        bindings, in the router's metrics: added up, and counted at the next flush."""
        tally = self._tally.get(namespace)
        if tally is None:
            tally = self._tally[namespace] = [0, 0]
            if not self._flush_scheduled:
                self._flush_scheduled = True
                asyncio.get_running_loop().call_soon(self.flush_dirty)
        tally[0] += messages
        tally[1] += deliveries

    # --- delivery ---------------------------------------------------------------------------
    def publish_run(
        self,
        source: SessionConnection,
        plan: RoutePlan,
        topic: str,
        raws: list[bytes],
        payload_bytes: int,
    ) -> None:
        """Route a run of plain QoS 0 PUBLISH packets on ``topic`` (no retain flag, no
        properties; ``payload_bytes`` in all) read from ``source``, by ``plan`` (``direct``):
        to the subscribers here (``deliver_run``), and queued for the other nodes with routes
        for it, sent by ``send_forwards``."""
        data = raws[0] if len(raws) == 1 else b"".join(raws)
        session = source.session
        assert session is not None
        if plan.plain:
            self.deliver_run(
                source, source.level, plan, topic, data, len(raws), payload_bytes,
                session.client_id,
            )  # fmt: skip
        outbox = self._outbox
        for node in plan.nodes:
            frame = outbox.get((node, source))
            if frame is None:
                frame = outbox[(node, source)] = [
                    session.namespace, session.client_id, source.level, []
                ]  # fmt: skip
            frame[3] += (topic, len(raws), payload_bytes, data)

    def send_forwards(self) -> None:
        """Send what ``publish_run`` queued for other nodes: one frame per node and
        publisher.  Called at the end of a publisher's read, and before any of its packets
        goes another way (a message routed one at a time must not overtake a queued one)."""
        if not self._outbox:
            return
        outbox, self._outbox = self._outbox, {}
        forwarder = self.router.forwarder
        assert forwarder is not None
        for (node, source), (namespace, origin, level, runs) in outbox.items():
            self.links_blocked = False
            forwarder.forward_runs(node, namespace, origin, level, runs)
            if self.links_blocked:  # the link is not drained: the publisher waits for it
                self.links_blocked = False
                self.pause_for_links(source)

    def deliver_forwarded_runs(
        self, link: Link, namespace: str, origin: str, level: int, runs: list[Any]
    ) -> None:
        """A peer's ``fwdr`` frame (``ClusterRouting.on_forwarded_runs``): runs of plain QoS
        0 PUBLISH packets of protocol ``level`` from client ``origin`` on another node, for
        the memory destinations here (the sender routed the durable ones), each run by its
        topic's plan as a local publisher's."""
        plans = self.plans(namespace)
        router = self.router
        for i in range(0, len(runs), 4):
            topic, count, payload_bytes, data = runs[i : i + 4]
            try:
                plan = self.plan(plans, namespace, topic)
            except DestinationUnavailable:  # a durable type not served here: not ours
                plan = None
            if plan is None or any(not t.durable and not t.one_member for t, _ in plan.others):
                # other memory destinations than MQTT subscribers: a message each, as the
                # router delivers a forwarded one
                for message in run_messages(topic, unpack_run(data, level), origin, 0):
                    router.deliver_forwarded(namespace, message, True, [], source=link)
                continue
            if plan.plain:
                self.deliver_run(link, level, plan, topic, data, count, payload_bytes, origin)
        self.flush_dirty()

    def deliver_run(
        self,
        source: Source,
        level: int,
        plan: RoutePlan,
        topic: str,
        data: bytes,
        count: int,
        payload_bytes: int,
        origin: str,
    ) -> None:
        """Deliver ``count`` plain QoS 0 PUBLISH packets on ``topic`` of protocol ``level``,
        joined in ``data`` as client ``origin`` sent them, to the plain subscribers of
        ``plan``: each subscriber of that level gets ``data`` as it is, in one write, the
        others one encoding made for all of them; no ``Message`` unless a subscriber needs
        PUBLISH packets of its own (v5 subscription ids or topic aliases, several matching
        filters)."""
        other: bytes | None = None  # the run at the other protocol level
        packets: list[Any] | None = None  # (topic, payload, raw) of each, when needed
        messages: list[Message] | None = None
        sessions = self.sessions
        for key, subs, single in plan.plain:
            session = sessions.get(key)
            if session is None:
                continue
            conn = session.connection
            if conn is None:
                continue  # offline sessions get no QoS 0 messages
            if single is None or conn.client_alias_maximum:  # PUBLISH packets of its own
                if messages is None:
                    packets = packets or unpack_run(data, level)
                    messages = run_messages(topic, packets, origin, 0)
                for message in messages:
                    self.deliver(session, message, subs, None, source)
                continue
            if single.options.no_local and session.client_id == origin:
                continue
            if conn.transport is None:
                conn.m.dropped.inc(count)
                continue
            if (conn.writing_paused or conn.out_bytes > WRITE_HIGH_WATER) and not self.may_write(
                conn, source, count
            ):
                continue
            if conn.level == level:
                out = data
            else:
                if other is None:
                    packets = packets or unpack_run(data, level)
                    other = b"".join(_plain_publish(topic, p[1], conn.level) for p in packets)
                out = other
            limit = conn.client_max_packet
            if limit is not None and len(out) > limit:  # some may fit: one by one
                packets = packets or unpack_run(data, level)
                for _, payload, raw in packets:
                    if conn.level != level:
                        raw = _plain_publish(topic, payload, conn.level)
                    if len(raw) > limit:
                        conn.m.dropped.inc()  # MQTT 5 §3.1.2.11.4
                        continue
                    conn.write(raw)
                    conn.out_count += 1
                    conn.out_payload += len(payload)
                continue
            conn.write(out)
            conn.out_count += count
            conn.out_payload += payload_bytes

    def in_memory_only(self, plan: RoutePlan) -> bool:
        """Whether no subscriber session of ``plan`` is persistent: a QoS 1/2 message for one
        is stored before its publisher is acknowledged (``deliver``)."""
        sessions = self.sessions
        for key, _, _ in plan.plain:
            session = sessions.get(key)
            if session is not None and session.expiry_interval:
                return False
        return True

    def publish_run1(
        self, source: SessionConnection, plan: RoutePlan, topic: str, run: list[list[Any]]
    ) -> int:
        """Route a run of plain QoS 1 PUBLISH packets on ``topic`` read from ``source`` (their
        ``PlainPublish1`` lists) by ``plan``: ``direct``, no other node, no persistent
        subscriber (``in_memory_only``), so nothing is waited for.  A subscriber of the
        publisher's protocol level with one QoS 1/2 subscription for it (no subscription
        identifier) and no topic aliases gets the packets as they came with packet ids of its
        own (``_send_run1``); the others a message each (``deliver``).  Returns the run's
        payload bytes."""
        session = source.session
        assert session is not None
        origin = session.client_id
        level = source.level
        messages: list[Message] | None = None
        stamped = False
        longest = 0
        sessions = self.sessions
        for key, subs, single in plan.plain:
            target = sessions.get(key)
            if target is None:
                continue
            conn = target.connection
            if conn is None:
                continue  # not persistent (in_memory_only): nothing is kept for it
            limit = conn.client_max_packet
            if limit is not None and not longest:
                longest = max(len(packet[2]) for packet in run)
            if (
                single is not None
                and single.options.qos
                and conn.level == level
                and not conn.client_alias_maximum
                and (limit is None or longest <= limit)
            ):
                if single.options.no_local and target.client_id == origin:
                    continue
                if not stamped:  # what a message in flight needs besides the packet
                    stamp = (origin, now_ms())
                    for packet in run:
                        packet.append(stamp)
                    stamped = True
                self._send_run1(conn, run, topic, origin, source)
                continue
            if messages is None:
                messages = run_messages(topic, run, origin)
            for message in messages:
                self.deliver(target, message, subs, None, source)
        return sum([len(packet[1]) for packet in run])

    def _send_run1(
        self,
        conn: SessionConnection,
        run: list[list[Any]],
        topic: str,
        origin: str,
        source: Source,
    ) -> None:
        """``send`` of a run of QoS 1 messages (``publish_run1``) to ``conn``: as many as its
        window takes go in flight as they are (``Session.add_run_inflight``) and out in one
        write, the publisher's packets joined with their packet ids replaced by ours (two
        bytes right before the payload, or before the empty properties of v5); the rest wait
        in its session."""
        session = conn.session
        assert session is not None
        ids = session.add_run_inflight(run, conn.client_receive_maximum, self.max_inflight_bytes)
        sent = len(ids)
        if sent:
            data = bytearray(b"".join([packet[2] for packet in run[:sent]]))
            tail = 2 if conn.level == 4 else 3  # the packet id, v5: and property length 0
            end = payload = 0
            for packet, packet_id in zip(run, ids, strict=False):  # ids: the first ones
                size = len(packet[1])
                end += len(packet[2])
                payload += size
                at = end - size - tail
                data[at] = packet_id >> 8
                data[at + 1] = packet_id & 0xFF
            conn.write(bytes(data))
            conn.out_count += sent  # added to the metrics once per flush
            conn.out_payload += payload
        if sent < len(run):
            for message in run_messages(topic, run[sent:], origin):
                session_enqueue(session, message, 1, False, _NO_IDS)
            self.check_congestion(session, source)

    def deliver(
        self,
        session: Session,
        message: Message,
        subs: list[Subscription],
        shared: str | None,
        source: Source,
    ) -> asyncio.Future[Any] | None:
        """Send or queue ``message`` for ``session`` (as a member of the ``shared`` group,
        if given); a future when it went to the offline store (done once durable: the
        publisher's acknowledgement waits for it)."""
        if message.properties.get("origin") == session.client_id:
            subs = [s for s in subs if not s.options.no_local]
            if not subs:
                return None
        if len(subs) == 1:  # the common case, without the generator machinery
            options = subs[0].options
            qos = message.qos if message.qos < options.qos else options.qos
            retain = message.retain and options.retain_as_published
            identifiers = [subs[0].identifier] if subs[0].identifier else _NO_IDS
        else:
            qos = min(message.qos, max(s.options.qos for s in subs))
            retain = message.retain and any(s.options.retain_as_published for s in subs)
            identifiers = [s.identifier for s in subs if s.identifier]
        connection = session.connection
        if connection is not None:
            if qos > 0 and session.draining and self.offline is not None:
                # Its stored backlog is still being read: this one goes behind it (offline.py).
                return self.offline.store(session, message, qos, retain, identifiers)
            self.send(connection, message, qos, retain, identifiers, shared, source)
            if qos > 0 and self.offline is not None and session.persistent():
                # Durable before the publisher's acknowledgement, online or not (offline.py).
                return self.offline.keep(session, message, qos, retain, identifiers)
        elif qos > 0 and session.persistent():
            if self.offline is not None:
                return self.offline.store(session, message, qos, retain, identifiers)
            session_enqueue(session, message, qos, retain, identifiers, shared)
        return None

    def send(
        self,
        conn: SessionConnection,
        message: Message,
        qos: int,
        retain: bool,
        identifiers: list[int],
        shared: str | None = None,
        source: Source = None,
    ) -> None:
        """Write ``message`` to ``conn`` now, or queue it in its session while the client's
        window (receive maximum, ``max_inflight_bytes``) is full."""
        session = conn.session
        assert session is not None
        if message.expiry_ms is not None and message.expiry_ms <= now_ms():
            conn.m.dropped.inc()
            return
        if qos == 0:
            if conn.transport is None:
                conn.m.dropped.inc()
                return
            if not self.may_write(conn, source):
                return
            self._write_encoded(conn, message, 0, retain, identifiers, None)
            return
        if (
            len(session.inflight) >= conn.client_receive_maximum
            or session.inflight_bytes >= self.max_inflight_bytes
        ):
            session_enqueue(session, message, qos, retain, identifiers, shared)
            self.check_congestion(session, source)
            return
        packet_id = session.allocate_packet_id()
        session.add_inflight(
            packet_id, Outgoing(message, qos, retain, delivery_extra(identifiers, shared))
        )
        self._write_encoded(conn, message, qos, retain, identifiers, packet_id)

    def may_write(self, conn: SessionConnection, source: Source, count: int = 1) -> bool:
        """Whether ``count`` QoS 0 messages from ``source`` may go into ``conn``'s buffer: not
        past the high-water mark from a local publisher (dropped, counted); from a peer link
        they may, and the link is held until ``conn`` drains."""
        if (
            conn.writing_paused or conn.out_bytes > WRITE_HIGH_WATER
        ) and conn.backlog() > WRITE_HIGH_WATER:
            if not isinstance(source, Link):
                conn.m.dropped.inc(count)
                return False
            self.hold_link(source, conn)
        return True

    def _write_encoded(
        self,
        conn: SessionConnection,
        message: Message,
        qos: int,
        retain: bool,
        identifiers: list[int],
        packet_id: int | None,
    ) -> None:
        level = conn.level
        if level == 5 and (identifiers or conn.client_alias_maximum):
            self.write_publish(
                conn, message, qos, retain, {"subscription_identifier": identifiers}, packet_id
            )
            return
        cache = self.encodings(message)
        if qos == 0:
            # QoS 0 bytes are the same for every subscriber: encode straight away (most
            # messages reach one subscriber) and let the others reuse the bytes.
            data = cache.get((level, retain))
            if data is None:
                data = cache[(level, retain)] = encode_publish(
                    message.topic, message.payload, 0, retain, False, None,
                    properties_of(message, level), level,
                )  # fmt: skip
        else:
            prepared = cache.get(level)
            if prepared is None:  # the first subscriber at this level: encoded for it alone
                cache[level] = False
                data = encode_publish(
                    message.topic, message.payload, qos, retain, False, packet_id,
                    properties_of(message, level), level,
                )  # fmt: skip
            else:  # more: the topic, properties and payload are encoded once for all
                if prepared is False:
                    prepared = cache[level] = PreparedPublish(
                        message.topic, message.payload, properties_of(message, level), level
                    )
                data = prepared.encode(qos, retain, False, packet_id)
        self.emit(conn, data, len(message.payload), packet_id)

    def write_publish(
        self,
        conn: SessionConnection,
        message: Message,
        qos: int,
        retain: bool,
        extra: dict[str, Any],
        packet_id: int | None,
        dup: bool = False,
    ) -> None:
        """A PUBLISH of its own for ``conn``: its subscription ids, its topic alias, DUP."""
        topic = message.topic
        level = conn.level
        props = properties_of(message, level)
        new_alias = None
        if level == 5:
            if extra.get("subscription_identifier"):
                props["subscription_identifier"] = extra["subscription_identifier"]
            if conn.client_alias_maximum:
                aliases = conn.out_aliases
                alias = aliases.get(topic)
                if alias is not None:
                    props["topic_alias"] = alias
                    topic = ""
                elif len(aliases) < conn.client_alias_maximum:
                    new_alias = aliases[topic] = len(aliases) + 1
                    props["topic_alias"] = new_alias
        data = encode_publish(topic, message.payload, qos, retain, dup, packet_id, props, level)
        if not self.emit(conn, data, len(message.payload), packet_id) and new_alias is not None:
            del conn.out_aliases[message.topic]  # the client never learnt it

    def emit(
        self, conn: SessionConnection, data: bytes, payload_size: int, packet_id: int | None
    ) -> bool:
        """Write one encoded PUBLISH to ``conn`` (counted), unless it is over the client's
        Maximum Packet Size: then it is dropped (counted)."""
        limit = conn.client_max_packet
        if limit is not None and len(data) > limit:
            # MQTT 5 §3.1.2.11.4: discard as if delivered — so it holds no in-flight slot.
            conn.m.dropped.inc()
            if packet_id is not None and conn.session is not None:
                conn.session.remove_inflight(packet_id)
            return False
        conn.write(data)
        conn.out_count += 1  # added to the metrics once per flush
        conn.out_payload += payload_size
        return True

    def encodings(self, message: Message) -> dict[Any, Any]:
        """Encodings of ``message`` made during its fan-out, shared by every subscriber of
        the same protocol level (DESIGN.md §11: encode a fanned-out message once)."""
        if self._encode_cache_key is not message:
            self._encode_cache_key = message
            self._encode_cache = {}
        return self._encode_cache

    def redistribute(self, session: Session, cluster: Any) -> None:
        """``session`` ended with messages of shared groups unacknowledged: give each to
        another member (MQTT 5 §4.8.2: the Server SHOULD), here or on another node
        (``cluster``, a ``ClusterRouting`` or None).  A QoS 2 message the client already
        received (PUBREC) is its own."""
        orphans = [
            (out.message, out.properties["shared"])
            for _, out in session.outgoings()
            if "shared" in out.properties and not out.released
        ]
        orphans += [(m, extra["shared"]) for m, _, _, extra in session.queue if "shared" in extra]
        for message, group in orphans:
            if self.shared_groups.get((session.namespace, group)):
                binding = Binding(SHARED, session.namespace, group)
                self.shared_type.accept_from(binding, message, None)
            elif cluster is None or not cluster.forward_to_group(session.namespace, message, group):
                mqtt_metrics(session.namespace).dropped.inc()

    # --- output -----------------------------------------------------------------------------
    def mark_dirty(self, connection: SessionConnection) -> None:
        self.dirty.append(connection)
        if not self._flush_scheduled:  # writes made outside a read (timers, HTTP publish)
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush_dirty)

    def flush_dirty(self) -> None:
        self._flush_scheduled = False
        dirty, self.dirty = self.dirty, []
        for connection in dirty:
            connection.flush()
        if self._tally:
            tally, self._tally = self._tally, {}
            for namespace, (messages, deliveries) in tally.items():
                self.router.count_published(namespace, messages, deliveries)

    # --- flow control -----------------------------------------------------------------------
    def check_congestion(self, session: Session, source: Source) -> None:
        """Pause ``source``, whose message just queued up behind a slow subscriber (an
        online one: an offline session's queue is bounded instead, never holding others up)."""
        if len(session.queue) <= PAUSE_ABOVE or not session.online:
            return
        self.congested.add(session)
        if isinstance(source, Link) or source is None:
            return  # a peer's link is held by the subscriber's write buffer (may_write)
        if source not in self.paused and source.transport:
            source.transport.pause_reading()
            self.paused.add(source)

    def relieve(self, session: Session) -> None:
        """Called when a session's queue shrank or it went away (offline, discarded)."""
        if session in self.congested and (len(session.queue) < RESUME_BELOW or not session.online):
            self.congested.discard(session)
        if not self.congested and self.paused:
            paused, self.paused = self.paused, set()
            for publisher in paused:
                self._resume(publisher)

    def is_paused(self, publisher: SessionConnection) -> bool:
        return (
            publisher in self.paused
            or publisher in self.link_paused
            or self.pressure.holds(publisher)
        )

    def _resume(self, publisher: SessionConnection) -> None:
        """One reason to pause ``publisher`` is gone: read again unless another holds it."""
        if publisher.transport is not None and not self.is_paused(publisher):
            publisher.transport.resume_reading()

    def pause_for_pressure(
        self, publisher: SessionConnection, resume: Callable[[], None] | None = None
    ) -> bool:
        """Durable writes lag (``pressure.active``): stop reading ``publisher``, whose message
        just went to a durable destination, until they catch up; then ``resume()`` (default:
        read again unless another reason holds it).  True if it was not held already."""
        if publisher.transport is None:
            return False
        if resume is None:
            resume = functools.partial(self._resume, publisher)
        if not self.pressure.hold(publisher, resume):
            return False
        publisher.transport.pause_reading()
        return True

    def on_links_blocked(self) -> None:
        """The cluster's callback: a forward just went into a link the peer is not draining
        (``dispatch`` then pauses the source it was given)."""
        self.links_blocked = True

    def pause_for_links(self, source: Source) -> None:
        """Stop reading the publisher ``source`` until the links are clear (TCP pushes back
        to the client)."""
        if isinstance(source, Link) or source is None:
            return
        if source not in self.link_paused and source.transport:
            source.transport.pause_reading()
            self.link_paused.add(source)

    def on_links_free(self) -> None:
        paused, self.link_paused = self.link_paused, set()
        for publisher in paused:
            self._resume(publisher)

    def hold_link(self, link: Link, subscriber: SessionConnection) -> None:
        """``subscriber`` cannot take what ``link`` brings as fast: stop reading the link
        until it drains (the sending broker then slows its publishers down)."""
        holders = self.holding.get(link)
        if holders is None:
            holders = self.holding[link] = set()
            if link.transport is not None:
                link.transport.pause_reading()
        holders.add(subscriber)

    def release_links(self, subscriber: SessionConnection) -> None:
        """``subscriber`` drained (or went): resume the links only it was holding."""
        for link, holders in list(self.holding.items()):
            holders.discard(subscriber)
            if not holders:
                del self.holding[link]
                if link.transport is not None:
                    link.transport.resume_reading()

    def forget(self, connection: SessionConnection) -> None:
        """``connection`` left: it holds nothing paused any more."""
        self.paused.discard(connection)
        self.link_paused.discard(connection)
        self.pressure.forget(connection)
        self.release_links(connection)


def message_from(
    topic: str, payload: bytes, qos: int, retain: bool, props: Any, origin: str
) -> Message:
    """The routed form of an MQTT PUBLISH (or will) from client ``origin``."""
    now = now_ms()
    extra: dict[str, Any] = {"origin": origin}
    headers: list[tuple[str, bytes]] = []
    content_type = expiry_ms = None
    if props:
        for name in PASSTHROUGH:
            if name in props:
                extra[name] = props[name]
        user = props.get("user_property")
        if user:
            headers = [(k, v.encode()) for k, v in user]
        content_type = props.get("content_type")
        interval = props.get("message_expiry_interval")
        if interval is not None:
            expiry_ms = now + interval * 1000
    # Positional: keyword construction of a slotted dataclass is measurably slower here.
    return Message(
        topic, payload, qos, retain, headers, now, None, content_type, expiry_ms, "mqtt", extra
    )


def run_messages(topic: str, run: list[Any], origin: str, qos: int = 1) -> list[Message]:
    """The routed form of each plain QoS ``qos`` PUBLISH of ``run`` (``PlainPublish1`` lists,
    or ``PlainPublish`` tuples: the payload second) on ``topic`` from client ``origin``:
    ``message_from``'s, made once for the run (one timestamp, one read-only extras dict)."""
    now = now_ms()
    extra = {"origin": origin}
    return [plain_message(topic, packet[1], qos, now, extra) for packet in run]


def _plain_publish(topic: str, payload: bytes, level: int) -> bytes:
    """A plain QoS 0 PUBLISH (no retain, no DUP, no properties) of protocol ``level``."""
    return encode_publish(topic, payload, 0, False, False, None, None, level)


def unpack_run(data: bytes, level: int) -> list[Any]:
    """The ``(topic, payload, packet)`` of each plain QoS 0 PUBLISH of protocol ``level``
    joined in ``data`` (a run ``deliver_run`` was given)."""
    return MqttDecoder(protocol_level=level, max_packet_size=None, plain_tuples=True).feed(data)


def properties_of(message: Message, level: int) -> dict[str, Any]:
    """The MQTT 5 PUBLISH properties ``message`` carries to a subscriber (none for 3.1.1)."""
    if level != 5:
        return {}
    props: dict[str, Any] = {}
    extra = message.properties
    for name in PASSTHROUGH:
        if name in extra:
            props[name] = extra[name]
    if message.content_type is not None:
        props["content_type"] = message.content_type
    if message.headers:
        props["user_property"] = [(k, v.decode("utf-8", "replace")) for k, v in message.headers]
    if message.expiry_ms is not None:
        props["message_expiry_interval"] = max(0, math.ceil((message.expiry_ms - now_ms()) / 1000))
    return props


def matching_subscriptions(session: Session, topic: str) -> list[Subscription]:
    """The plain subscriptions of ``session`` that ``topic`` matches (the router matched the
    session, so with one plain filter that one matched)."""
    plain = session.plain_subscriptions()
    if len(plain) != 1:  # which of the client's filters matched decides QoS and ids
        plain = [sub for sub in plain if matches(sub.topic_filter, topic)]
    return plain


class _MqttType(DestinationType):
    """An MQTT destination type: in memory, delivered by ``MqttDelivery`` with its source."""

    durable = False

    def __init__(self, delivery: MqttDelivery) -> None:
        self.delivery = delivery

    def accept(self, binding: Binding, message: Message) -> asyncio.Future[Any] | None:
        return self.accept_from(binding, message, None)


class _SubscriptionType(_MqttType):
    """``subscription`` bindings: one per client, bound to each of its plain filters."""

    name = SUBSCRIPTION

    def accept_from(
        self, binding: Binding, message: Message, source: Any
    ) -> asyncio.Future[Any] | None:
        delivery = self.delivery
        session = delivery.sessions.get((binding.namespace, binding.name))
        if session is None:
            return None
        subs = matching_subscriptions(session, message.topic)
        return delivery.deliver(session, message, subs, None, source) if subs else None


class _SharedType(_MqttType):
    """``shared`` bindings: one per ``$share/<group>/<filter>``, each message to one member."""

    name = SHARED
    one_member = True

    def accept_from(
        self, binding: Binding, message: Message, source: Any
    ) -> asyncio.Future[Any] | None:
        delivery = self.delivery
        members = delivery.shared_groups.get((binding.namespace, binding.name))
        if not members:
            return None
        # Round robin over online members; an offline persistent member only when no one is on.
        start = next(delivery._shared_turn)
        chosen = None
        sessions = delivery.sessions
        for i in range(len(members)):
            session = sessions.get((binding.namespace, members[(start + i) % len(members)]))
            if session is not None and session.online:
                chosen = session
                break
            if chosen is None and session is not None:
                chosen = session
        if chosen is None:
            return None
        sub = chosen.subscriptions.get(binding.name)
        if sub is not None:
            return delivery.deliver(chosen, message, [sub], binding.name, source)
        return None


__all__ = [
    "MqttDelivery",
    "PAUSE_ABOVE",
    "RESUME_BELOW",
    "RoutePlan",
    "SHARED",
    "SUBSCRIPTION",
    "WRITE_HIGH_WATER",
    "message_from",
    "properties_of",
]
