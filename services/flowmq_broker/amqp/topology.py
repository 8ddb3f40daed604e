"""AMQP topology: which exchanges and queues a namespace has, and how queues are bound.

Owns the work of Exchange.Declare/Delete and Queue.Declare/Bind/Unbind/Purge/Delete, finding a
queue by name (with the exclusive-queue access check), and turning a queue's x-arguments into
Queue destination options (DESIGN.md §3: a durable queue is a Queue destination bound to
``map(name)``; an exclusive or auto-delete one a memory queue).  It keeps no state itself:
declared exchanges live in the exchange registry (meta store), durable queues in the catalog,
memory queues in ``AmqpState``.  The channel decodes each method and sends its reply; refusals
are raised here as ``ChannelError`` / ``ConnectionError_``.
"""

from __future__ import annotations

import dataclasses
import math
import secrets
from typing import Any

from pamqp import commands

from flowmq_broker.amqp.errors import ChannelError, ConnectionError_
from flowmq_broker.amqp.exchanges import KNOWN_TYPES, SUPPORTED_TYPES, Exchange
from flowmq_broker.amqp.link import Link
from flowmq_broker.amqp.memqueue import MemoryQueue
from flowmq_broker.amqp.state import AmqpState
from flowmq_broker.routing import Binding
from flowmq_core.acl import CONSUME, CREATE, DELETE, NAMESPACE
from flowmq_core.acl import QUEUE as QUEUE_RESOURCE
from flowmq_core.errors import (
    AlreadyExists,
    FlowMQError,
    InvalidFilter,
    InvalidName,
    InvalidTopic,
    NotFound,
)
from flowmq_core.mapping import amqp_binding_filter, amqp_publish_topic, amqp_queue_filter
from flowmq_meta.catalog import (
    QUEUE,
    QUEUE_DEFAULT_OPTIONS,
    Destination,
    validate_queue_name,
)
from flowmq_wire.amqp import constants as rc

_MIB = 1024 * 1024


def _refused(what: str) -> ChannelError:
    """Authorization (flowmq_core.acl): 403 ACCESS_REFUSED closes the channel, as RabbitMQ."""
    return ChannelError(rc.ACCESS_REFUSED, f"{what} refused by the ACLs")


