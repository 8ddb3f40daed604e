"""One AMQP channel: its frames, its method dispatch and its publishes (with confirms).

Owns the channel's life cycle (open, flow, close on a soft error), content assembly for
Basic.Publish, routing the published message and confirming it once every destination has it.
The consuming side (consumers, deliveries, acks) is ``Consumers`` (consumers.py); exchange and
queue methods are worked by ``Topology`` (topology.py), and answered here.

Per-message methods (Basic.Publish + content, Basic.Ack/Nack/Reject, deliveries) are handled
synchronously from the frames of one read; methods that need the meta store (declares,
binds, Basic.Get ...) run as a task while later frames of the channel wait, so the channel
still processes its frames in order.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from pamqp import commands

import flowmq_metrics as metrics
from flowmq_broker.amqp import messages
from flowmq_broker.amqp.consumers import Consumers
from flowmq_broker.amqp.errors import AmqpError, ChannelError, ConnectionError_
from flowmq_broker.amqp.link import Link
from flowmq_broker.amqp.state import AmqpState
from flowmq_broker.amqp.topology import Topology
from flowmq_broker.routing import DestinationUnavailable, DispatchPlan
from flowmq_core.acl import CONSUME, QUEUE
from flowmq_core.errors import FlowMQError
from flowmq_queue.errors import QueueFull
from flowmq_wire.amqp import constants as rc
from flowmq_wire.amqp import frames as fr
from flowmq_wire.amqp.methods import UnknownMethod, decode_method, encode_method

log = logging.getLogger(__name__)

_CLOSE_METHODS = (0x00140028, 0x00140029)  # Channel.Close, Channel.CloseOk


class _Content:
    """A Basic.Publish waiting for its content header and body frames."""

    __slots__ = ("body", "exchange", "mandatory", "props", "received", "routing_key", "size")

    def __init__(self, exchange: str, routing_key: str, mandatory: bool) -> None:
        self.exchange = exchange
        self.routing_key = routing_key
        self.mandatory = mandatory
        self.props: bytes | None = None
        self.size = 0
        self.received = 0
        self.body: list[bytes] = []


class Channel:
    def __init__(self, conn: Link, shared: AmqpState, number: int) -> None:
        self.conn = conn
        self.number = number
        self.shared = shared
        self.topology = Topology(shared, conn)
        self.consumers = Consumers(conn, shared, number)
        self.closing = False  # we sent Channel.Close and wait for CloseOk
        self.closed = False
        self.confirm = False
        self.publish_seq = 0
        self._confirms: collections.deque[list[Any]] = collections.deque()
        self._confirm_scheduled = False
        self._finished = 0  # destinations that stored a confirmed publish since the last batch
        # This channel's publishes not yet stored: a Basic.Get waits for them, so a get
        # after a publish on the same channel sees it (RabbitMQ's per-channel ordering).
        self._storing: collections.deque[asyncio.Future[Any]] = collections.deque()
        self.last_queue = ""
        self._content: _Content | None = None
        # Messages routed by plan in the current run, and their deliveries (counted at its end).
        self._planned = [0, 0]
        self._blocked = False
        self._backlog: collections.deque[tuple[int, bytes]] = collections.deque()
        # Metric children resolved once: a labels() lookup per message shows in profiles.
        ns = conn.namespace
        self._in_count = metrics.amqp_messages_in_count.labels(ns)
        self._in_bytes = metrics.amqp_messages_in_bytes_count.labels(ns)

    # --- frames -------------------------------------------------------------------------

    def handle_frame(self, frame_type: int, payload: bytes) -> None:
        if self._blocked:
            self._backlog.append((frame_type, payload))
            return
        try:
            self._handle(frame_type, payload)
        except Exception as exc:
            self._refuse(exc, frame_type, payload)

    def handle_run(self, frame_type: int, run: list[Any]) -> None:
        """A run of whole publishes (``fr.FRAME_PUBLISH``) or acks (``fr.FRAME_ACK``) from one
        read, handled together; frame by frame while the channel is not in its plain state."""
        if self._blocked or self._content is not None or self.closing:
            for payload in run:
                self.handle_frame(frame_type, payload)
            return
        try:
            if frame_type == fr.FRAME_PUBLISH:
                self._publish_run(run)
            else:
                self._ack_run(run)
        except Exception as exc:
            # The channel or the connection is closing now: the rest of the run is dropped,
            # as the generic path drops every frame after a refusal.
            self._refuse(exc, frame_type, run[0])

    def _refuse(self, exc: Exception, frame_type: int, payload: Any) -> None:
        """The protocol's close reply for what handling a frame raised (others propagate)."""
        if isinstance(exc, ChannelError):
            self.fail(exc.code, exc.text, self._failing_method(frame_type, payload))
        elif isinstance(exc, AmqpError):
            self.conn.fail(exc.code, exc.text, self._failing_method(frame_type, payload))
        elif isinstance(exc, fr.SyntaxError_):
            method = self._failing_method(frame_type, payload)
            self.conn.fail(rc.SYNTAX_ERROR, f"SYNTAX_ERROR - {exc}", method)
        elif isinstance(exc, UnknownMethod):  # here too: a frame replayed from the backlog
            method = self._failing_method(frame_type, payload)
            self.conn.fail(rc.NOT_IMPLEMENTED, f"NOT_IMPLEMENTED - {exc}", method)
        else:
            raise exc

    @staticmethod
    def _failing_method(frame_type: int, payload: Any) -> int:
        if frame_type >= fr.FRAME_PUBLISH:
            return fr.PSEUDO_METHODS[frame_type]
        return fr.method_index(payload) if len(payload) >= 4 else 0

    def _handle(self, frame_type: int, payload: Any) -> None:
        content = self._content
        if content is not None:
            # A recognised publish or ack is a method frame, out of place here.
            kind = fr.FRAME_METHOD if frame_type >= fr.FRAME_PUBLISH else frame_type
            self._content_frame(content, kind, payload)
            return
        if frame_type == fr.FRAME_PUBLISH:
            if not self.closing:
                self._publish_run([payload])
            return
        if frame_type == fr.FRAME_ACK:
            if not self.closing:
                self._ack_run([payload])
            return
        if self.closing:
            # We sent Channel.Close: everything but Close/CloseOk is dropped, the rest of a
            # refused message's content frames included (spec 4.2.2 / RabbitMQ).
            if frame_type == fr.FRAME_METHOD and fr.method_index(payload) in _CLOSE_METHODS:
                self._method(decode_method(payload))
            return
        if frame_type != fr.FRAME_METHOD:
            raise ConnectionError_(
                rc.UNEXPECTED_FRAME, f"content frame (type {frame_type}) without Basic.Publish"
            )
        index = fr.method_index(payload)
        if index == fr.BASIC_PUBLISH:
            exchange, routing_key, mandatory, immediate = fr.decode_publish(payload)
            if immediate:
                raise ConnectionError_(rc.NOT_IMPLEMENTED, "immediate=true is not supported")
            self._content = _Content(exchange, routing_key, mandatory)
        elif index == fr.BASIC_ACK:
            tag, bits = fr.decode_tag_bits(payload)
            consumers = self.consumers
            for d in consumers.take_unacked(tag, bool(bits & 1)):
                consumers.settle(d, None)
        elif index == fr.BASIC_NACK:
            tag, bits = fr.decode_tag_bits(payload)
            requeue = bool(bits & 2)
            consumers = self.consumers
            for d in consumers.take_unacked(tag, bool(bits & 1)):
                consumers.settle(d, requeue)
        elif index == fr.BASIC_REJECT:
            tag, bits = fr.decode_tag_bits(payload)
            consumers = self.consumers
            for d in consumers.take_unacked(tag, False):
                consumers.settle(d, bool(bits & 1))
        else:
            self._method(decode_method(payload))

    def _content_frame(self, content: _Content, frame_type: int, payload: bytes) -> None:
        if content.props is None:
            if frame_type != fr.FRAME_HEADER:
                raise ConnectionError_(
                    rc.UNEXPECTED_FRAME, f"expected a content header, got frame type {frame_type}"
                )
            class_id, size, props = fr.decode_content_header(payload)
            if class_id != fr.CLASS_BASIC:
                raise ConnectionError_(rc.UNEXPECTED_FRAME, f"content header of class {class_id}")
            max_size = self.shared.limits.max_message_bytes
            if size > max_size:
                self._content = None
                raise _too_large(size, max_size)
            content.props = props
            content.size = size
            if size == 0:
                self._content = None
                self._publish_content(content, b"")
            return
        if frame_type != fr.FRAME_BODY:
            raise ConnectionError_(
                rc.UNEXPECTED_FRAME, f"expected a content body, got frame type {frame_type}"
            )
        content.received += len(payload)
        if content.received > content.size:
            raise ConnectionError_(rc.FRAME_ERROR, "content body is longer than its header said")
        if content.received == content.size:
            self._content = None
            self.conn.partial_bytes -= content.received - len(payload)
            if content.body:
                content.body.append(payload)
                body = b"".join(content.body)
            else:
                body = payload
            self._publish_content(content, body)
        else:
            conn = self.conn
            conn.partial_bytes += len(payload)
            if conn.partial_bytes > self.shared.limits.max_partial_bytes:
                metrics.limits_rejections_count.labels("amqp_partial_bytes").inc()
                raise ChannelError(
                    rc.PRECONDITION_FAILED,
                    f"PRECONDITION_FAILED - more than {self.shared.limits.max_partial_bytes} "
                    f"bytes of unfinished message bodies on this connection",
                )
            content.body.append(payload)

    def _ack_run(self, run: list[tuple[int, int]]) -> None:
        """Basic.Acks (``fr.FRAME_ACK``: delivery tag, multiple) in order."""
        self.consumers.ack_run(run)

    def _drop_content(self) -> None:
        """Forget a message still being received (its body bytes no longer count)."""
        content = self._content
        if content is not None:
            self._content = None
            if content.received < content.size:
                self.conn.partial_bytes -= content.received

    # --- publish ------------------------------------------------------------------------

    def _publish_content(self, content: _Content, body: bytes) -> None:
        """A publish assembled frame by frame."""
        assert content.props is not None
        topic = self._route(content.exchange, content.routing_key)
        self._in_count.inc()
        self._in_bytes.inc(len(body))
        self._publish(
            content.exchange, content.routing_key, content.mandatory, content.props, body, topic
        )

    def _publish_run(self, run: list[tuple[str, str, int, bytes, bytes]]) -> None:
        """Whole publishes (``fr.FRAME_PUBLISH``) in order: each exchange and routing key
        checked, and each topic matched, once per run; the counters counted once."""
        max_size = self.shared.limits.max_message_bytes
        routes: dict[tuple[str, str], tuple[str | None, DispatchPlan | None]] = {}
        count = size = 0
        self._planned = [0, 0]
        try:
            for exchange, routing_key, bits, props, body in run:
                if bits & 2:
                    raise ConnectionError_(rc.NOT_IMPLEMENTED, "immediate=true is not supported")
                n = len(body)
                if n > max_size:
                    raise _too_large(n, max_size)
                key = (exchange, routing_key)
                route = routes.get(key)
                if route is None:
                    topic = self._route(exchange, routing_key)
                    plan = (
                        None
                        if topic is None
                        else self.shared.router.dispatch_plan(self.conn.namespace, topic)
                    )
                    route = routes[key] = (topic, plan)
                count += 1
                size += n
                self._publish(exchange, routing_key, bits & 1, props, body, *route)
        finally:
            if count:
                self._in_count.inc(count)
                self._in_bytes.inc(size)
            messages_routed, deliveries = self._planned
            if messages_routed:
                self.shared.router.count_published(self.conn.namespace, messages_routed, deliveries)
            self.shared.queues.engine.hand_out_ahead()

    def _route(self, exchange_name: str, routing_key: str) -> str | None:
        """The canonical topic a publish to ``exchange_name`` with ``routing_key`` goes to
        (None: no topic expresses it), once the exchange and the publish are allowed."""
        conn = self.conn
        exchange = self.shared.exchanges.get(conn.namespace, exchange_name)
        if exchange is None:
            raise ChannelError(
                rc.NOT_FOUND, f"no exchange '{exchange_name}' in vhost '{conn.vhost}'"
            )
        if exchange.internal:
            raise ChannelError(
                rc.ACCESS_REFUSED, f"cannot publish to internal exchange '{exchange_name}'"
            )
        topic = self.shared.publish_topic(exchange_name, routing_key, exchange.type)
        if topic is not None:
            allowed = conn.access.publish.get(topic)
            if allowed is None:
                allowed = conn.access.may_publish(topic)
            if not allowed:  # as RabbitMQ: the channel is closed with 403
                raise ChannelError(
                    rc.ACCESS_REFUSED,
                    f"publish to topic '{topic}' (exchange "
                    f"'{exchange_name}', routing key '{routing_key}') refused",
                )
        return topic

    def _publish(
        self,
        exchange: str,
        routing_key: str,
        mandatory: int,
        props: bytes,
        body: bytes,
        topic: str | None,
        plan: DispatchPlan | None = None,
    ) -> None:
        """Route one allowed publish (by ``plan`` if given, else through the router); confirm
        it (if confirming) once its destinations have it."""
        seq = 0
        if self.confirm:
            self.publish_seq += 1
            seq = self.publish_seq
        pending: list[Awaitable[Any]] = []
        routed = False
        if topic is not None:
            message = messages.from_publish(topic, exchange, routing_key, props, body)
            try:
                if plan is None:
                    bindings, pending = self.shared.router.dispatch(self.conn.namespace, message)
                else:
                    bindings, targets = plan
                    for dest_type, binding in targets:
                        result = dest_type.accept_from(binding, message, None)
                        if result is not None:
                            pending.append(result)
                    planned = self._planned
                    planned[0] += 1
                    planned[1] += len(bindings)
            except DestinationUnavailable as exc:
                if seq:
                    self._confirm(seq, [], str(exc))
                    return
                raise ChannelError(rc.PRECONDITION_FAILED, str(exc)) from None
            routed = bool(bindings)
        if not routed and mandatory:
            conn = self.conn
            conn.send(
                fr.encode_return(
                    self.number,
                    rc.NO_ROUTE,
                    "NO_ROUTE",
                    exchange,
                    routing_key,
                    props,
                    body,
                    conn.frame_max,
                )
            )
        if seq:
            self._confirm(seq, pending)
        elif pending:
            self._track_publishes(pending)

    def _confirm(self, seq: int, pending: list[Awaitable[Any]], failure: str = "") -> None:
        entry: list[Any] = [seq, None]
        self._confirms.append(entry)
        if failure:
            entry[1] = False
        elif not pending:
            entry[1] = True
        else:
            self.conn.publish_started(len(pending))
            entry.append(len(pending))  # destinations still to report
            done = functools.partial(self._stored, entry)
            for awaitable in pending:
                if not isinstance(awaitable, asyncio.Future):
                    awaitable = asyncio.ensure_future(awaitable)
                self._hold(awaitable)
                awaitable.add_done_callback(done)
            return
        self._schedule_confirms()

    def _stored(self, entry: list[Any], f: asyncio.Future[Any]) -> None:
        """One destination of a confirmed publish has it (or failed)."""
        self._finished += 1  # told to the connection with the confirms, once per batch
        if (f.cancelled() or f.exception() is not None) and entry[1] is None:
            entry[1] = False
            if not f.cancelled() and not isinstance(f.exception(), QueueFull):
                log.warning("publish not stored: %s", f.exception())
        entry[2] -= 1
        if entry[2] == 0:
            if entry[1] is None:
                entry[1] = True
            self._schedule_confirms()

    def _schedule_confirms(self) -> None:
        if not self._confirm_scheduled:
            self._confirm_scheduled = True
            # Sent by ``AmqpState.send_due_confirms`` once a flush's futures have all been
            # told, in the same loop iteration; the call below is for the other cases (a
            # publish nothing stores, a destination that is not the batcher's).
            self.shared.confirms_due.add(self)
            # ``asyncio.get_running_loop()`` costs a getpid() system call.
            self.conn.loop.call_soon(self._send_confirms)

    def _send_confirms(self) -> None:
        """Confirm the finished prefix, acks coalesced with ``multiple``."""
        if not self._confirm_scheduled:
            return  # sent already (``AmqpState.send_due_confirms``)
        self._confirm_scheduled = False
        self.shared.confirms_due.discard(self)
        if self._finished:
            self.conn.publish_finished(self._finished)
            self._finished = 0
        if self.closed or self.closing:
            return
        confirms = self._confirms
        out: list[bytes] = []
        run_end = 0
        run_len = 0
        while confirms and confirms[0][1] is not None:
            entry = confirms.popleft()
            seq, ok = entry[0], entry[1]
            if ok:
                run_end = seq
                run_len += 1
                continue
            if run_len:
                out.append(fr.encode_ack(self.number, run_end, run_len > 1))
                run_len = 0
            out.append(fr.encode_nack(self.number, seq, False))
        if run_len:
            out.append(fr.encode_ack(self.number, run_end, run_len > 1))
        if out:
            self.conn.send(b"".join(out))

    def _track_publishes(self, pending: list[Awaitable[Any]]) -> None:
        """A publish without confirms: only failures matter (a full queue closes the
        channel); the pending count still bounds memory."""
        conn = self.conn
        conn.publish_started(len(pending))

        def done(f: asyncio.Future[Any]) -> None:
            conn.publish_finished(1)
            if not f.cancelled() and f.exception() is not None:
                self.publish_failed(f.exception())  # type: ignore[arg-type]
                conn.flush()

        for awaitable in pending:
            future = asyncio.ensure_future(awaitable)
            self._hold(future)
            future.add_done_callback(done)

    def _hold(self, future: asyncio.Future[Any]) -> None:
        """Remember a publish until stored (no callback of its own: the done ones are
        dropped from the front as later ones come)."""
        storing = self._storing
        while storing and storing[0].done():
            storing.popleft()
        storing.append(future)

    def publish_failed(self, exc: BaseException) -> None:
        """A publish without confirms could not be stored."""
        if self.closed or self.closing:
            return
        if isinstance(exc, QueueFull):
            self.fail(rc.PRECONDITION_FAILED, f"PRECONDITION_FAILED - {exc}", fr.BASIC_PUBLISH)
        else:
            log.warning("publish not stored: %s", exc)

    # --- deliveries ---------------------------------------------------------------------

    def set_paused(self, paused: bool) -> None:
        """Stop or resume deliveries (the connection's write buffer is full or drained)."""
        self.consumers.set_paused(paused)

    def cancel_consumers(self, match: Callable[[Any], bool]) -> None:
        """Cancel the consumers ``match`` picks and tell the client (their queue is going)."""
        self.consumers.cancel_where(match)

    # --- life cycle ---------------------------------------------------------------------

    def fail(self, code: int, text: str, method: int) -> None:
        """Close the channel for a soft error."""
        if self.closing or self.closed:
            return
        self.closing = True
        self._drop_content()
        self._backlog.clear()
        self.conn.send(
            encode_method(
                self.number, commands.Channel.Close(code, text, method >> 16, method & 0xFFFF)
            )
        )
        self.consumers.release()

    def close(self) -> None:
        self._drop_content()
        self.consumers.close()
        self.closed = True
        self._backlog.clear()

    # --- methods ------------------------------------------------------------------------

    def _method(self, method: Any) -> None:
        handler = _HANDLERS.get(type(method))
        if handler is None:
            unsupported = method.name.startswith(("Tx.", "Exchange.Bind", "Exchange.Unbind"))
            raise ConnectionError_(
                rc.NOT_IMPLEMENTED if unsupported else rc.COMMAND_INVALID,
                f"{method.name} is not {'implemented' if unsupported else 'valid on a channel'}",
            )
        result = handler(self, method)
        if asyncio.iscoroutine(result):
            self._blocked = True
            task = asyncio.get_running_loop().create_task(self._run_async(result, method))
            self.conn.tasks.add(task)
            task.add_done_callback(self.conn.tasks.discard)

    async def _run_async(self, coro: Awaitable[Any], method: Any) -> None:
        index = method.index
        try:
            await coro
        except ChannelError as exc:
            self.fail(exc.code, exc.text, index)
        except AmqpError as exc:
            self.conn.fail(exc.code, exc.text, index)
        except FlowMQError as exc:
            self.fail(rc.PRECONDITION_FAILED, f"PRECONDITION_FAILED - {exc.message}", index)
        except Exception as exc:
            log.exception("AMQP %s failed", method.name)
            self.conn.fail(rc.INTERNAL_ERROR, f"INTERNAL_ERROR - {exc}"[:255], index)
        finally:
            self._blocked = False
        while self._backlog and not self._blocked and not self.closed:
            frame_type, payload = self._backlog.popleft()
            self.handle_frame(frame_type, payload)
        self.conn.flush()

    def reply(self, method: Any) -> None:
        self.conn.send(encode_method(self.number, method))

    # Channel ---------------------------------------------------------------------------

    def on_channel_open(self, m: commands.Channel.Open) -> None:
        raise ConnectionError_(rc.CHANNEL_ERROR, f"channel {self.number} is already open")

    def on_channel_flow(self, m: commands.Channel.Flow) -> None:
        self.consumers.set_flow(bool(m.active))
        self.reply(commands.Channel.FlowOk(m.active))

    def on_channel_flow_ok(self, m: Any) -> None:
        pass

    def on_channel_close(self, m: commands.Channel.Close) -> None:
        self.reply(commands.Channel.CloseOk())
        self.close()
        self.conn.channel_closed(self.number, self)

    def on_channel_close_ok(self, m: Any) -> None:
        self.close()
        self.conn.channel_closed(self.number, self)

    # Exchange --------------------------------------------------------------------------

    async def on_exchange_declare(self, m: commands.Exchange.Declare) -> None:
        await self.topology.declare_exchange(m)
        if not m.nowait:
            self.reply(commands.Exchange.DeclareOk())

    async def on_exchange_delete(self, m: commands.Exchange.Delete) -> None:
        await self.topology.delete_exchange(m)
        if not m.nowait:
            self.reply(commands.Exchange.DeleteOk())

    # Queue -----------------------------------------------------------------------------

    def _queue_name(self, name: str) -> str:
        if name:
            return name
        if not self.last_queue:
            raise ConnectionError_(rc.NOT_ALLOWED, "no previously declared queue")
        return self.last_queue

    async def on_queue_declare(self, m: commands.Queue.Declare) -> None:
        name, ready, consumers = await self.topology.declare_queue(m)
        self.last_queue = name
        if not m.nowait:
            self.reply(commands.Queue.DeclareOk(name, ready, consumers))

    async def on_queue_bind(self, m: commands.Queue.Bind) -> None:
        await self.topology.bind(self._queue_name(m.queue), m)
        if not m.nowait:
            self.reply(commands.Queue.BindOk())

    async def on_queue_unbind(self, m: commands.Queue.Unbind) -> None:
        await self.topology.unbind(self._queue_name(m.queue), m)
        self.reply(commands.Queue.UnbindOk())

    async def on_queue_purge(self, m: commands.Queue.Purge) -> None:
        count = await self.topology.purge(self._queue_name(m.queue))
        if not m.nowait:
            self.reply(commands.Queue.PurgeOk(count))

    async def on_queue_delete(self, m: commands.Queue.Delete) -> None:
        count = await self.topology.delete_queue(self._queue_name(m.queue), m)
        if not m.nowait:
            self.reply(commands.Queue.DeleteOk(count))

    # Basic -----------------------------------------------------------------------------

    def on_basic_qos(self, m: commands.Basic.Qos) -> None:
        if m.prefetch_size:
            raise ConnectionError_(rc.NOT_IMPLEMENTED, "prefetch_size is not supported")
        self.consumers.prefetch = m.prefetch_count
        self.reply(commands.Basic.QosOk())

    def _check_consume(self, name: str) -> None:
        if not self.conn.access.allowed(CONSUME, QUEUE, name):
            raise ChannelError(rc.ACCESS_REFUSED, f"consume from queue '{name}' refused")

    def on_basic_consume(self, m: commands.Basic.Consume) -> None:
        name = self._queue_name(m.queue)
        self._check_consume(name)
        self.consumers.consume(name, self.topology.lookup(name), m)

    def on_basic_cancel(self, m: commands.Basic.Cancel) -> None:
        self.consumers.cancel(m.consumer_tag)
        if not m.nowait:
            self.reply(commands.Basic.CancelOk(m.consumer_tag))

    async def on_basic_get(self, m: commands.Basic.Get) -> None:
        name = self._queue_name(m.queue)
        self._check_consume(name)
        storing = [f for f in self._storing if not f.done()]
        if storing:  # the channel's own earlier publishes first
            await asyncio.wait(storing)
        await self.consumers.get(name, self.topology.lookup(name), m)

    def on_basic_recover(self, m: commands.Basic.Recover) -> None:
        self.consumers.recover(m.requeue)
        self.reply(commands.Basic.RecoverOk())

    def on_basic_recover_async(self, m: commands.Basic.RecoverAsync) -> None:
        self.consumers.recover(m.requeue)

    def on_confirm_select(self, m: commands.Confirm.Select) -> None:
        self.confirm = True
        if not m.nowait:
            self.reply(commands.Confirm.SelectOk())


