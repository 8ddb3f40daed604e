"""The consuming side of one AMQP channel: its consumers, what it delivers to them and how
deliveries are settled.

Owns the channel's consumers (by tag), its delivery tags and the deliveries not yet
acknowledged, in tag order.  Basic.Consume subscribes to a Queue destination (the queue
engine pushes batches) or to a memory queue; deliveries go out as Basic.Deliver, Basic.Get
answers as Get-Ok.  Settling: ack, reject or requeue (Basic.Ack/Nack/Reject, Basic.Recover,
and every unacknowledged delivery when the channel closes).  Deliveries pause while the
connection's write buffer is full or the client sent Channel.Flow(active=false).
"""

from __future__ import annotations

import collections
import secrets
from collections.abc import Callable
from typing import Any

from pamqp import commands

import flowmq_metrics as metrics
from flowmq_broker.amqp import messages
from flowmq_broker.amqp.errors import ChannelError, ConnectionError_
from flowmq_broker.amqp.link import Link
from flowmq_broker.amqp.memqueue import MemConsumer, MemoryQueue
from flowmq_broker.amqp.state import AmqpState
from flowmq_core.message import Message
from flowmq_meta.catalog import Destination
from flowmq_queue import Delivery
from flowmq_wire.amqp import constants as rc
from flowmq_wire.amqp import frames as fr
from flowmq_wire.amqp.methods import encode_method

_ENCODERS_MAX = 1024


class MemDelivery:
    """An unacknowledged delivery from a memory queue."""

    __slots__ = ("consumer", "message")

    def __init__(self, consumer: MemConsumer, message: Message) -> None:
        self.consumer = consumer
        self.message = message


