"""One Kafka connection's SASL exchange, free of the wire: PLAIN (RFC 4616) and
SCRAM-SHA-256 / SCRAM-SHA-512 (RFC 5802, RFC 7677) against the users of the meta store.

``SaslExchange(mechanism, users, address)`` is made by SaslHandshake; each token the client
sends (in SaslAuthenticate, or bare after a v0 handshake) goes to ``await step(token)``,
which returns the server's token and, once the client is authenticated, its user name; a
refused exchange raises ``SaslFailed``.

Invariants:
- Every password check is ``UserDirectory.authenticate`` (scrypt in its threads, never on
  the event loop; rate limited per client address).  A SCRAM proof is a few HMACs, checked
  in place, but behind the same limiter: an address that is blocked is refused before its
  client-first is read, and every refused proof counts as a failed login.
- An exchange takes one step at a time and ends once (authenticated or refused): a token
  arriving while a step runs, or after the end, is refused.
- What the client is told never says whether the user exists; the log says why (the reason
  of ``AuthResult``), never the password.
"""

from __future__ import annotations

import os

from flowmq_meta.scram import MECHANISMS as SCRAM_MECHANISMS
from flowmq_meta.scram import ScramError, ScramServer
from flowmq_meta.users import BAD_PASSWORD, RATE_LIMITED, UNKNOWN_USER, UserDirectory

PLAIN = "PLAIN"
MECHANISMS = [PLAIN, *SCRAM_MECHANISMS]
"""What SaslHandshake offers, in Kafka's order."""

PRE_AUTH_MAX_FRAME = 512 * 1024
"""While a client must still authenticate, a frame declaring more bytes closes the
connection before any of it is buffered (Kafka's ``sasl.server.max.receive.size``)."""

SASL_TIMEOUT_S = float(os.environ.get("FLOWMQ_TEST_KAFKA_SASL_TIMEOUT_S", "10"))
"""While a client must still authenticate, it must within this many seconds of connecting
(tests shorten it through the environment)."""


class SaslFailed(Exception):
    """A refused exchange: ``reason`` for the log, the message for the client."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class SaslExchange:
    def __init__(self, mechanism: str, users: UserDirectory, address: str) -> None:
        if mechanism not in MECHANISMS:
            raise ValueError(f"unsupported SASL mechanism {mechanism!r}")
        self.mechanism = mechanism
        self.users = users
        self.address = address  # the client's IP address: what failures are counted against
        self.username: str | None = None  # as claimed, once a token named it
        self.busy = False
        self.finished = False
        self._scram = ScramServer(mechanism) if mechanism != PLAIN else None

    async def step(self, token: bytes) -> tuple[bytes, str | None]:
        """The server's answer to ``token`` and the user name once authenticated (else
        None: more tokens to come).  Raises ``SaslFailed``."""
        if self.busy or self.finished:
            raise SaslFailed("out_of_order", "SASL token out of order")
        self.busy = True
        try:
            if self._scram is None:
                return b"", await self._plain(token)
            return self._scram_step(self._scram, token)
        except SaslFailed:
            self.finished = True
            raise
        finally:
            self.busy = False

    def _failed(self, reason: str) -> SaslFailed:
        if reason == RATE_LIMITED:
            wait = self.users.limiter.retry_after(self.address)
            return SaslFailed(
                reason,
                f"Authentication failed: too many failed logins from this address; "
                f"retry in {wait:.0f} s",
            )
        return SaslFailed(
            reason,
            f"Authentication failed during authentication due to invalid credentials with "
            f"SASL mechanism {self.mechanism}",
        )

    async def _plain(self, token: bytes) -> str:
        """``[authzid] NUL authcid NUL passwd``; the user name on success."""
        parts = token.split(b"\0")
        if len(parts) != 3:
            raise SaslFailed("malformed", "Authentication failed: malformed PLAIN token")
        authzid, user, password = parts
        try:
            name = user.decode("utf-8")
        except UnicodeDecodeError:
            raise SaslFailed("malformed", "Authentication failed: user name not UTF-8") from None
        self.username = name
        if authzid and authzid != user:
            raise SaslFailed("authzid", "Authentication failed: authorization id not supported")
        result = await self.users.authenticate(name, password, self.address)
        self.finished = True
        if not result:
            raise self._failed(result.reason)
        return name

    def _scram_step(self, scram: ScramServer, token: bytes) -> tuple[bytes, str | None]:
        limiter = self.users.limiter
        try:
            if scram.client_first is None:
                if limiter.blocked(self.address):
                    raise self._failed(RATE_LIMITED)
                first = scram.receive_client_first(token)
                self.username = first.username
                if first.extensions.get("tokenauth", "").lower() == "true":
                    raise SaslFailed("token_auth", "Authentication failed: no delegation tokens")
                if first.authzid is not None and first.authzid != first.username:
                    raise SaslFailed("authzid", "Authentication failed: authorization id differs")
                credential = self.users.scram_credential(first.username, self.mechanism)
                return scram.server_first(credential), None
            final = scram.receive_client_final(token)
        except ScramError as exc:
            if exc.error != "invalid-proof":
                raise SaslFailed(f"malformed ({exc})", f"Authentication failed: {exc}") from None
            limiter.record_failure(self.address)
            raise self._failed(UNKNOWN_USER if scram.unknown_user else BAD_PASSWORD) from None
        self.finished = True
        assert self.username is not None
        if self.users.namespace_of(self.username) is None:  # deleted meanwhile
            limiter.record_failure(self.address)
            raise self._failed(UNKNOWN_USER)
        return final, self.username


__all__ = [
    "MECHANISMS",
    "PLAIN",
    "PRE_AUTH_MAX_FRAME",
    "SASL_TIMEOUT_S",
    "SaslExchange",
    "SaslFailed",
]