class Topology:
    """The topology methods of one channel, for the namespace of its connection."""

    __slots__ = ("conn", "shared")

    def __init__(self, shared: AmqpState, conn: Link) -> None:
        self.shared = shared
        self.conn = conn

    # Exchange --------------------------------------------------------------------------

    async def declare_exchange(self, m: commands.Exchange.Declare) -> None:
        name = m.exchange
        ns = self.conn.namespace
        existing = self.shared.exchanges.get(ns, name)
        if m.passive:
            if existing is None:
                raise ChannelError(
                    rc.NOT_FOUND, f"no exchange '{name}' in vhost '{self.conn.vhost}'"
                )
        else:
            if m.exchange_type not in KNOWN_TYPES:
                raise ConnectionError_(
                    rc.COMMAND_INVALID, f"unknown exchange type '{m.exchange_type}'"
                )
            if existing is not None:
                if existing.type != m.exchange_type:
                    raise ChannelError(
                        rc.PRECONDITION_FAILED,
                        f"inequivalent arg 'type' for exchange '{name}' in vhost "
                        f"'{self.conn.vhost}': received '{m.exchange_type}' but current is "
                        f"'{existing.type}'",
                    )
            else:
                if name.startswith("amq.") or not name:
                    raise ChannelError(
                        rc.ACCESS_REFUSED,
                        f"exchange name '{name}' contains reserved prefix 'amq.'",
                    )
                if not self.conn.access.allowed(CREATE, NAMESPACE):
                    raise _refused(f"declaring exchange '{name}'")
                if m.exchange_type not in SUPPORTED_TYPES:
                    raise ConnectionError_(
                        rc.NOT_IMPLEMENTED,
                        f"exchange type '{m.exchange_type}' is not supported "
                        f"(supported: {', '.join(SUPPORTED_TYPES)})",
                    )
                try:
                    amqp_publish_topic(name, "x", m.exchange_type)
                except (InvalidName, InvalidTopic) as exc:
                    raise ChannelError(rc.PRECONDITION_FAILED, str(exc)) from None
                stored = await self.shared.exchanges.declare(
                    ns,
                    Exchange(
                        name,
                        m.exchange_type,
                        bool(m.durable),
                        bool(m.auto_delete),
                        bool(m.internal),
                        dict(m.arguments or {}),
                    ),
                )
                if stored.type != m.exchange_type:
                    raise ChannelError(
                        rc.PRECONDITION_FAILED,
                        f"inequivalent arg 'type' for exchange '{name}'",
                    )

    async def delete_exchange(self, m: commands.Exchange.Delete) -> None:
        name = m.exchange
        ns = self.conn.namespace
        existing = self.shared.exchanges.get(ns, name)
        if existing is not None and existing.builtin:
            raise ChannelError(
                rc.ACCESS_REFUSED, f"operation not permitted on exchange '{name or 'default'}'"
            )
        if existing is not None:
            if not self.conn.access.allowed(DELETE, NAMESPACE):
                raise _refused(f"deleting exchange '{name}'")
            await self.shared.exchanges.delete(ns, name)

    # Queue -----------------------------------------------------------------------------

    def lookup(self, name: str) -> MemoryQueue | Destination:
        """The queue ``name``: a memory queue or a Queue destination; 404 otherwise."""
        ns = self.conn.namespace
        q = self.shared.memqueues.get(ns, name)
        if q is not None:
            self.check_exclusive(q)
            return q
        dest = self.shared.router.destination(Binding(QUEUE, ns, name))
        if dest is None:
            raise ChannelError(rc.NOT_FOUND, f"no queue '{name}' in vhost '{self.conn.vhost}'")
        return dest

    def check_exclusive(self, q: MemoryQueue) -> None:
        if q.exclusive and q.owner is not self.conn:
            raise ChannelError(
                rc.RESOURCE_LOCKED,
                f"cannot obtain exclusive access to locked queue '{q.name}' in vhost "
                f"'{self.conn.vhost}'",
            )

    async def declare_queue(self, m: commands.Queue.Declare) -> tuple[str, int, int]:
        """Declare (or check, if passive) the queue; returns its name (the server's choice for
        an empty one), its ready messages and its consumers, for Declare-Ok."""
        conn = self.conn
        ns = conn.namespace
        name = m.queue
        memory = bool(m.exclusive or m.auto_delete)
        if not name:
            if m.passive:
                raise ConnectionError_(rc.NOT_ALLOWED, "passive declare of a server-named queue")
            name = ("amq.gen-" if memory else "gen-") + secrets.token_hex(11)
        elif name.startswith("amq.") and not m.passive:
            raise ChannelError(
                rc.ACCESS_REFUSED,
                f"queue name '{name}' contains reserved prefix 'amq.'",
            )
        q = self.shared.memqueues.get(ns, name)
        # Only creating needs ``create``: redeclaring an existing queue changes nothing (one
        # created through another broker and not applied here yet is found in the catalog).
        if (
            q is None
            and not m.passive
            and not conn.access.allowed(CREATE, QUEUE_RESOURCE, name)
            and self.shared.router.destination(Binding(QUEUE, ns, name)) is None
            and not await self._stored_queue(ns, name)
        ):
            raise _refused(f"declaring queue '{name}'")
        if q is not None:
            self.check_exclusive(q)
            if not m.passive and not memory:
                raise ChannelError(
                    rc.PRECONDITION_FAILED,
                    f"inequivalent arg 'exclusive'/'auto_delete' for queue '{name}'",
                )
            return name, len(q.buffer), len(q.consumers)
        try:
            dest: Destination | None = await self.shared.catalog.get_destination(ns, name, QUEUE)
        except NotFound:
            dest = None
        if dest is not None and self.shared.router.destination(Binding(QUEUE, ns, name)) is None:
            # Created through another broker, not yet applied here (gossip is on its way):
            # apply it now, so that the consume that follows the Declare-Ok finds it.
            await self.shared.services.sync.refresh()
        if m.passive:
            if dest is None:
                raise ChannelError(rc.NOT_FOUND, f"no queue '{name}' in vhost '{conn.vhost}'")
        elif memory:
            if dest is not None:
                raise ChannelError(
                    rc.PRECONDITION_FAILED,
                    f"inequivalent arg 'exclusive'/'auto_delete' for queue '{name}': it is a "
                    "durable queue",
                )
            try:
                implicit = amqp_queue_filter(name)
            except InvalidName as exc:
                raise ChannelError(rc.PRECONDITION_FAILED, str(exc)) from None
            q = MemoryQueue(
                ns,
                name,
                conn if m.exclusive else None,
                exclusive=bool(m.exclusive),
                auto_delete=bool(m.auto_delete),
                durable=bool(m.durable),
                arguments=dict(m.arguments or {}),
            )
            self.shared.memqueues.add(q, implicit)
            conn.owned_queues.append(q)
            return name, 0, 0
        else:
            wanted = self._queue_options(name, m.arguments or {})
            if dest is None:
                try:
                    validate_queue_name(name)
                    dest = Destination(QUEUE, ns, name, [amqp_queue_filter(name)], wanted)
                    await self.shared.catalog.create_destination(dest)
                except AlreadyExists:
                    dest = await self.shared.catalog.get_destination(ns, name, QUEUE)
                except (InvalidName, FlowMQError) as exc:
                    raise ChannelError(rc.PRECONDITION_FAILED, str(exc)) from None
                await self.shared.services.metadata_changed()
            for arg, option in _ARG_OPTIONS.items():
                if arg in (m.arguments or {}) and dest.options.get(option) != wanted.get(option):
                    raise ChannelError(
                        rc.PRECONDITION_FAILED,
                        f"inequivalent arg '{arg}' for queue '{name}' in vhost '{conn.vhost}': "
                        f"received {wanted.get(option)!r} but current is "
                        f"{dest.options.get(option)!r} ({option})",
                    )
        engine = self.shared.queues.engine
        ready = await engine.ready_count(ns, name)
        return name, ready, engine.consumer_count(ns, name)

    async def _stored_queue(self, ns: str, name: str) -> bool:
        try:
            await self.shared.catalog.get_destination(ns, name, QUEUE)
        except NotFound:
            return False
        return True

    def _queue_options(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        """Queue destination options from x-arguments (RabbitMQ's names where they exist)."""
        options = dict(QUEUE_DEFAULT_OPTIONS)
        try:
            if "x-message-ttl" in args:
                options["message_ttl_seconds"] = max(
                    1, math.ceil(int(args["x-message-ttl"]) / 1000)
                )
            if "x-max-length-bytes" in args:
                options["max_size_mb"] = max(1, math.ceil(int(args["x-max-length-bytes"]) / _MIB))
            for key in ("x-delivery-limit", "x-max-retries"):
                if key in args:
                    options["max_retries"] = max(0, int(args[key]))
            if "x-queue-shards" in args:
                options["shards"] = min(256, max(1, int(args["x-queue-shards"])))
            if "x-dead-letter-topic" in args:
                topic = _text(args["x-dead-letter-topic"])
                options["dead_letter_topic"] = topic
            elif "x-dead-letter-exchange" in args:
                dlx = _text(args["x-dead-letter-exchange"])
                key = _text(args.get("x-dead-letter-routing-key", name))
                ex = self.shared.exchanges.get(self.conn.namespace, dlx)
                options["dead_letter_topic"] = amqp_publish_topic(
                    dlx, key, ex.type if ex is not None else "topic"
                )
        except (ValueError, TypeError, InvalidName, InvalidTopic) as exc:
            raise ChannelError(rc.PRECONDITION_FAILED, f"invalid queue argument: {exc}") from None
        overflow = args.get("x-overflow")
        if overflow is not None and _text(overflow) != "reject-publish":
            raise ChannelError(
                rc.PRECONDITION_FAILED,
                f"x-overflow '{_text(overflow)}' is not supported: FlowMQ queues refuse "
                "publishes beyond their size (reject-publish)",
            )
        return options

    async def bind(self, name: str, m: commands.Queue.Bind) -> None:
        """One filter more for queue ``name``."""
        await self._rebind(name, m, bind=True)

    async def unbind(self, name: str, m: commands.Queue.Unbind) -> None:
        """One filter less for queue ``name`` (never its implicit one)."""
        await self._rebind(name, m, bind=False)

    async def _rebind(self, name: str, m: Any, *, bind: bool) -> None:
        ns = self.conn.namespace
        target = self.lookup(name)
        exchange = self.shared.exchanges.get(ns, m.exchange)
        if exchange is None:
            raise ChannelError(
                rc.NOT_FOUND, f"no exchange '{m.exchange}' in vhost '{self.conn.vhost}'"
            )
        if exchange.name == "":
            raise ChannelError(rc.ACCESS_REFUSED, "operation not permitted on the default exchange")
        if exchange.type not in SUPPORTED_TYPES:
            raise ConnectionError_(
                rc.NOT_IMPLEMENTED, f"bindings to {exchange.type} exchanges are not supported"
            )
        try:
            topic_filter = amqp_binding_filter(exchange.name, m.routing_key, exchange.type)
        except (InvalidName, InvalidFilter) as exc:
            raise ChannelError(rc.PRECONDITION_FAILED, str(exc)) from None
        # The queue will receive every topic of the binding: all of them must be readable.
        if not self.conn.access.may_subscribe(topic_filter):
            verb = "binding" if bind else "unbinding"
            raise _refused(f"{verb} queue '{name}' to topic filter '{topic_filter}'")
        if isinstance(target, MemoryQueue):
            if bind:
                self.shared.memqueues.bind(target, topic_filter)
            elif topic_filter != amqp_queue_filter(target.name):
                self.shared.memqueues.unbind(target, topic_filter)
            return

        def rebind(dest: Destination) -> Destination:
            filters = list(dest.topic_filters)
            if bind and topic_filter not in filters:
                filters.append(topic_filter)
            elif not bind and topic_filter in filters and topic_filter != amqp_queue_filter(name):
                filters.remove(topic_filter)
            return dataclasses.replace(dest, topic_filters=filters)

        await self.shared.catalog.update_destination(ns, name, QUEUE, rebind)
        await self.shared.services.metadata_changed()

    async def purge(self, name: str) -> int:
        """Drop the ready messages of queue ``name``; returns how many."""
        target = self.lookup(name)
        if not self.conn.access.allowed(CONSUME, QUEUE_RESOURCE, name):  # RabbitMQ: read
            raise _refused(f"purging queue '{name}'")
        if isinstance(target, MemoryQueue):
            return target.purge()
        return await self.shared.queues.engine.purge(self.conn.namespace, name)

    async def delete_queue(self, name: str, m: commands.Queue.Delete) -> int:
        """Delete queue ``name`` and cancel its consumers; returns the messages it held."""
        ns = self.conn.namespace
        try:
            target = self.lookup(name)
        except ChannelError as exc:
            if exc.code != rc.NOT_FOUND:
                raise
            return 0  # RabbitMQ: deleting a missing queue succeeds
        if not self.conn.access.allowed(DELETE, QUEUE_RESOURCE, name):
            raise _refused(f"deleting queue '{name}'")
        if isinstance(target, MemoryQueue):
            if m.if_unused and target.consumers:
                raise ChannelError(rc.PRECONDITION_FAILED, f"queue '{name}' in use")
            if m.if_empty and target.buffer:
                raise ChannelError(rc.PRECONDITION_FAILED, f"queue '{name}' not empty")
            self.shared.cancel_consumers_of(target)
            count = self.shared.memqueues.delete(target)
        else:
            engine = self.shared.queues.engine
            if m.if_unused and engine.consumer_count(ns, name):
                raise ChannelError(rc.PRECONDITION_FAILED, f"queue '{name}' in use")
            count = await engine.ready_count(ns, name)
            if m.if_empty and count:
                raise ChannelError(rc.PRECONDITION_FAILED, f"queue '{name}' not empty")
            try:
                await self.shared.catalog.delete_destination(ns, name, QUEUE)
            except NotFound:
                pass
            await self.shared.services.metadata_changed()
            self.shared.cancel_consumers_of_durable(ns, name)
            await engine.delete(ns, name)
        return count


def _text(value: Any) -> str:
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode()
    return str(value)


# x-argument -> queue destination option, compared on redeclare.
_ARG_OPTIONS = {
    "x-message-ttl": "message_ttl_seconds",
    "x-max-length-bytes": "max_size_mb",
    "x-delivery-limit": "max_retries",
    "x-max-retries": "max_retries",
    "x-dead-letter-exchange": "dead_letter_topic",
    "x-dead-letter-topic": "dead_letter_topic",
}