class Consumers:
    def __init__(self, conn: Link, shared: AmqpState, number: int) -> None:
        self.conn = conn
        self.shared = shared
        self.number = number
        self.closed = False
        self.flow_active = True
        self.prefetch = 0  # Basic.Qos: for consumers started after it
        self.by_tag: dict[str, Any] = {}
        self.delivery_tag = 0
        self.unacked: collections.OrderedDict[int, Delivery | MemDelivery] = (
            collections.OrderedDict()
        )
        self._exrk_cache: tuple[str, str, bytes] = ("", "", b"\x00\x00")
        # (consumer tag, exchange and key, properties) -> its deliveries' prepared bytes.
        self._encoders: dict[tuple[bytes, bytes, bytes], fr.DeliverEncoder] = {}
        # Metric children resolved once: a labels() lookup per message shows in profiles.
        ns = conn.namespace
        self._out_count = metrics.amqp_messages_out_count.labels(ns)
        self._out_bytes = metrics.amqp_messages_out_bytes_count.labels(ns)

    # --- deliveries ---------------------------------------------------------------------

    def _exchange_and_key(self, message: Message) -> bytes:
        exchange, key = messages.exchange_and_key(message)
        cached = self._exrk_cache
        if cached[0] == exchange and cached[1] == key:
            return cached[2]
        encoded = fr.shortstr(exchange) + fr.shortstr(key[:255])
        self._exrk_cache = (exchange, key, encoded)
        return encoded

    def _encode(
        self, out: list[bytes], ctag: bytes, tag: int, redelivered: bool, m: Message
    ) -> None:
        """Append one Basic.Deliver with its content to ``out``: from the bytes prepared for
        its shape (consumer, exchange and routing key, properties) when one body frame holds it."""
        exrk = self._exchange_and_key(m)
        props = messages.delivery_properties(m)
        body = m.payload
        shape = (ctag, exrk, props)
        encoder = self._encoders.get(shape)
        if encoder is None:
            if len(self._encoders) >= _ENCODERS_MAX:
                self._encoders.clear()
            encoder = self._encoders[shape] = fr.DeliverEncoder(
                self.number, ctag, exrk, props, self.conn.frame_max
            )
        if 0 < len(body) <= encoder.room:
            encoder.encode(out, tag, redelivered, body)
        else:  # no body frame, or several
            out.append(
                fr.encode_deliver(
                    self.number, ctag, tag, redelivered, exrk, props, body, self.conn.frame_max
                )
            )

    def deliver_durable(self, ctag: bytes, deliveries: list[Delivery]) -> None:
        if self.closed:
            return
        parts: list[bytes] = []
        unacked = self.unacked
        encode = self._encode
        size = 0
        tag = self.delivery_tag
        for d in deliveries:
            tag += 1
            if not d.consumer.no_ack:
                unacked[tag] = d
            m = d.message
            size += len(m.payload)
            encode(parts, ctag, tag, d.redelivered, m)
        self.delivery_tag = tag
        self.conn.send(b"".join(parts))
        self._out_count.inc(len(deliveries))
        self._out_bytes.inc(size)

    def deliver_memory(
        self, ctag: bytes, consumer: MemConsumer, batch: list[tuple[Message, bool]]
    ) -> None:
        if self.closed:
            return
        parts: list[bytes] = []
        size = 0
        for m, redelivered in batch:
            self.delivery_tag += 1
            tag = self.delivery_tag
            if not consumer.no_ack:
                self.unacked[tag] = MemDelivery(consumer, m)
            size += len(m.payload)
            self._encode(parts, ctag, tag, redelivered, m)
        self.conn.send(b"".join(parts))
        self._out_count.inc(len(batch))
        self._out_bytes.inc(size)

    # --- settling -----------------------------------------------------------------------

    def take_unacked(self, tag: int, multiple: bool) -> list[Delivery | MemDelivery]:
        """The deliveries a Basic.Ack/Nack/Reject of ``tag`` settles, no longer unacked."""
        unacked = self.unacked
        if not multiple:
            d = unacked.pop(tag, None)
            if d is None:
                raise ChannelError(rc.PRECONDITION_FAILED, f"unknown delivery tag {tag}")
            return [d]
        out = []
        if tag == 0:
            out = list(unacked.values())
            unacked.clear()
            return out
        if tag > self.delivery_tag:
            raise ChannelError(rc.PRECONDITION_FAILED, f"unknown delivery tag {tag}")
        while unacked:
            first = next(iter(unacked))
            if first > tag:
                break
            out.append(unacked.popitem(last=False)[1])
        return out

    def ack_run(self, run: list[tuple[int, int]]) -> None:
        """Basic.Acks (delivery tag, multiple) in order: what ``take_unacked`` and ``settle``
        do for each, without a list per single ack."""
        unacked = self.unacked
        engine = self.shared.queues.engine
        for tag, multiple in run:
            if multiple:
                for d in self.take_unacked(tag, True):
                    self.settle(d, None)
                continue
            d = unacked.pop(tag, None)
            if d is None:
                raise ChannelError(rc.PRECONDITION_FAILED, f"unknown delivery tag {tag}")
            if type(d) is Delivery:
                engine.ack(d)
            else:
                self.settle(d, None)

    def settle(self, d: Delivery | MemDelivery, requeue: bool | None) -> None:
        """Ack (None), reject (False) or requeue (True)."""
        if isinstance(d, Delivery):
            engine = self.shared.queues.engine
            if requeue is None:
                engine.ack(d)
            else:
                engine.reject(d, requeue=requeue)
        else:
            d.consumer.queue.settled(d.consumer, d.message, requeue)

    def recover(self, requeue: bool) -> None:
        """Basic.Recover: every unacknowledged delivery goes back to its queue."""
        if not requeue:
            raise ConnectionError_(rc.NOT_IMPLEMENTED, "Basic.Recover with requeue=false")
        self._requeue_unacked()

    def _requeue_unacked(self) -> None:
        unacked = list(self.unacked.values())
        self.unacked.clear()
        for d in unacked:
            self.settle(d, True)

    # --- flow ---------------------------------------------------------------------------

    def set_paused(self, paused: bool) -> None:
        """Stop or resume deliveries (write buffer full, or Channel.Flow)."""
        paused = paused or not self.flow_active
        engine = self.shared.queues.engine
        for c in self.by_tag.values():
            if isinstance(c, MemConsumer):
                c.paused = paused
                if not paused:
                    c.queue.pump()
            else:
                engine.set_paused(c, paused)

    def set_flow(self, active: bool) -> None:
        """Channel.Flow from the client."""
        self.flow_active = active
        self.set_paused(self.conn.paused_writing)

    # --- consumers ----------------------------------------------------------------------

    def consume(
        self, name: str, target: MemoryQueue | Destination, m: commands.Basic.Consume
    ) -> None:
        """Basic.Consume on queue ``name``: Consume-Ok (unless nowait), then deliveries."""
        tag = m.consumer_tag or f"amq.ctag-{secrets.token_hex(11)}"
        if tag in self.by_tag:
            raise ConnectionError_(rc.NOT_ALLOWED, f"attempt to reuse consumer tag '{tag}'")
        ns = self.conn.namespace
        engine = self.shared.queues.engine
        busy = (
            bool(target.consumers)
            if isinstance(target, MemoryQueue)
            else engine.consumer_count(ns, name) > 0
        )
        if busy and (m.exclusive or self.shared.exclusive_consumers.get((ns, name))):
            raise ChannelError(
                rc.ACCESS_REFUSED, f"queue '{name}' in vhost '{self.conn.vhost}' in exclusive use"
            )
        if not m.nowait:
            self.conn.send(encode_method(self.number, commands.Basic.ConsumeOk(tag)))
        ctag = fr.shortstr(tag)
        # No prefetch count: amqp_max_unacked instead of none, so the unacknowledged
        # deliveries the channel holds stay bounded (limits.py).
        prefetch = self.prefetch or (0 if m.no_ack else self.shared.limits.max_unacked)
        if isinstance(target, MemoryQueue):
            consumer: Any = MemConsumer(
                target,
                tag,
                lambda c, batch: self.deliver_memory(ctag, c, batch),
                prefetch,
                bool(m.no_ack),
            )
            consumer.paused = self.conn.paused_writing or not self.flow_active
            self.by_tag[tag] = consumer
            target.add_consumer(consumer)
        else:
            consumer = engine.subscribe(
                ns,
                name,
                tag,
                lambda deliveries: self.deliver_durable(ctag, deliveries),
                prefetch=prefetch,
                no_ack=bool(m.no_ack),
                claim_ahead=True,
            )
            if self.conn.paused_writing or not self.flow_active:
                engine.set_paused(consumer, True)
            self.by_tag[tag] = consumer
        if m.exclusive:
            self.shared.exclusive_consumers[(ns, name)] = consumer

    def cancel(self, tag: str) -> Any:
        consumer = self.by_tag.pop(tag, None)
        if consumer is None:
            return None
        ns = self.conn.namespace
        if isinstance(consumer, MemConsumer):
            q = consumer.queue
            q.remove_consumer(consumer)
            key = (ns, q.name)
            self._maybe_auto_delete(q)
        else:
            self.shared.queues.engine.cancel(consumer)
            key = (ns, consumer.queue)
        if self.shared.exclusive_consumers.get(key) is consumer:
            del self.shared.exclusive_consumers[key]
        return consumer

    def cancel_where(self, match: Callable[[Any], bool]) -> None:
        """Cancel the consumers ``match`` picks and tell the client (their queue is going)."""
        for tag, c in list(self.by_tag.items()):
            if match(c):
                self.cancel(tag)
                self.conn.send(encode_method(self.number, commands.Basic.Cancel(tag, True)))

    def _maybe_auto_delete(self, q: MemoryQueue) -> None:
        if q.auto_delete and q.had_consumer and not q.consumers:
            self.shared.memqueues.delete(q)

    async def get(
        self, name: str, target: MemoryQueue | Destination, m: commands.Basic.Get
    ) -> None:
        """Basic.Get from queue ``name``: Get-Ok with one message, or Get-Empty (also while
        the channel holds ``amqp_max_unacked`` unacknowledged deliveries: limits.py)."""
        conn = self.conn
        if not m.no_ack and len(self.unacked) >= self.shared.limits.max_unacked:
            conn.send(encode_method(self.number, commands.Basic.GetEmpty()))
            return
        if isinstance(target, MemoryQueue):
            if not target.buffer:
                conn.send(encode_method(self.number, commands.Basic.GetEmpty()))
                return
            message, redelivered = target.buffer.popleft()
            self.delivery_tag += 1
            if not m.no_ack:
                holder = MemConsumer(target, "", lambda c, b: None, 0, False)
                holder.unacked = 1
                self.unacked[self.delivery_tag] = MemDelivery(holder, message)
            left = len(target.buffer)
        else:
            delivery, left = await self.shared.queues.engine.get(
                conn.namespace, name, no_ack=bool(m.no_ack)
            )
            if delivery is None:
                conn.send(encode_method(self.number, commands.Basic.GetEmpty()))
                return
            message, redelivered = delivery.message, delivery.redelivered
            self.delivery_tag += 1
            if not m.no_ack:
                self.unacked[self.delivery_tag] = delivery
        conn.send(
            fr.encode_get_ok(
                self.number,
                self.delivery_tag,
                redelivered,
                self._exchange_and_key(message),
                left,
                messages.delivery_properties(message),
                message.payload,
                conn.frame_max,
            )
        )
        self._out_count.inc()
        self._out_bytes.inc(len(message.payload))

    # --- life cycle ---------------------------------------------------------------------

    def release(self) -> None:
        """Cancel consumers and requeue unacknowledged deliveries (channel closing)."""
        for tag in list(self.by_tag):
            self.cancel(tag)
        self._requeue_unacked()

    def close(self) -> None:
        """The channel is closed: release, and deliver nothing more."""
        self.release()
        self.closed = True