def _too_large(size: int, max_size: int) -> ChannelError:
    """RabbitMQ's max_message_size refusal, word for word (and counted)."""
    metrics.limits_rejections_count.labels("amqp_message_bytes").inc()
    return ChannelError(
        rc.PRECONDITION_FAILED,
        f"PRECONDITION_FAILED - message size {size} is larger than configured max size {max_size}",
    )


_HANDLERS: dict[type, Callable[[Channel, Any], Any]] = {
    commands.Channel.Open: Channel.on_channel_open,
    commands.Channel.Flow: Channel.on_channel_flow,
    commands.Channel.FlowOk: Channel.on_channel_flow_ok,
    commands.Channel.Close: Channel.on_channel_close,
    commands.Channel.CloseOk: Channel.on_channel_close_ok,
    commands.Exchange.Declare: Channel.on_exchange_declare,
    commands.Exchange.Delete: Channel.on_exchange_delete,
    commands.Queue.Declare: Channel.on_queue_declare,
    commands.Queue.Bind: Channel.on_queue_bind,
    commands.Queue.Unbind: Channel.on_queue_unbind,
    commands.Queue.Purge: Channel.on_queue_purge,
    commands.Queue.Delete: Channel.on_queue_delete,
    commands.Basic.Qos: Channel.on_basic_qos,
    commands.Basic.Consume: Channel.on_basic_consume,
    commands.Basic.Cancel: Channel.on_basic_cancel,
    commands.Basic.Get: Channel.on_basic_get,
    commands.Basic.Recover: Channel.on_basic_recover,
    commands.Basic.RecoverAsync: Channel.on_basic_recover_async,
    commands.Confirm.Select: Channel.on_confirm_select,
}
