"""One Kafka client connection: an asyncio Protocol (DESIGN.md §11).

Every complete frame of a read is handled in that read; answers are kept in request order
(Kafka clients match responses by position as well as correlation id) even when some
requests wait for storage: a request answered at once while an earlier one still waits is
parked in its slot.  Everything a read (or one event-loop pass of completions) produces is
written with one transport call.  Reading pauses while too many answers are outstanding or
the client is not reading its responses, which bounds the memory a connection can pin.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import struct
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

import flowmq_metrics as metrics
from flowmq_broker.kafka import sasl
from flowmq_broker.kafka.context import Handler, RequestContext, ServerState
from flowmq_broker.kafka.sasl_exchange import PRE_AUTH_MAX_FRAME, SASL_TIMEOUT_S, SaslExchange
from flowmq_broker.kafka.tenants import KafkaTenant
from flowmq_broker.tls import ServerTls
from flowmq_core.audit import audit_log
from flowmq_core.limits import MAX_CLIENT_ID_BYTES, utf8_size
from flowmq_wire.kafka import (
    API_VERSIONS_KEY,
    FrameSplitter,
    FrameTooLarge,
    KafkaCodecError,
    api_name,
    api_versions_error,
    decode_request,
    encode_response,
    parse_request_header,
)

log = logging.getLogger(__name__)

# Outstanding requests per connection before reading pauses (librdkafka pipelines up to
# max.in.flight = 1M by default; Kafka itself reads one request at a time per connection).
MAX_OUTSTANDING = 64
_JOIN_LIMIT = 256 * 1024  # below this, answers are joined into one write; above, writelines
_SASL_APIS = frozenset({API_VERSIONS_KEY, 17, 36})
_FIXED_HEAD = struct.Struct(">hhi")  # api_key, api_version, correlation_id: in every header


@dataclass(frozen=True)
class ApiSpec:
    """One row of the API table: the versions served and the handler."""

    key: int
    min_version: int
    max_version: int
    handler: Handler

    @property
    def name(self) -> str:
        return api_name(self.key)


class Listener(ServerState, Protocol):
    """What a connection uses of its listener (``KafkaServer``), besides what it hands to
    handlers."""

    apis: dict[int, ApiSpec]
    allow_anonymous: bool
    connections: set[KafkaConnection]
    tls: ServerTls | None  # the TLS listener's settings, once it serves

    def new_splitter(self) -> FrameSplitter: ...

    def count_request(self, api_key: int) -> None: ...


class _Slot:
    __slots__ = ("data", "done")

    def __init__(self) -> None:
        self.data: bytes | bytearray | None = None
        self.done = False


class KafkaConnection(asyncio.Protocol):
    def __init__(self, server: Listener) -> None:
        self.server = server
        self.splitter = server.new_splitter()
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.local_host = "127.0.0.1"
        self.tls = False
        self.client_host = ""
        self.client_address = "?"
        self.closing = False
        self.user: str | None = None
        # The namespace the connection sees: default until a user authenticates.
        self.tenant: KafkaTenant = server.tenants.default
        # What the client may do (flowmq_core.acl): anonymous until it authenticates.
        self.access = server.services.authorizer.access(self.tenant.namespace, None)
        self.sasl: SaslExchange | None = None
        self.sasl_raw_next = False  # SaslHandshake v0: the next frames are bare tokens
        self._auth_timer: asyncio.TimerHandle | None = None
        self.fetching = False
        # Resolved once the connection's last slow-path Produce reached the batcher.
        self.produce_gate: asyncio.Future[None] | None = None
        self._loop = asyncio.get_running_loop()
        self._slots: collections.deque[_Slot] = collections.deque()
        self._out: list[bytes | bytearray] = []
        self._flush_scheduled = False
        self._read_paused = False
        self._write_paused = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self._pressure = server.services.pressure  # durable writes lagging (backpressure.py)
        self._last_read = self._loop.time()  # for the idle timeout (KafkaServer's sweep)

    # -- transport callbacks -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not self.server.services.connection_limits.admit(self, transport):
            return  # closed at once (max_connections, max_connections_per_address)
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        sock = transport.get_extra_info("sockname")
        if peer:
            self.peer = f"{peer[0]}:{peer[1]}"
            self.client_host = f"/{peer[0]}"
            self.client_address = str(peer[0])
        if sock:
            self.local_host = sock[0]
        self.server.connections.add(self)
        self.server.tenants.attach(self.tenant)
        self.tls = transport.get_extra_info("ssl_object") is not None
        if not self.server.allow_anonymous:
            # Until SASL succeeds: small frames only, and not for long.
            self.splitter.max_frame = min(self.splitter.max_frame, PRE_AUTH_MAX_FRAME)
            self._auth_timer = self._loop.call_later(SASL_TIMEOUT_S, self._auth_timeout)
        if self.tls and self.server.tls is not None:
            self._certificate_login(self.server.tls, transport)

    def _certificate_login(self, tls: ServerTls, transport: asyncio.BaseTransport) -> None:
        """With tls_cert_as_username the client certificate's CN is the principal (Kafka's
        SSL principal): authenticated as that user without SASL, or closed if no user."""
        user = tls.peer_username(transport)
        if user is None:
            return
        if self.server.services.users.namespace_of(user) is not None:
            self.authenticated(user)
        else:
            audit_log.info("kafka %s: certificate CN %r is no user; closing", self.peer, user)
            self.close()

    def _auth_timeout(self) -> None:
        self._auth_timer = None
        if self.user is None and not self.closing:
            audit_log.info(
                "kafka %s: no SASL authentication within %.0f s; closing", self.peer, SASL_TIMEOUT_S
            )
            self.close()

    def authenticated(self, user: str) -> None:
        namespace = self.server.services.users.namespace_of(user)
        if namespace is None:  # deleted since its login was checked
            audit_log.info("kafka %s: user %r no longer exists; closing", self.peer, user)
            self.close()
            return
        self.user = user
        if namespace != self.tenant.namespace:  # the user's tenant, from now on
            tenants = self.server.tenants
            tenant = tenants.get(namespace)
            tenants.attach(tenant)
            tenants.detach(self.tenant)
            self.tenant = tenant
        self.access = self.server.services.authorizer.access(namespace, user)
        self.sasl_raw_next = False
        self.splitter.max_frame = self.server.max_request_size
        if self._auth_timer is not None:
            self._auth_timer.cancel()
            self._auth_timer = None

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.services.connection_limits.release(self)
        self._pressure.forget(self)
        self.closing = True
        if self._auth_timer is not None:
            self._auth_timer.cancel()
        if self in self.server.connections:
            self.server.connections.discard(self)
            self.server.tenants.detach(self.tenant)
        if self.fetching:
            self.server.update_stream_subscriptions()
        for task in list(self._tasks):
            task.cancel()
        self._slots.clear()
        self._out.clear()

    def pause_writing(self) -> None:
        self._write_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        self._update_reading()

    def data_received(self, data: bytes) -> None:
        self._last_read = self._loop.time()
        try:
            frames = self.splitter.feed(data)
        except KafkaCodecError as exc:
            if isinstance(exc, FrameTooLarge):  # closed before any of it is buffered
                authenticated = self.user is not None or self.server.allow_anonymous
                metrics.limits_rejections_count.labels(
                    "kafka_request_bytes" if authenticated else "kafka_pre_auth_request_bytes"
                ).inc()
            log.info("kafka %s: %s; closing the connection", self.peer, exc)
            self.close()
            return
        for frame in frames:
            if self.closing:
                return
            self._request(frame)
        self._flush()
        self._update_reading()

    # -- requests ----------------------------------------------------------------------------

    def _request(self, frame: memoryview) -> None:
        if self.sasl_raw_next:  # a bare token, answered in order with the requests
            self._dispatch_result(None, sasl.handle_raw_token(self, bytes(frame)))
            return
        api_key, version, correlation_id = _FIXED_HEAD.unpack_from(frame)
        server = self.server
        server.count_request(api_key)
        spec = server.apis.get(api_key)
        if spec is None or not spec.min_version <= version <= spec.max_version:
            # ApiVersions of a version we do not know is answered as v0 with the list, so
            # the client can retry with one we do; any other API gets the same shape.  The
            # rest of the header is not read: its layout depends on the version.
            self._answer(api_versions_error(correlation_id, server.supported))
            return
        try:
            header = parse_request_header(frame)
        except KafkaCodecError as exc:
            log.info("kafka %s: %s; closing the connection", self.peer, exc)
            self.close()
            return
        client_id = header.client_id
        if client_id and len(client_id) > 64 and utf8_size(client_id) > MAX_CLIENT_ID_BYTES:
            # Kafka has no error code for it: refused as a malformed request is.
            metrics.limits_rejections_count.labels("client_id_bytes").inc()
            log.info(
                "kafka %s: client id longer than %d bytes; closing", self.peer, MAX_CLIENT_ID_BYTES
            )
            self.close()
            return
        if self.user is None and not server.allow_anonymous and header.api_key not in _SASL_APIS:
            audit_log.info("kafka %s: %s before authentication; closing", self.peer, spec.name)
            self.close()
            return
        try:
            request = decode_request(header, frame)
        except KafkaCodecError as exc:
            log.info("kafka %s: %s; closing the connection", self.peer, exc)
            self.close()
            return
        ctx = RequestContext(self, server, header)
        try:
            result = spec.handler(ctx, request)
        except Exception:
            log.exception("kafka %s: %s v%d failed", self.peer, spec.name, header.api_version)
            self.close()
            return
        self._dispatch_result(ctx, result)

    def _dispatch_result(self, ctx: RequestContext | None, result: Any) -> None:
        if result is None:
            return  # nothing to answer (Produce with acks=0)
        if isinstance(result, Coroutine):
            task = self._loop.create_task(result)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            result = task
        if isinstance(result, asyncio.Future):
            slot = _Slot()
            self._slots.append(slot)
            result.add_done_callback(lambda fut: self._completed(ctx, slot, fut))
            return
        self._answer(self._encode(ctx, result))

    def _encode(self, ctx: RequestContext | None, response: Any) -> bytes | bytearray:
        if isinstance(response, bytes | bytearray):
            return response
        assert ctx is not None  # only bare SASL tokens (bytes) have no request context
        return encode_response(response, ctx.correlation_id)

    def _answer(self, data: bytes | bytearray) -> None:
        if self._slots:
            slot = _Slot()
            slot.data, slot.done = data, True
            self._slots.append(slot)
        else:
            self._out.append(data)

    def _completed(self, ctx: RequestContext | None, slot: _Slot, fut: asyncio.Future[Any]) -> None:
        if self.closing:
            return
        if fut.cancelled():
            self.close()
            return
        exc = fut.exception()
        if exc is not None:
            log.error(
                "kafka %s: %s failed",
                self.peer,
                "a bare SASL token"
                if ctx is None
                else f"{self.server.apis[ctx.api_key].name} v{ctx.version}",
                exc_info=exc,
            )
            self.close()
            return
        response = fut.result()
        try:
            slot.data = None if response is None else self._encode(ctx, response)
        except Exception:
            log.exception("kafka %s: cannot encode the response", self.peer)
            self.close()
            return
        slot.done = True
        slots = self._slots
        while slots and slots[0].done:
            data = slots.popleft().data
            if data is not None:
                self._out.append(data)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)
        self._update_reading()

    # -- output ------------------------------------------------------------------------------

    def _flush(self) -> None:
        self._flush_scheduled = False
        out = self._out
        if not out:
            return
        transport = self.transport
        if transport is not None and not transport.is_closing():
            if len(out) == 1:
                transport.write(out[0])
            elif sum(len(b) for b in out) < _JOIN_LIMIT:
                transport.write(b"".join(out))
            else:
                transport.writelines(out)
        self._out = []

    def _update_reading(self) -> None:
        transport = self.transport
        if transport is None or self.closing:
            return
        pause = (
            self._write_paused or len(self._slots) >= MAX_OUTSTANDING or self._pressure.holds(self)
        )
        if pause and not self._read_paused:
            self._read_paused = True
            transport.pause_reading()
        elif not pause and self._read_paused:
            self._read_paused = False
            transport.resume_reading()

    def hold_for_pressure(self) -> None:
        """Durable writes lag: read no more requests until they catch up (Kafka mutes a
        throttled channel the same way); the pressure's end calls ``_update_reading``."""
        if self._pressure.hold(self, self._update_reading):
            self._update_reading()

    def idle_for(self, now: float) -> float:
        """Seconds since the client last sent anything, 0 while a request of it is still
        being answered (a long-polling Fetch is not idleness)."""
        return 0.0 if self._slots or self._tasks else now - self._last_read

    def close_idle(self, timeout: float) -> None:
        """Kafka's connections.max.idle.ms: the client reconnects when it needs to."""
        metrics.limits_rejections_count.labels("kafka_idle_timeout").inc()
        log.info("kafka %s: idle for more than %.0f s; closing", self.peer, timeout)
        self.close()

    def close(self) -> None:
        """Write what is answered, then close; later answers are dropped."""
        if self.closing:
            return
        self._flush()
        self.closing = True
        if self.transport is not None:
            self.transport.close()

    def close_after_answers(self) -> None:
        """Close once every request so far is answered (a failed authentication)."""
        if not self._slots:
            self._loop.call_soon(self.close)
            return
        last = self._slots[-1]

        def check() -> None:
            if self.closing:
                return
            if last.done and last not in self._slots:
                self.close()
            else:
                self._loop.call_later(0.01, check)

        self._loop.call_soon(check)


__all__ = ["MAX_OUTSTANDING", "ApiSpec", "KafkaConnection", "Listener"]
