"""SaslHandshake + SaslAuthenticate (and the bare tokens after a v0 handshake): PLAIN,
SCRAM-SHA-256 and SCRAM-SHA-512 against the users of the meta store (``services.users``,
shared with MQTT and AMQP); the exchange itself is ``sasl_exchange.SaslExchange``.

A failed authentication is answered (SASL_AUTHENTICATION_FAILED, or a close after a v0
handshake) and the connection then closed, as Kafka does.  With ``allow_anonymous`` off,
any request other than ApiVersions and SASL before a successful authentication closes the
connection, as do a frame past ``PRE_AUTH_MAX_FRAME`` and ``SASL_TIMEOUT_S`` without
authenticating (``KafkaConnection``).
"""

from __future__ import annotations

import struct
from typing import Any

from flowmq_broker.kafka.context import ConnectionState, RequestContext
from flowmq_broker.kafka.sasl_exchange import MECHANISMS, SaslExchange, SaslFailed
from flowmq_core.audit import audit_log
from flowmq_wire.kafka import ErrorCode


def handle_sasl_handshake(ctx: RequestContext, req: Any) -> Any:
    conn = ctx.conn
    if req.mechanism not in MECHANISMS:
        return ctx.response(error_code=ErrorCode.UNSUPPORTED_SASL_MECHANISM, mechanisms=MECHANISMS)
    if conn.user is not None or conn.sasl is not None:
        return ctx.response(error_code=ErrorCode.ILLEGAL_SASL_STATE, mechanisms=MECHANISMS)
    conn.sasl = SaslExchange(req.mechanism, ctx.server.services.users, conn.client_address)
    # v0: the tokens follow as bare size-prefixed frames, without a Kafka header.
    conn.sasl_raw_next = ctx.version == 0
    return ctx.response(error_code=ErrorCode.NONE, mechanisms=MECHANISMS)


def _refuse(ctx: RequestContext, code: int, message: str) -> Any:
    """Answer a failed SaslAuthenticate, then close the connection."""
    ctx.conn.close_after_answers()
    return ctx.response(
        error_code=code, error_message=message, auth_bytes=b"", session_lifetime_ms=0
    )


def _log_refusal(conn: ConnectionState, exchange: SaslExchange, exc: SaslFailed) -> None:
    audit_log.info(
        "kafka %s: SASL %s authentication refused (%s); user name %r",
        conn.peer,
        exchange.mechanism,
        exc.reason,
        exchange.username,
    )


def handle_sasl_authenticate(ctx: RequestContext, req: Any) -> Any:
    conn = ctx.conn
    exchange = conn.sasl
    if exchange is None or conn.user is not None or conn.sasl_raw_next:
        return _refuse(ctx, ErrorCode.ILLEGAL_SASL_STATE, "SaslAuthenticate before SaslHandshake")
    return _authenticate(ctx, exchange, bytes(req.auth_bytes or b""))


async def _authenticate(ctx: RequestContext, exchange: SaslExchange, token: bytes) -> Any:
    conn = ctx.conn
    try:
        reply, user = await exchange.step(token)
    except SaslFailed as exc:
        _log_refusal(conn, exchange, exc)
        return _refuse(ctx, ErrorCode.SASL_AUTHENTICATION_FAILED, str(exc))
    if user is not None:
        conn.authenticated(user)
    return ctx.response(
        error_code=ErrorCode.NONE, error_message=None, auth_bytes=reply, session_lifetime_ms=0
    )


async def handle_raw_token(conn: ConnectionState, token: bytes) -> bytes | None:
    """A bare token after SaslHandshake v0: the answer is a bare size-prefixed token (empty
    once PLAIN succeeded); a failure closes the connection (None: nothing to answer)."""
    exchange = conn.sasl
    assert exchange is not None
    try:
        reply, user = await exchange.step(token)
    except SaslFailed as exc:
        _log_refusal(conn, exchange, exc)
        conn.close_after_answers()
        return None
    if user is not None:
        conn.authenticated(user)
    return struct.pack(">i", len(reply)) + reply


__all__ = ["handle_raw_token", "handle_sasl_authenticate", "handle_sasl_handshake"]
