"""One MQTT client connection: an asyncio Protocol (DESIGN.md §11).

Every complete packet of a ``data_received`` call is handled in one loop; everything written
during that loop iteration — acks, and deliveries made by other connections' publishes — is
joined into one ``transport.write`` per connection by a single flush when the read is done.
A PUBLISH is checked here (topic, alias, ACL) and handed to ``flowmq_broker.mqtt.delivery``
with this connection as its source; a plain QoS 0 one goes by its topic's cached route plan,
forwarded as the bytes it came in, and so does a plain QoS 1 one when nothing is to be waited
for (``_may_run_qos1``): a run of them acknowledged in one write, a run of PUBACKs released
in one pass.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from array import array
from collections import deque
from collections.abc import Callable
from typing import Any

import flowmq_metrics as metrics
from flowmq_broker import lingering
from flowmq_broker.mqtt.delivery import WRITE_HIGH_WATER, RoutePlan, message_from
from flowmq_broker.mqtt.host import ConnectionHost
from flowmq_broker.mqtt.metrics import mqtt_metrics
from flowmq_broker.mqtt.offline import STORED_SEQ
from flowmq_broker.mqtt.session import NEVER_EXPIRES, Outgoing, Session, Subscription
from flowmq_broker.routing import DestinationUnavailable
from flowmq_core.acl import Access
from flowmq_core.audit import audit_log
from flowmq_core.errors import InvalidFilter, QuotaExceeded
from flowmq_core.limits import (
    MAX_CLIENT_ID_BYTES,
    MAX_TOPIC_LEVELS,
    exceeded_topic_limit,
    utf8_size,
)
from flowmq_core.message import Message, now_ms
from flowmq_core.topics import parse_shared, validate_subscription_filter
from flowmq_meta.catalog import DEFAULT_NAMESPACE
from flowmq_meta.users import RATE_LIMITED
from flowmq_queue import QueueFull
from flowmq_wire.mqtt import reason_codes as rc
from flowmq_wire.mqtt.codec import MqttDecoder, encode, encode_pubacks
from flowmq_wire.mqtt.errors import MqttCodecError, UnsupportedProtocolVersion
from flowmq_wire.mqtt.packets import (
    Auth,
    Connack,
    Connect,
    Disconnect,
    Pingreq,
    Pingresp,
    PlainPubacks,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Unsuback,
    Unsubscribe,
)

log = logging.getLogger(__name__)

SERVER_RECEIVE_MAXIMUM = 1024
SERVER_TOPIC_ALIAS_MAXIMUM = 64
CONNECT_TIMEOUT_S = 30.0
# Topics one connection remembers as checked (_checked_topics) before starting over.
MAX_CHECKED_TOPICS = 1000
# Default bound on packets read while CONNECT waits (config ``mqtt_max_held_packets``): reading
# stops during the wait, so this bounds what the reads already made can hold.
DEFAULT_MAX_HELD_PACKETS = 1000
# A read this large says the client has more waiting (the loops read at most 250 or 256 KiB at
# a time): reading it stops until the event loop's next turn, so that the other sockets get
# theirs first.  uvloop otherwise reads a socket up to 32 times per wake-up, 8 MB from a
# flooding publisher, while a peer's link with that publisher's forwards for this process
# waits: in host mode each process then sat idle, its own publishers paused for the blocked
# link, while the other worked through such a turn (benchmarks/README.md "Host mode").
YIELD_AFTER_READ_BYTES = 128 * 1024
# What a flush's writes must average for them to go out as they are (writev, ``flush``).
WRITELINES_AVERAGE_BYTES = 4096


def _over_limit(topic: str) -> bool:
    """A topic past ``flowmq_core.limits`` (counted): refused before it reaches storage."""
    limit = exceeded_topic_limit(topic)
    if limit is None:
        return False
    metrics.limits_rejections_count.labels(limit).inc()
    return True


class MqttConnection(asyncio.Protocol):
    def __init__(self, server: ConnectionHost) -> None:
        self.server = server
        self.delivery = server.delivery
        self.namespace = DEFAULT_NAMESPACE
        # Plain QoS 0 PUBLISH packets come as (topic, payload, raw) tuples, plain QoS 1 ones as
        # [topic, payload, raw, packet id] lists, runs of plain PUBACKs as arrays of packet
        # ids: see _handle_all.
        self.decoder = MqttDecoder(
            server=True,
            max_packet_size=server.max_packet_size,
            plain_tuples=True,
            plain_qos1=True,
        )
        self.transport: asyncio.Transport | None = None
        self.level = 4
        self.session: Session | None = None
        self.client_id = ""
        self._held: list[Any] | None = None  # packets read while CONNECT awaits the cluster
        self._changes_waiting = 0  # SUBSCRIBE/UNSUBSCRIBE waiting to be kept (reading stops)
        # Packets read and not yet handled while durable writes lag (``_pause_for_pressure``):
        # the rest of the read that passed the mark, handled once they caught up.
        self._unread: list[Any] | None = None
        self.username: str | None = None
        # The user its TLS client certificate names (tls_cert_as_username): logs in as that
        # user without a password, whatever CONNECT says.
        self.peer_username: str | None = None
        # What the client may do (flowmq_core.acl), from CONNECT on; ``acl_publish`` is its
        # topic -> may-publish cache: one dict lookup per PUBLISH once a topic was decided.
        self.access: Access | None = None
        self.acl_publish: dict[str, bool] = {}
        self.closing = False
        # For the connect and disconnect log lines: the client's address once connected, and
        # why the connection ended (the broker's reason, or the client's DISCONNECT).
        self.peer = "?"
        self.end_reason = "closed by the client"
        self.will: Any = None
        self.keep_alive = 0
        self.last_rx = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._out: list[bytes] = []
        self.out_bytes = 0
        self._dirty = False
        self.writing_paused = False
        self._in_count = self._in_bytes = self.out_count = self.out_payload = 0
        self._checked: dict[str, RoutePlan] = {}  # see _checked_topics
        self._checked_generations = (-1, -1)
        self.m = mqtt_metrics(self.namespace)
        self.client_receive_maximum = 65535
        self.client_max_packet: int | None = None
        self.client_alias_maximum = 0
        self.out_aliases: dict[str, int] = {}
        self.in_aliases: dict[int, str] = {}
        self._acks: deque[list[Any]] = deque()  # [future or None, ack packet builder]
        self._loop = asyncio.get_running_loop()

    # --- transport --------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not self.server.connection_limits.admit(self, transport):
            return  # closed at once: nothing can be answered before CONNECT
        self.transport = transport  # type: ignore[assignment]
        # pause_writing() then tells us cheaply when the socket buffer passes the drop mark.
        self.transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        self.server.connections.add(self)
        if self.server.tls is not None:
            self.peer_username = self.server.tls.peer_username(transport)
        self.last_rx = self._loop.time()
        self._timer = self._loop.call_later(CONNECT_TIMEOUT_S, self._connect_timeout)

    def _connect_timeout(self) -> None:
        if self.session is None:
            self.close()

    def data_received(self, data: bytes) -> None:
        self.last_rx = self._loop.time()
        try:
            self._process(data)
        finally:
            self._after_read()
        if len(data) >= YIELD_AFTER_READ_BYTES and self._may_read():
            self.transport.pause_reading()  # type: ignore[union-attr]
            self._loop.call_soon(self._resume_reading)

    def _may_read(self) -> bool:
        """Whether nothing holds reading from this client: no CONNECT, SUBSCRIBE or durable
        write waited for, no flow control (``MqttDelivery.is_paused``)."""
        return (
            self.transport is not None
            and not self.closing
            and self._held is None
            and self._unread is None
            and not self._changes_waiting
            and not self.delivery.is_paused(self)
        )

    def _resume_reading(self) -> None:
        """Read again once one reason to stop has ended (a held CONNECT, a SUBSCRIBE kept,
        durable writes caught up, the loop turn after a large read), unless another still
        holds: its own end reads again."""
        if self._may_read():
            self.transport.resume_reading()  # type: ignore[union-attr]

    def _after_read(self) -> None:
        """Count the PUBLISH packets handled, and send what handling them produced."""
        if self._in_count:
            self.m.messages_in.inc(self._in_count)
            self.m.bytes_in.inc(self._in_bytes)
            self._in_count = self._in_bytes = 0
        # Everything this read produced — acks and every subscriber's deliveries — goes
        # out now, one write per connection (uvloop reads a socket many times per wake-up
        # before running callbacks: waiting for call_soon would send megabyte bursts).
        self.delivery.flush_dirty()

    def _process(self, data: bytes) -> None:
        try:
            packets = self.decoder.feed(data)
        except MqttCodecError as exc:
            self._handle_all(exc.packets)
            if not self.closing:
                self._codec_error(exc)
            return
        self._handle_all(packets)

    def _handle_all(self, packets: list[Any]) -> None:
        if self._unread is not None:  # stopped for the pressure: these come after the rest
            self._unread.extend(packets)
            return
        on_publish = self._on_publish
        fast = self._checked_topics()
        delivery = self.delivery
        # The run of plain QoS 0 PUBLISH packets on one checked topic being read: routed
        # together when another topic or packet comes, or the read ends (_publish_run).
        run: list[bytes] = []
        run_topic = ""
        run_plan: RoutePlan | None = None
        run_size = 0
        # The same for plain QoS 1 PUBLISH packets (their PlainPublish1 lists: _publish_run1);
        # one run is open at a time: a packet of another kind ends it first.
        run1: list[list[Any]] = []
        run1_topic = ""
        run1_plan: RoutePlan | None = None
        rest = iter(packets)
        try:
            for packet in rest:
                if self.closing:
                    return
                if self._held is not None:  # CONNECT is waiting (another node, the store)
                    self._hold(packet)
                    continue
                cls = packet.__class__
                if cls is tuple:  # a plain QoS 0 PUBLISH: (topic, payload, raw)
                    # Most of the traffic: on a topic already checked it goes by its route
                    # plan, as the bytes it came in, a run at a time (see _on_publish).
                    topic = packet[0]
                    if run_plan is not None:
                        if topic == run_topic:
                            run.append(packet[2])
                            run_size += len(packet[1])
                            continue
                        self._publish_run(run_plan, run_topic, run, run_size)
                        run_plan = None
                    elif run1_plan is not None:
                        self._publish_run1(run1_plan, run1_topic, run1)
                        run1_plan = None
                    plan = fast.get(topic) if fast is not None else None
                    if plan is not None:
                        run, run_topic, run_plan = [packet[2]], topic, plan
                        run_size = len(packet[1])
                        continue
                    delivery.send_forwards()
                    on_publish(Publish(topic, packet[1]), packet[2])
                    if self._unread is not None:  # durable writes lag: not one more now
                        self._unread.extend(rest)
                        return
                    continue
                if cls is list:  # a plain QoS 1 PUBLISH: [topic, payload, raw, packet id]
                    topic = packet[0]
                    if run1_plan is not None:
                        if topic == run1_topic:
                            run1.append(packet)
                            continue
                        self._publish_run1(run1_plan, run1_topic, run1)
                        run1_plan = None
                    elif run_plan is not None:
                        self._publish_run(run_plan, run_topic, run, run_size)
                        run_plan = None
                    plan = fast.get(topic) if fast is not None else None
                    if plan is not None and self._may_run_qos1(plan):
                        run1, run1_topic, run1_plan = [packet], topic, plan
                        continue
                    delivery.send_forwards()
                    on_publish(Publish(topic, packet[1], 1, False, False, packet[3]), None, True)
                    if self._unread is not None:
                        self._unread.extend(rest)
                        return
                    continue
                if run_plan is not None:
                    self._publish_run(run_plan, run_topic, run, run_size)
                    run_plan = None
                elif run1_plan is not None:
                    self._publish_run1(run1_plan, run1_topic, run1)
                    run1_plan = None
                if cls is array:  # a run of plain PUBACKs: their packet ids
                    self._release(packet)
                    continue
                delivery.send_forwards()
                if cls is Publish:
                    on_publish(packet)
                    if self._unread is not None:
                        self._unread.extend(rest)
                        return
                else:
                    self._handle(packet)
                    fast = self._checked_topics()  # a SUBSCRIBE, a CONNECT may change it
        finally:
            if run_plan is not None:
                self._publish_run(run_plan, run_topic, run, run_size)
            elif run1_plan is not None:
                self._publish_run1(run1_plan, run1_topic, run1)
            delivery.send_forwards()

    def _publish_run(self, plan: RoutePlan, topic: str, run: list[bytes], size: int) -> None:
        """Route a run of plain QoS 0 PUBLISH packets ``run`` (``size`` payload bytes) on a
        checked ``topic`` by its ``plan``, and count them."""
        delivery = self.delivery
        delivery.publish_run(self, plan, topic, run, size)
        count = len(run)
        self._in_count += count  # added to the metrics once per read, in data_received
        self._in_bytes += size
        delivery.count(self.namespace, count, count * len(plan.bindings))

    def _may_run_qos1(self, plan: RoutePlan) -> bool:
        """Whether a run of plain QoS 1 PUBLISH packets on a checked topic may go by ``plan``
        a run at a time, each acknowledged as soon as it is routed: no acknowledgement is
        waiting before them (MQTT-4.6.0-2: in order), the client is within our receive
        maximum, no other node has a route for the topic (a forward is confirmed first) and
        no subscriber's session is persistent (stored first: docs/mqtt.md "Durability")."""
        if plan.nodes or self._acks:
            return False
        session = self.session
        assert session is not None
        if len(session.incoming_qos2) >= SERVER_RECEIVE_MAXIMUM:
            return False  # told by _on_publish
        return self.delivery.in_memory_only(plan)

    def _publish_run1(self, plan: RoutePlan, topic: str, run: list[list[Any]]) -> None:
        """Route a run of plain QoS 1 PUBLISH packets (``_may_run_qos1``) on a checked
        ``topic`` by its ``plan``, acknowledge them in one write, and count them."""
        delivery = self.delivery
        size = delivery.publish_run1(self, plan, topic, run)
        count = len(run)
        self._in_count += count
        self._in_bytes += size
        delivery.count(self.namespace, count, count * len(plan.bindings))
        success = rc.SUCCESS if plan.bindings or self.level != 5 else rc.NO_MATCHING_SUBSCRIBERS
        self.write(encode_pubacks([packet[3] for packet in run], success))

    def _release(self, packet_ids: PlainPubacks) -> None:
        """A run of plain PUBACKs: their messages leave the window in one pass, then what
        waited for room goes out."""
        session = self.session
        if session is None:
            return
        removed, records = session.remove_inflight_run(packet_ids)
        for out in records:
            self._settled(session, out.properties)
        if removed:
            self.send_queued()

    def _checked_topics(self) -> dict[str, RoutePlan] | None:
        """The topics this client published plain QoS 0 or 1 messages on that passed every check
        (topic rules, ACL) and reach only plain subscribers, here and on other nodes, with
        their route plans; valid while neither the routes (this node's and the others') nor
        the client's ACLs change.  None: no such shortcut now (not connected)."""
        access = self.access
        if self.session is None or access is None:
            return None
        router = self.delivery.router
        if self._checked_generations != (router.generation, access.generation):
            self._checked_generations = (router.generation, access.generation)
            self._checked = {}
        return self._checked

    def _hold(self, packet: Any) -> None:
        """Keep ``packet`` until CONNECT is done; past ``max_held_packets`` the client is
        closed (counted as a limit refusal): it cannot have been told of any limit yet."""
        held = self._held
        assert held is not None
        if len(held) >= self.server.max_held_packets:
            metrics.limits_rejections_count.labels("mqtt_max_held_packets").inc()
            log.info(
                "mqtt %s: over %d packets sent while CONNECT waits; closing",
                self._peer(),
                self.server.max_held_packets,
            )
            self._held = None
            self.close()
            return
        held.append(packet)

    def write(self, data: bytes) -> None:
        self._out.append(data)
        self.out_bytes += len(data)
        if not self._dirty:
            self._dirty = True
            self.delivery.mark_dirty(self)

    def flush(self) -> None:
        self._dirty = False
        if self.out_count:
            self.m.messages_out.inc(self.out_count)
            self.m.bytes_out.inc(self.out_payload)
            self.out_count = self.out_payload = 0
        out = self._out
        if out and self.transport is not None and not self.transport.is_closing():
            if len(out) == 1:
                self.transport.write(out[0])
            elif self.out_bytes >= WRITELINES_AVERAGE_BYTES * len(out):
                # Runs of messages (hundreds of KiB each): one writev of them as they are,
                # not joined into a buffer that size first, fresh memory each time.
                self.transport.writelines(out)
            else:  # small packets: one copy is cheaper than a vector entry each
                self.transport.write(b"".join(out))
        out.clear()
        self.out_bytes = 0
        delivery = self.delivery
        if delivery.holding and not self.writing_paused:  # drained as it was written
            delivery.release_links(self)

    def pause_writing(self) -> None:
        self.writing_paused = True

    def resume_writing(self) -> None:
        self.writing_paused = False
        if self.delivery.holding:
            self.delivery.release_links(self)
        session = self.session
        if session is not None and session.draining and self.server.offline is not None:
            self.server.offline.feed(session)  # its backlog waited for the socket to drain

    def backlog(self) -> int:
        """Bytes written but not yet taken by the client."""
        transport = self.transport
        return self.out_bytes + (transport.get_write_buffer_size() if transport else 0)

    def send(self, packet: Any) -> None:
        self.write(encode(packet, self.level))

    def close(self) -> None:
        """Flush what is pending, then close, lingering so that the client reads it (a
        refusal, a DISCONNECT's reason) even if it was still sending (flowmq_broker.lingering)."""
        if self.closing:
            return
        self.closing = True
        self.flush()
        # The socket lingers on, but this connection writes nothing more to it.
        transport, self.transport = self.transport, None
        lingering.close(transport, self)

    def disconnect(self, reason: int, message: str = "") -> None:
        """End the connection as the protocol says: DISCONNECT (v5) or just close (3.1.1)."""
        if self.closing:
            return
        if message:
            log.info("mqtt %s: disconnecting: %s", self.client_id or self._peer(), message)
            self.end_reason = message
        if self.level == 5 and self.session is not None:
            props = {"reason_string": message[:200]} if message else {}
            self.send(Disconnect(reason, props))
        self.close()

    def shutdown(self) -> None:
        self.disconnect(rc.SERVER_SHUTTING_DOWN)

    def _peer(self) -> str:
        peer = self.transport.get_extra_info("peername") if self.transport else None
        return f"{peer[0]}:{peer[1]}" if peer else "?"

    def _peer_ip(self) -> str:
        """The client's IP address (what failed logins are counted against)."""
        peer = self.transport.get_extra_info("peername") if self.transport else None
        return str(peer[0]) if peer else "?"

    def _codec_error(self, exc: MqttCodecError) -> None:
        if self.session is None:
            # The CONNECT itself failed: answer in the client's version where possible.
            level = self.decoder.protocol_level or 4
            if isinstance(exc, UnsupportedProtocolVersion):
                code = exc.reason_code if level == 5 else exc.return_code
                self.write(encode(Connack(False, code), 5 if level == 5 else 4))
            elif level == 5 and self.decoder.protocol_level == 5:
                self.write(encode(Connack(False, exc.reason_code), 5))
            self.close()
            return
        self.disconnect(exc.reason_code, exc.message)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connection_limits.release(self)
        self.closing = True
        self.transport = None
        self._unread = None
        self._out.clear()
        self.out_bytes = 0
        if self._timer is not None:
            self._timer.cancel()
        self.server.connections.discard(self)
        self.delivery.release_links(self)
        session = self._detach()
        if session is None:
            return
        log.info(
            "mqtt %s: disconnected from %s (%s)",
            self.client_id,
            self.peer,
            f"connection lost: {exc}" if exc is not None else self.end_reason,
        )
        if session.expiry_interval == 0:
            self.server.discard_session(session)
            return
        if self.server.offline is not None:
            self.server.offline.release(session)
        if session.expiry_interval != NEVER_EXPIRES:
            session.expiry_handle = self._loop.call_later(
                session.expiry_interval, self.server.expire, session
            )

    def _detach(self) -> Session | None:
        """Leave the session (publishing the will if one is due); None if already left."""
        session = self.session
        if session is None or session.connection is not self:
            return None
        self.m.connections.dec()
        session.connection = None
        self.delivery.forget(self)
        self.delivery.relieve(session)
        if self.will is not None:
            self._schedule_will(session)
        return session

    def take_over(self) -> None:
        """Another connection with our client id arrived: it gets the session."""
        self.disconnect(rc.SESSION_TAKEN_OVER, "session taken over")
        self._detach()

    def _schedule_will(self, session: Session) -> None:
        will, namespace, client_id = self.will, self.namespace, self.client_id
        self.will = None
        if self.access is None or not self.access.may_publish(will.topic):
            return  # the client may no longer publish there (the ACLs changed since CONNECT)
        delay = will.properties.get("will_delay_interval", 0) if self.level == 5 else 0

        def publish_will() -> None:
            session.will_handle = session.pending_will = None
            message = message_from(
                will.topic, will.payload, will.qos, will.retain, will.properties, client_id
            )
            self.server_publish(namespace, message)

        if delay and session.expiry_interval:
            session.pending_will = publish_will
            session.will_handle = self._loop.call_later(delay, publish_will)
        else:
            publish_will()

    def server_publish(self, namespace: str, message: Message) -> None:
        """Publish on the broker's behalf (will messages): no acknowledgement to wait for."""
        if message.retain:
            try:
                retained = self.server.retained.set(namespace, message)
            except QuotaExceeded:
                pass  # delivered, not retained
            else:
                self._in_background(retained)
        try:
            _, pending = self.delivery.dispatch(namespace, message, None)
        except DestinationUnavailable as exc:
            log.warning("will message not delivered: %s", exc)
            return
        for awaitable in pending:
            self._in_background(awaitable)

    def _in_background(self, awaitable: Any) -> None:
        """Let ``awaitable`` (a durable store nobody waits for: a will's, a QoS 0 message's)
        finish on its own, logging a failure.  A future gets a callback rather than a task
        of its own: a will fanned out to a few hundred offline sessions made as many tasks,
        ~780 bytes each against ~120 for a callback, alive until the stores' flush."""
        if asyncio.isfuture(awaitable):
            awaitable.add_done_callback(_log_background_failure)
        else:
            self._loop.create_task(_log_failure(awaitable))

    # --- keep alive ---------------------------------------------------------------------
    def _start_keep_alive(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.keep_alive:
            self._timer = self._loop.call_later(self.keep_alive * 1.5, self._check_keep_alive)

    def _check_keep_alive(self) -> None:
        limit = self.keep_alive * 1.5
        if self.delivery.is_paused(self):  # we stopped reading it: its silence is ours
            self.last_rx = self._loop.time()
        idle = self._loop.time() - self.last_rx
        if idle >= limit:
            self.disconnect(
                rc.KEEP_ALIVE_TIMEOUT,
                f"no packet for {idle:.1f} s (keep alive {self.keep_alive} s)",
            )
        else:
            self._timer = self._loop.call_later(limit - idle, self._check_keep_alive)

    # --- packets ------------------------------------------------------------------------
    def _handle(self, packet: Any) -> None:
        cls = packet.__class__
        if cls is tuple:  # a plain QoS 0 PUBLISH (held while CONNECT waited)
            self._on_publish(Publish(packet[0], packet[1]), packet[2])
            return
        if cls is list:  # a plain QoS 1 PUBLISH
            self._on_publish(Publish(packet[0], packet[1], 1, False, False, packet[3]), None, True)
            return
        if cls is array:  # a run of plain PUBACKs
            self._release(packet)
            return
        handler = _HANDLERS.get(packet.__class__)
        if handler is None:
            self.disconnect(rc.PROTOCOL_ERROR, f"unexpected {packet.__class__.__name__}")
            return
        handler(self, packet)

    def _on_connect(self, p: Connect) -> None:
        """CONNECT, first step: who is it.  Without a user name the answer is at hand (the
        anonymous setting); a user name is checked off the event loop (``_authenticate``)
        while reading stops and what was already read waits in ``_held``."""
        self.level = p.protocol_level
        if p.properties.get("authentication_method"):
            self._refuse_connect(rc.BAD_AUTHENTICATION_METHOD, "enhanced authentication", p)
            return
        if self.peer_username is not None:  # tls_cert_as_username: the certificate is the login
            namespace = self.server.users.namespace_of(self.peer_username)
            if namespace is None:
                self._refuse_connect(rc.BAD_USER_NAME_OR_PASSWORD, "certificate names no user", p)
                return
            self._enter_namespace(namespace)
            self._on_connect_accepted(p)
            return
        if not p.username:  # none, or empty (no user has an empty name): anonymous
            if not self.server.allow_anonymous:
                self._refuse_connect(rc.NOT_AUTHORIZED, "anonymous clients are not allowed", p)
                return
            self._on_connect_accepted(p)
            return
        self._held = []
        if self.transport is not None:
            self.transport.pause_reading()
        self._loop.create_task(self._authenticate(p))

    async def _authenticate(self, p: Connect) -> None:
        """CONNECT with a user name: ``UserDirectory.authenticate`` (scrypt in its threads,
        rate limited per client address), then the rest of CONNECT and the held packets."""
        assert p.username is not None
        try:
            result = await self.server.users.authenticate(p.username, p.password, self._peer_ip())
        except Exception:
            log.exception("mqtt %s: checking the login of %r failed", self._peer(), p.username)
            result = None
        held, self._held = self._held or [], None
        if self.closing:
            return
        if result is None:
            self._refuse_connect(rc.UNSPECIFIED_ERROR, "the login could not be checked", p)
            return
        if not result:
            if result.reason == RATE_LIMITED:
                why = f"{RATE_LIMITED}: retry in {result.retry_after:.0f} s"
                self._refuse_connect(rc.CONNECTION_RATE_EXCEEDED, why, p)
            else:  # unknown_user or bad_password: the client is told the same
                self._refuse_connect(rc.BAD_USER_NAME_OR_PASSWORD, result.reason, p)
            return
        self._resume_reading()
        if result.namespace is not None:
            self._enter_namespace(result.namespace)
        self._on_connect_accepted(p)
        self._replay(held)
        self.delivery.flush_dirty()

    def _enter_namespace(self, namespace: str) -> None:
        """The user's tenant (DESIGN.md §12) becomes the connection's namespace."""
        if namespace != self.namespace:
            self.namespace = namespace
            self.m = mqtt_metrics(namespace)

    def _refuse_connect(self, code: int, why: str, p: Connect) -> None:
        """CONNACK with a v5 refusal ``code`` (or its 3.1.1 return code), then close."""
        audit_log.info(
            "mqtt %s: CONNECT refused (0x%02X %s): %s; user name %r",
            self._peer(),
            code,
            rc.reason_code_name(code),
            why,
            p.username,
        )
        self.send(Connack(False, code if self.level == 5 else rc.connack_v5_to_v311(code)))
        self.close()

    def _replay(self, held: list[Any]) -> None:
        """Handle packets held while CONNECT waited, in order; if another wait begins
        meanwhile (a session takeover after authentication), the rest wait behind it."""
        for index, packet in enumerate(held):
            if self.closing:
                return
            if self._held is not None:
                self._held.extend(held[index:])
                return
            if self._unread is not None:  # stopped for the pressure (_pause_for_pressure)
                self._unread.extend(held[index:])
                return
            self._handle(packet)

    def _on_connect_accepted(self, p: Connect) -> None:
        """CONNECT, second step: the client may connect; check the rest, take the session."""
        props = p.properties
        v5 = self.level == 5
        if utf8_size(p.client_id) > MAX_CLIENT_ID_BYTES:
            metrics.limits_rejections_count.labels("client_id_bytes").inc()
            log.info(
                "mqtt %s: client id longer than %d bytes; refused",
                self._peer(),
                MAX_CLIENT_ID_BYTES,
            )
            self.send(
                Connack(
                    False, rc.CLIENT_IDENTIFIER_NOT_VALID if v5 else rc.CONNACK_IDENTIFIER_REJECTED
                )
            )
            self.close()
            return
        if p.will is not None and (
            _has_wildcard(p.will.topic)
            or _has_wildcard(p.will.properties.get("response_topic"))
            or _over_limit(p.will.topic)
        ):
            # A will is published like any PUBLISH: its topics follow the same rules (3.1.1
            # has no CONNACK code for it: the connection is closed, as Mosquitto does).
            if v5:
                self.send(Connack(False, rc.TOPIC_NAME_INVALID))
            self.close()
            return
        username = self.peer_username or p.username or None
        access = self.server.authorizer.access(self.namespace, username)
        if not access.may_access():
            self._refuse_connect(rc.NOT_AUTHORIZED, "the ACLs give no access", p)
            return
        if p.will is not None and not access.may_publish(p.will.topic):
            # As Mosquitto: a will the client may not publish refuses the CONNECT.
            self._refuse_connect(rc.NOT_AUTHORIZED, f"will topic {p.will.topic[:100]!r}", p)
            return
        self.access = access
        self.acl_publish = access.publish
        client_id = p.client_id
        assigned = None
        if not client_id:
            if not v5 and not p.clean_start:
                self.send(Connack(False, rc.CONNACK_IDENTIFIER_REJECTED))
                self.close()
                return
            client_id = assigned = "flowmq-" + secrets.token_hex(8)
        self.client_id = client_id
        self.username = username
        if v5:
            expiry = props.get("session_expiry_interval", 0)
            self.client_receive_maximum = props.get("receive_maximum", 65535)
            self.client_max_packet = props.get("maximum_packet_size")
            self.client_alias_maximum = props.get("topic_alias_maximum", 0)
        else:
            expiry = 0 if p.clean_start else NEVER_EXPIRES
        expiry = self._capped_expiry(expiry)

        server = self.server
        key = (self.namespace, client_id)
        if expiry and key not in server.sessions and server.sessions_full(self.namespace):
            metrics.record_limit_refusal({"limit": "mqtt_max_sessions"})
            self._refuse_connect(
                rc.QUOTA_EXCEEDED, "the namespace's persistent sessions (mqtt_max_sessions)", p
            )
            return
        cluster = server.cluster
        in_cluster = cluster is not None and cluster.has_peers
        existing = server.sessions.get(key)
        if p.clean_start:
            later = server.connecting(key)
        else:  # the session may be elsewhere, or not ours any more, or have stored messages
            later = in_cluster or existing is None or existing.stored or server.connecting(key)
        if later:
            self._held = []  # packets the client sends meanwhile wait their turn
            if self.transport is not None:  # …and it sends no more until then
                self.transport.pause_reading()
            self._loop.create_task(self._connect_later(p, expiry, assigned))
            return
        if in_cluster:  # a clean start: the others end theirs
            server.kick(self.namespace, client_id, clean=True)
        self._attach_session(p, expiry, assigned)

    def _capped_expiry(self, expiry: int) -> int:
        """``expiry`` within ``mqtt_max_session_expiry``; a v5 request lowered is counted."""
        cap = self.server.max_session_expiry
        if expiry <= cap:
            return expiry
        if self.level == 5:
            metrics.limits_rejections_count.labels("session_expiry").inc()
            log.info(
                "mqtt %s: session expiry %d s lowered to %d s (mqtt_max_session_expiry)",
                self.client_id,
                expiry,
                cap,
            )
        return cap

    async def _connect_later(self, p: Connect, expiry: int, assigned: str | None) -> None:
        """CONNECT once the session is here: fetched from another node, its offline store
        emptied into its queue (so stored messages go out first, in order).  One CONNECT of
        a client id at a time (a client that gave up on a paused node left several waiting
        in its socket): each looks at the session as the previous one left it."""
        server = self.server
        key = (self.namespace, self.client_id)
        turn = await server.connect_turn(key)
        try:
            taken = await self._take_session(p)
            if taken is not None and server.sessions.get(key) is not taken:
                # Let go while it was being taken (a SUBSCRIBE of an earlier connection found
                # the record another node's: adopted while this one was paused): taken again,
                # from where the record says it is, rather than a new session beside it.
                await self._take_session(p)
            held, self._held = self._held or [], None
            if self.closing:
                self._release_taken(key)
                return
            self._resume_reading()
            stored = self._attach_session(p, expiry, assigned)
            self._replay(held)
            self.delivery.flush_dirty()
            if stored is not None:
                # The next CONNECT of this client id looks at the session as its record left
                # it.  Ended meanwhile (the record named another node: adopted while this
                # one was paused), the session was gone when that CONNECT attached, which
                # then started a new one beside the adopter's (session present 0): queued
                # CONNECTs of a client that gave up on a paused node each did so.
                await asyncio.shield(stored)
        finally:
            server.end_connect_turn(key, turn)

    def _release_taken(self, key: tuple[str, str]) -> None:
        """The client left while its session's stored messages were being taken: the
        session stays offline, so what was taken goes back to the store alone, as at any
        disconnect (``OfflineStore.release``).  Left in its queue it stayed in memory until
        the client id came back (fuzzed clients that gave up during a take left up to a
        thousand messages each)."""
        server = self.server
        session = server.sessions.get(key)
        if session is not None and session.connection is None and server.offline is not None:
            server.offline.release(session)

    async def _take_session(self, p: Connect) -> Session | None:
        """Make the session of a CONNECT current here.  Without clean start it may be on
        another node, or have outlived a dead one (its record is in the meta store): taken
        over first.  One held here is resumed only if its record still
        names this node: another may have adopted it while this one was declared dead
        (paused); then it is taken over from that node, as if it had never been here.  With
        clean start, or once the session is here, the other nodes end theirs."""
        server = self.server
        key = (self.namespace, self.client_id)
        cluster = server.cluster
        in_cluster = cluster is not None and cluster.has_peers
        try:
            existing = server.sessions.get(key)
            fetch = not p.clean_start and existing is None
            if not fetch and in_cluster:
                if p.clean_start or not existing.persistent():
                    server.kick(self.namespace, self.client_id, clean=bool(p.clean_start))
                elif (holder := await server.session_holder(*key)) in (None, server.node_id):
                    server.kick(self.namespace, self.client_id, clean=False)
                elif server.sessions.get(key) is existing:
                    log.info("mqtt %s: its session moved to another node", self.client_id)
                    if existing.connection is not None:
                        existing.connection.take_over()
                    # Its route stays until every node routes the session to the holder (or
                    # to this node again, the session fetched back): removed at once, the
                    # base of the pause test lost 2 messages so, the adopter's route not out.
                    server.discard_session(
                        existing, forget=False, redistribute=False, handed_to=holder
                    )
                    fetch = True
            if fetch:
                await server.fetch_session(self.namespace, self.client_id)
                # Its subscriptions are routed here once CONNACK goes out, as after a SUBACK.
                routed = cluster.routes_published() if cluster is not None else None
                if routed is not None:
                    await routed
            session = server.sessions.get(key)
            offline = server.offline
            if not p.clean_start and session is not None and session.stored and offline is not None:
                # Its stored messages go out after CONNACK, a page at a time, before newer
                # ones (offline.py): CONNACK waits for none of them.
                offline.start_drain(session)
            return session
        except Exception:
            log.exception("mqtt %s: could not take the session over", self.client_id)
            return None

    def _attach_session(
        self, p: Connect, expiry: int, assigned: str | None
    ) -> asyncio.Task[None] | None:
        """CONNECT, second half: the session is here (or nowhere): take it, send CONNACK.
        Returns the store of a persistent session's record (None: nothing to store)."""
        server = self.server
        client_id = self.client_id
        v5 = self.level == 5
        key = (self.namespace, client_id)
        existing = server.sessions.get(key)
        if existing is not None and existing.connection is not None:
            existing.connection.take_over()
        if existing is not None:
            if existing.expiry_handle is not None:
                existing.expiry_handle.cancel()
                existing.expiry_handle = None
            if existing.will_handle is not None:  # reconnected within the will delay
                existing.will_handle.cancel()
                existing.will_handle = existing.pending_will = None
        session_present = existing is not None and not p.clean_start
        if existing is not None and p.clean_start:
            server.discard_session(existing)
        session = existing if session_present else Session(client_id, self.namespace)
        server.sessions[key] = session
        if session_present and session.username != self.username:
            session.username = self.username
            server.revoke_denied(session)  # its subscriptions were another user's grants
        session.username = self.username
        session.connection = self
        session.expiry_interval = expiry
        server.count_persistence(session)
        self.session = session
        self.will = p.will
        self.keep_alive = p.keep_alive
        server_keep_alive = None
        limit = server.max_keep_alive
        if p.keep_alive == 0 or p.keep_alive > limit:
            self.keep_alive = limit
            if v5:
                server_keep_alive = limit
        self.m.connections.inc()

        ack_props: dict[str, Any] = {}
        if v5:
            ack_props = {
                "receive_maximum": SERVER_RECEIVE_MAXIMUM,
                "topic_alias_maximum": SERVER_TOPIC_ALIAS_MAXIMUM,
                "maximum_packet_size": server.max_packet_size,
            }
            if assigned:
                ack_props["assigned_client_identifier"] = assigned
            if expiry != p.properties.get("session_expiry_interval", 0):  # MQTT-3.2.2.3.2
                ack_props["session_expiry_interval"] = expiry
            if server_keep_alive is not None:
                ack_props["server_keep_alive"] = server_keep_alive
        self.send(Connack(session_present, rc.SUCCESS, ack_props))
        self.peer = self._peer()
        log.info(
            "mqtt %s: connected from %s (MQTT %s, %s, %s session, keep alive %d s)",
            client_id,
            self.peer,
            "5.0" if v5 else "3.1.1",
            f"user {self.username!r}" if self.username is not None else "anonymous",
            "resumed" if session_present else "new",
            self.keep_alive,
        )
        self._start_keep_alive()
        if session_present:
            self._resume(session)
        if session.persistent():
            return self._loop.create_task(self._store_session(session, resumed=session_present))
        return None

    async def _store_session(self, session: Session, *, resumed: bool) -> None:
        """Store the session's record.  If the meta store fails, the client must not go on
        believing its session outlives the connection, and CONNACK is out already (MQTT has
        no later answer to a CONNECT): it is disconnected (v5 0x80, 3.1.1 closed), and a new
        session goes with it (nothing of it is stored: a reconnect is told session present
        0, as after a restart); a resumed one stays as it was last stored."""
        try:
            server = self.server
            if not await server.save_session(session):
                # Adopted by another node meanwhile (this one was declared dead): the
                # client takes it over from there when it reconnects.  This node's route
                # stays until every node routes the session to that one (``hand_over``).
                holder = await server.session_holder(session.namespace, session.client_id)
                if session.connection is self:
                    self.take_over()
                if server.sessions.get((session.namespace, session.client_id)) is session:
                    server.discard_session(
                        session, forget=False, redistribute=False, handed_to=holder
                    )
        except Exception as exc:
            log.warning("mqtt %s: could not store the session: %s", self.client_id, exc)
            ours = session.connection is self
            if ours:
                self.disconnect(rc.UNSPECIFIED_ERROR, "the session could not be stored")
            key = (session.namespace, session.client_id)
            alone = ours or session.connection is None  # not taken over meanwhile
            if not resumed and alone and self.server.sessions.get(key) is session:
                self._detach()
                self.server.discard_session(session, forget=False)

    def _resume(self, session: Session) -> None:
        # Everything in flight is resent with its original packet id (MQTT-4.4.0-1), in the
        # order first sent, as far as the client's (possibly new, smaller) receive maximum
        # allows; the rest goes out as acknowledgements free the window.
        session.unsent = deque(session.inflight)
        self.send_queued()

    # --- inbound PUBLISH ----------------------------------------------------------------
    def _on_publish(self, p: Publish, raw: bytes | None = None, plain1: bool = False) -> None:
        """A PUBLISH; ``raw``: the packet as received, if it is a plain QoS 0 one; ``plain1``:
        it is a plain QoS 1 one."""
        session = self.session
        if session is None:
            self.disconnect(rc.PROTOCOL_ERROR, "PUBLISH before CONNECT")
            return
        topic = p.topic
        props = p.properties
        if self.level == 5 and props:
            alias = props.get("topic_alias")
            if alias is not None:
                if not 0 < alias <= SERVER_TOPIC_ALIAS_MAXIMUM:
                    self.disconnect(rc.TOPIC_ALIAS_INVALID, f"topic alias {alias} out of range")
                    return
                if topic:
                    self.in_aliases[alias] = topic
                else:
                    topic = self.in_aliases.get(alias, "")
                    if not topic:
                        self.disconnect(rc.PROTOCOL_ERROR, f"unknown topic alias {alias}")
                        return
        # The codec has already checked UTF-8, U+0000 and length; wildcards are left to us.
        if "+" in topic or "#" in topic:
            self.disconnect(rc.TOPIC_NAME_INVALID, f"wildcard in PUBLISH topic {topic[:100]!r}")
            return
        if len(topic) >= MAX_TOPIC_LEVELS and _over_limit(topic):
            self.disconnect(rc.TOPIC_NAME_INVALID, f"PUBLISH topic over the limits {topic[:100]!r}")
            return
        if props and _has_wildcard(props.get("response_topic")):  # MQTT-3.3.2-14
            self.disconnect(rc.PROTOCOL_ERROR, "wildcard in the response topic")
            return
        qos = p.qos
        packet_id = p.packet_id
        if qos == 2 and packet_id in session.incoming_qos2:
            self.send(Pubrec(packet_id))  # a resent QoS 2 PUBLISH: already routed once
            return
        if qos and len(session.incoming_qos2) + len(self._acks) >= SERVER_RECEIVE_MAXIMUM:
            self.disconnect(rc.RECEIVE_MAXIMUM_EXCEEDED, "too many unacknowledged QoS 1/2 PUBLISH")
            return
        namespace = self.namespace
        self._in_count += 1  # added to the metrics once per read, in data_received
        self._in_bytes += len(p.payload)
        allowed = self.acl_publish.get(topic)
        if allowed is None:
            assert self.access is not None
            allowed = self.access.may_publish(topic)
        if not allowed:
            # v5: PUBACK / PUBREC 0x87; 3.1.1 has no negative acknowledgement: the usual
            # PUBACK / PUBREC goes out and the message is dropped, as Mosquitto does.
            self.m.dropped.inc()
            if qos:
                ack = Puback if qos == 1 else Pubrec
                self.send(ack(packet_id, rc.NOT_AUTHORIZED if self.level == 5 else rc.SUCCESS))
            return
        checked = self._checked_topics() if raw is not None or plain1 else None
        if checked is not None:
            # Plain QoS 0 and 1: if only plain subscribers want it, here or on other nodes (no
            # Stream, Queue or shared group), the topic is remembered as checked with its
            # route plan (_handle_all takes the next ones straight, a run at a time).  QoS 0
            # goes by that plan now, as the bytes it came in.
            delivery = self.delivery
            try:
                plan = delivery.plan(delivery.plans(namespace), namespace, topic)
            except DestinationUnavailable:
                if raw is not None:
                    self.m.dropped.inc()
                    return
                plan = None  # QoS 1: refused below, as dispatch finds it unavailable too
            if plan is not None and plan.direct:
                if len(checked) >= MAX_CHECKED_TOPICS:
                    checked.clear()
                checked[topic] = plan
                if raw is not None:
                    delivery.publish_run(self, plan, topic, [raw], len(p.payload))
                    delivery.send_forwards()
                    delivery.count(namespace, 1, len(plan.bindings))
                    return
        message = message_from(topic, p.payload, qos, p.retain, props, self.client_id)
        pending: list[Any] = []
        if p.retain:
            try:
                retained = self.server.retained.set(namespace, message)
            except QuotaExceeded as exc:
                if qos and self.level == 5:  # refused, not delivered: the publisher is told
                    ack = Puback if qos == 1 else Pubrec
                    self._queue_ack([], ack, packet_id, rc.QUOTA_EXCEEDED, str(exc))
                    return
                retained = None  # QoS 0 and 3.1.1 cannot be told: delivered, not retained
            if retained is not None:
                if qos:
                    pending.append(retained)
                else:
                    self._in_background(retained)
        try:
            bindings, durable = self.delivery.dispatch(namespace, message, self)
        except DestinationUnavailable as exc:
            if qos:
                self._refuse(packet_id, qos, str(exc))
            else:
                self.m.dropped.inc()
            for awaitable in pending:
                self._in_background(awaitable)
            return
        if durable and self.delivery.pressure.active:  # backpressure.py
            self._pause_for_pressure()
        if not qos:
            for awaitable in durable:
                self._in_background(awaitable)
            return
        pending.extend(durable)
        success = rc.SUCCESS if bindings or self.level != 5 else rc.NO_MATCHING_SUBSCRIBERS
        if qos == 2:
            session.incoming_qos2.add(packet_id)
        ack = Puback if qos == 1 else Pubrec
        self._queue_ack(pending, ack, packet_id, success)

    def _pause_for_pressure(self) -> None:
        """Durable writes lag: handle nothing more from this client until they caught up,
        not even the rest of the read in hand (kept in ``_unread``).  A read holds up to a
        few thousand PUBLISH packets, each fanned out to up to every offline session: handled
        after the mark was passed, a few connections' reads took the writes waiting past it
        many times over (an MQTT fuzz run: ~10,000 stores of ~1 KB waiting at once)."""
        if self.delivery.pause_for_pressure(self, self._pressure_over):
            self._unread = []

    def _pressure_over(self) -> None:
        """The pressure ended (called by ``Backpressure`` from the batcher's bookkeeping):
        the rest of the read is handled in a callback of its own."""
        self._loop.call_soon(self._read_on)

    def _read_on(self) -> None:
        """Handle what was read and not handled yet (stopping again if the pressure came
        back meanwhile), then read again unless something else holds the connection."""
        unread, self._unread = self._unread, None
        if self.closing or unread is None:
            return
        try:
            self._replay(unread)
        finally:
            self._after_read()
        self._resume_reading()

    def _refuse(self, packet_id: int, qos: int, why: str) -> None:
        if self.level == 5:
            ack = Puback if qos == 1 else Pubrec
            self._queue_ack([], ack, packet_id, rc.UNSPECIFIED_ERROR, why)
        else:  # 3.1.1 has no negative acknowledgement: closing is the only honest answer
            self.disconnect(rc.UNSPECIFIED_ERROR, why)

    def _queue_ack(
        self, pending: list[Any], ack: type, packet_id: int, reason: int, why: str = ""
    ) -> None:
        """Acknowledge in the order the PUBLISH packets came (MQTT-4.6.0-2), each only once
        everything it waited for (durable destinations, retained store) is done."""
        if not pending and not self._acks:
            if ack is Puback and not reason:  # the common case, without an encoder call
                self.write(bytes((0x40, 2, packet_id >> 8, packet_id & 0xFF)))
                return
            self.send(
                ack(packet_id, reason, {"reason_string": why} if why and self.level == 5 else {})
            )
            return
        if not pending:
            waiter = None
        elif len(pending) == 1 and asyncio.isfuture(pending[0]):
            waiter = pending[0]  # one durable destination: no gathering future around it
        else:
            waiter = asyncio.gather(*pending)
        entry = [waiter, ack, packet_id, reason]
        self._acks.append(entry)
        if waiter is not None:
            waiter.add_done_callback(lambda _: self._drain_acks())
        else:
            self._drain_acks()

    def _drain_acks(self) -> None:
        while self._acks:
            waiter, ack, packet_id, reason = self._acks[0]
            if waiter is not None and not waiter.done():
                return
            self._acks.popleft()
            if self.closing:
                if waiter is not None and not waiter.cancelled():
                    waiter.exception()  # retrieved: the client, and its ack, are gone
                continue
            if waiter is not None and waiter.exception() is not None:
                exc = waiter.exception()
                failure = f"not stored: {exc}"
                # A full queue (an offline session's, a Queue's max_size_mb) is a quota.
                code = rc.QUOTA_EXCEEDED if isinstance(exc, QueueFull) else rc.UNSPECIFIED_ERROR
                if self.level != 5:
                    self.disconnect(code, failure)
                    continue
                self.send(ack(packet_id, code, {"reason_string": failure[:200]}))
            else:
                self.send(ack(packet_id, reason))

    def _on_pubrel(self, p: Pubrel) -> None:
        session = self.session
        if session is not None and p.packet_id in session.incoming_qos2:
            session.incoming_qos2.discard(p.packet_id)
            self.send(Pubcomp(p.packet_id))
        else:
            self.send(Pubcomp(p.packet_id, rc.PACKET_ID_NOT_FOUND if self.level == 5 else 0))

    # --- outbound PUBLISH -----------------------------------------------------------------
    def send_queued(self) -> None:
        session = self.session
        assert session is not None
        delivery = self.delivery
        delivery.relieve(session)
        window = self.client_receive_maximum
        unsent = session.unsent
        while unsent and len(session.inflight) - len(unsent) < window:
            packet_id = unsent.popleft()
            out = session.outgoing(packet_id)
            if out is None:
                continue
            if out.released:
                self.send(Pubrel(packet_id))
            else:
                delivery.write_publish(
                    self, out.message, out.qos, out.retain, out.properties, packet_id, dup=True
                )
        max_bytes = delivery.max_inflight_bytes
        while (
            session.queue
            and len(session.inflight) < window
            # Past the byte bound one message still goes when nothing else is in flight.
            and (session.inflight_bytes < max_bytes or not session.inflight)
        ):
            message, qos, retain, extra = session.queue.popleft()
            if message.expiry_ms is not None and message.expiry_ms <= now_ms():
                self.m.dropped.inc()
                self._settled(session, extra)
                continue
            packet_id = session.allocate_packet_id()
            session.add_inflight(packet_id, Outgoing(message, qos, retain, extra))
            delivery.write_publish(self, message, qos, retain, extra, packet_id)
        if session.draining and self.server.offline is not None:
            self.server.offline.feed(session)  # the next page of its backlog, if room

    def _settled(self, session: Session, extra: dict[str, Any]) -> None:
        """A message read from the session's stored backlog is done with (acknowledged,
        refused by the client, expired): it may go from the store."""
        seq = extra.get(STORED_SEQ)
        if seq is not None and self.server.offline is not None:
            self.server.offline.acked(session, seq)

    def _on_puback(self, p: Puback) -> None:
        session = self.session
        if session is None:
            return
        out = session.remove_inflight(p.packet_id)
        if out is not None:
            if out.__class__ is not list:  # (a run's item as it came is never a stored one)
                self._settled(session, out.properties)
            self.send_queued()

    def _on_pubrec(self, p: Pubrec) -> None:
        session = self.session
        out = session.outgoing(p.packet_id) if session else None
        if out is None or out.qos != 2:
            self.send(Pubrel(p.packet_id, rc.PACKET_ID_NOT_FOUND if self.level == 5 else 0))
            return
        if p.reason_code >= 0x80:  # the receiver refused it: the flow ends here
            session.remove_inflight(p.packet_id)
            self._settled(session, out.properties)
            self.send_queued()
            return
        out.released = True
        self.send(Pubrel(p.packet_id))

    def _on_pubcomp(self, p: Pubcomp) -> None:
        self._on_puback(p)  # type: ignore[arg-type]

    # --- subscriptions --------------------------------------------------------------------
    def _on_subscribe(self, p: Subscribe) -> None:
        session = self.session
        assert session is not None
        server = self.server
        v5 = self.level == 5
        identifier = p.properties.get("subscription_identifier") if v5 else None
        if isinstance(identifier, list):
            identifier = identifier[0] if identifier else None
        codes: list[int] = []
        retained_to_send: list[tuple[Message, Subscription]] = []
        over_quota = 0
        for topic_filter, options in p.subscriptions:
            try:
                validate_subscription_filter(topic_filter)
                shared = parse_shared(topic_filter)
            except InvalidFilter as exc:
                metrics.record_limit_refusal(exc.details)
                codes.append(rc.TOPIC_FILTER_INVALID if v5 else rc.SUBACK_FAILURE)
                continue
            if shared is not None and options.no_local:
                self.disconnect(rc.PROTOCOL_ERROR, "No Local set on a shared subscription")
                return
            inner = shared.filter if shared else topic_filter
            assert self.access is not None
            if not self.access.may_subscribe(inner):
                # Not active: nothing is bound, a subscription of the same filter is removed.
                old = session.subscriptions.pop(topic_filter, None)
                if old is not None:
                    server.unbind(session, old)
                    session.subscriptions_changed()
                codes.append(rc.NOT_AUTHORIZED if v5 else rc.SUBACK_FAILURE)
                continue
            existed = topic_filter in session.subscriptions
            if not existed and len(session.subscriptions) >= server.max_subscriptions:
                over_quota += 1  # a new filter past mqtt_max_subscriptions; replacing is fine
                codes.append(rc.QUOTA_EXCEEDED if v5 else rc.SUBACK_FAILURE)
                continue
            sub = Subscription(inner, options, identifier, shared.group if shared else None)
            if existed:
                server.unbind(session, session.subscriptions[topic_filter])
            session.subscriptions[topic_filter] = sub
            session.subscriptions_changed()
            server.bind(session, sub)
            codes.append(options.qos)
            send_retained = shared is None and (
                options.retain_handling == 0 or (options.retain_handling == 1 and not existed)
            )
            if send_retained:
                retained_to_send.extend(
                    (m, sub) for m in server.retained.matching(self.namespace, inner)
                )
        if over_quota:
            self._subscriptions_refused(over_quota)
        server.update_subscription_gauge()
        self._answer_when_kept(
            session, lambda: self._finish_subscribe(p.packet_id, codes, retained_to_send)
        )

    def _answer_when_kept(self, session: Session, answer: Callable[[], None]) -> None:
        """Answer a SUBSCRIBE or UNSUBSCRIBE once its change is kept: a persistent session's
        record committed (a SUBACK the client saw must not be undone by this broker's
        restart) and, in a cluster, the routes published (other brokers forward to us only
        once they know the new filters).  Reading waits meanwhile, so that later packets are
        answered in order."""
        waits: list[Any] = []
        if session.persistent():
            waits.append(self._loop.create_task(self._store_session(session, resumed=True)))
        cluster = self.server.cluster
        routed = cluster.routes_published() if cluster is not None else None
        if routed is not None:
            waits.append(routed)
        if not waits:
            answer()
            return
        if self.transport is not None:
            self.transport.pause_reading()
        self._changes_waiting += 1

        def kept(_: Any) -> None:
            self._changes_waiting -= 1
            if self.transport is None or self.closing:
                return  # the record could not be stored: disconnected, nothing to answer
            answer()
            self.flush()
            self._resume_reading()

        both = waits[0] if len(waits) == 1 else asyncio.gather(*waits, return_exceptions=True)
        both.add_done_callback(kept)

    def _subscriptions_refused(self, count: int) -> None:
        metrics.limits_rejections_count.labels("subscriptions").inc(count)
        log.info(
            "mqtt %s: %d filter(s) refused: the session holds %d subscriptions "
            "(mqtt_max_subscriptions)",
            self.client_id,
            count,
            self.server.max_subscriptions,
        )

    def _finish_subscribe(
        self,
        packet_id: int,
        codes: list[int],
        retained_to_send: list[tuple[Message, Subscription]],
    ) -> None:
        self.send(Suback(packet_id, codes))
        for message, sub in retained_to_send:
            qos = min(message.qos, sub.options.qos)
            ids = [sub.identifier] if sub.identifier else []
            self.delivery.send(self, message, qos, True, ids)

    def _on_unsubscribe(self, p: Unsubscribe) -> None:
        session = self.session
        assert session is not None
        codes = []
        for topic_filter in p.filters:
            sub = session.subscriptions.pop(topic_filter, None)
            session.subscriptions_changed()
            if sub is None:
                codes.append(rc.NO_SUBSCRIPTION_EXISTED)
            else:
                self.server.unbind(session, sub)
                codes.append(rc.SUCCESS)
        self.server.update_subscription_gauge()
        self._answer_when_kept(session, lambda: self.send(Unsuback(p.packet_id, codes)))

    def _on_pingreq(self, p: Pingreq) -> None:
        self.send(Pingresp())

    def _on_disconnect(self, p: Disconnect) -> None:
        session = self.session
        self.end_reason = "DISCONNECT from the client"
        if self.level == 5:
            if p.reason_code != rc.DISCONNECT_WITH_WILL_MESSAGE:
                self.will = None
            expiry = p.properties.get("session_expiry_interval")
            if expiry is not None and session is not None:
                # (With mqtt_max_session_expiry 0 every session has 0, whatever was asked.)
                if session.expiry_interval == 0 and expiry != 0 and self.server.max_session_expiry:
                    self.will = None
                    self.disconnect(
                        rc.PROTOCOL_ERROR, "session expiry set at DISCONNECT after 0 at CONNECT"
                    )
                    return
                session.expiry_interval = self._capped_expiry(expiry)
        else:
            self.will = None
        self.close()

    def _on_auth(self, p: Auth) -> None:
        self.disconnect(rc.PROTOCOL_ERROR, "AUTH without an authentication method")


async def _log_failure(awaitable: Any) -> None:
    try:
        await awaitable
    except Exception:
        log.exception("background publish failed")


def _log_background_failure(done: asyncio.Future[Any]) -> None:
    if not done.cancelled() and done.exception() is not None:
        log.error("background publish failed", exc_info=done.exception())


def _has_wildcard(topic: str | None) -> bool:
    return topic is not None and ("+" in topic or "#" in topic)


_HANDLERS = {
    Connect: MqttConnection._on_connect,
    Publish: MqttConnection._on_publish,
    Puback: MqttConnection._on_puback,
    Pubrec: MqttConnection._on_pubrec,
    Pubrel: MqttConnection._on_pubrel,
    Pubcomp: MqttConnection._on_pubcomp,
    Subscribe: MqttConnection._on_subscribe,
    Unsubscribe: MqttConnection._on_unsubscribe,
    Pingreq: MqttConnection._on_pingreq,
    Disconnect: MqttConnection._on_disconnect,
    Auth: MqttConnection._on_auth,
}
