"""SaslHandshake + SaslAuthenticate, mechanism PLAIN, users from the meta store
(``services.users``, shared with MQTT and AMQP).

A failed authentication is answered and the connection then closed, as Kafka does.  With
``allow_anonymous`` off, any request other than ApiVersions and SASL before a successful
authentication closes the connection (``KafkaConnection``).
"""

from __future__ import annotations

import logging
import struct
from typing import Any

from flowmq_broker.kafka.context import ConnectionState, RequestContext
from flowmq_meta.users import UserDirectory
from flowmq_wire.kafka import ErrorCode

log = logging.getLogger(__name__)

MECHANISMS = ["PLAIN"]


def handle_sasl_handshake(ctx: RequestContext, req: Any) -> Any:
    conn = ctx.conn
    if req.mechanism not in MECHANISMS:
        return ctx.response(error_code=ErrorCode.UNSUPPORTED_SASL_MECHANISM, mechanisms=MECHANISMS)
    if conn.user is not None or conn.sasl_mechanism is not None:
        return ctx.response(error_code=ErrorCode.ILLEGAL_SASL_STATE, mechanisms=MECHANISMS)
    conn.sasl_mechanism = req.mechanism
    # v0: the token follows as a bare size-prefixed frame, without a Kafka header.
    conn.sasl_raw_next = ctx.version == 0
    return ctx.response(error_code=ErrorCode.NONE, mechanisms=MECHANISMS)


def _check_plain(users: UserDirectory, token: bytes) -> str | None:
    """RFC 4616: ``[authzid] NUL authcid NUL passwd``; the user name on success."""
    parts = token.split(b"\0")
    if len(parts) != 3:
        return None
    authzid, user, password = parts
    try:
        name = user.decode()
    except UnicodeDecodeError:
        return None
    if authzid and authzid != user:
        return None
    if not users.check(name, password):
        return None
    return name


def _refuse(ctx: RequestContext, code: int, message: str) -> Any:
    """Answer a failed SaslAuthenticate, then close the connection."""
    ctx.conn.close_after_answers()
    return ctx.response(
        error_code=code, error_message=message, auth_bytes=b"", session_lifetime_ms=0
    )


def handle_sasl_authenticate(ctx: RequestContext, req: Any) -> Any:
    conn = ctx.conn
    if conn.sasl_mechanism is None or conn.user is not None:
        return _refuse(ctx, ErrorCode.ILLEGAL_SASL_STATE, "SaslAuthenticate before SaslHandshake")
    user = _check_plain(ctx.server.services.users, bytes(req.auth_bytes or b""))
    if user is None:
        log.info("kafka %s: SASL PLAIN authentication failed", conn.peer)
        return _refuse(
            ctx,
            ErrorCode.SASL_AUTHENTICATION_FAILED,
            "Authentication failed: invalid user name or password",
        )
    conn.user = user
    return ctx.response(
        error_code=ErrorCode.NONE, error_message=None, auth_bytes=b"", session_lifetime_ms=0
    )


def handle_raw_token(conn: ConnectionState, users: UserDirectory, token: bytes) -> None:
    """SaslHandshake v0 clients: success is an empty size-prefixed frame, failure a close."""
    user = _check_plain(users, token)
    if user is None:
        log.info("kafka %s: SASL PLAIN authentication failed", conn.peer)
        conn.close()
        return
    conn.user = user
    conn.send_now(struct.pack(">i", 0))


__all__ = ["handle_raw_token", "handle_sasl_authenticate", "handle_sasl_handshake"]
