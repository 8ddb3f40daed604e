"""SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677): stored credentials and the server
side of one exchange, free of I/O so any adapter (Kafka SASL today) can drive it.

What the server keeps per user and mechanism is ``ScramCredential``: salt, iteration count,
StoredKey = H(HMAC(SaltedPassword, "Client Key")) and ServerKey = HMAC(SaltedPassword,
"Server Key").  Neither lets anyone log in: a proof needs ClientKey, which only the password
gives.  Passwords are taken as their UTF-8 bytes without SASLprep, as Kafka's clients do.

One exchange, one ``ScramServer``; its steps must come in order, each at most once:

    server = ScramServer("SCRAM-SHA-256")
    first = server.receive_client_first(message)         # ClientFirst: .username, .nonce
    reply = server.server_first(credential_or_None)      # b"r=...,s=...,i=..."
    final = server.receive_client_final(message)         # b"v=..." or raises ScramError

A ``ScramError`` carries an RFC 5802 ``server-error-value`` (``error``) and the message
``server_final_error`` builds from it.  An unknown user gets a server-first with a salt that
is stable for that name and a refused proof, so the exchange does not tell who exists.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import hmac
import secrets
from typing import Any

SCRAM_SHA_256 = "SCRAM-SHA-256"
SCRAM_SHA_512 = "SCRAM-SHA-512"
MECHANISMS: dict[str, str] = {SCRAM_SHA_256: "sha256", SCRAM_SHA_512: "sha512"}
"""Mechanism name -> hashlib name."""

MIN_ITERATIONS = 4096
"""RFC 7677 §4: at least 4096 iterations; Kafka refuses fewer too."""

MAX_ITERATIONS = 16384
"""Kafka's upper bound; its clients refuse a server-first that asks for more."""

DEFAULT_ITERATIONS = 4096
SALT_BYTES = 16

# A key per process for the fake salts of unknown users.
_FAKE_SALT_KEY = secrets.token_bytes(32)


class ScramError(Exception):
    """A refused exchange; ``error`` is the RFC 5802 server-error-value."""

    def __init__(self, error: str, message: str) -> None:
        super().__init__(message)
        self.error = error

    @property
    def server_final_error(self) -> bytes:
        """The server-final-message that reports this error to the client (``e=...``)."""
        return b"e=" + self.error.encode()


@dataclasses.dataclass(frozen=True)
class ScramCredential:
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes

    def to_json(self) -> dict[str, Any]:
        return {
            "salt": _b64(self.salt),
            "iterations": self.iterations,
            "stored_key": _b64(self.stored_key),
            "server_key": _b64(self.server_key),
        }

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> ScramCredential:
        return cls(
            salt=base64.b64decode(value["salt"]),
            iterations=int(value["iterations"]),
            stored_key=base64.b64decode(value["stored_key"]),
            server_key=base64.b64decode(value["server_key"]),
        )


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _hash_name(mechanism: str) -> str:
    try:
        return MECHANISMS[mechanism]
    except KeyError:
        raise ValueError(f"unknown SCRAM mechanism {mechanism!r}") from None


def _hmac(hash_name: str, key: bytes, data: bytes) -> bytes:
    return hmac.digest(key, data, hash_name)


def salted_password(mechanism: str, password: str | bytes, salt: bytes, iterations: int) -> bytes:
    """Hi(password, salt, i) of RFC 5802 §2.2: PBKDF2 with the mechanism's HMAC."""
    raw = password.encode("utf-8") if isinstance(password, str) else password
    return hashlib.pbkdf2_hmac(_hash_name(mechanism), raw, salt, iterations)


def make_credential(
    mechanism: str,
    password: str | bytes,
    *,
    salt: bytes | None = None,
    iterations: int = DEFAULT_ITERATIONS,
) -> ScramCredential:
    """The server's stored credential for ``password`` (a fresh random salt unless given).
    CPU-bound (PBKDF2): call it off the event loop."""
    hash_name = _hash_name(mechanism)
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise ValueError(f"iterations must be {MIN_ITERATIONS} to {MAX_ITERATIONS}")
    salt = secrets.token_bytes(SALT_BYTES) if salt is None else salt
    salted = salted_password(mechanism, password, salt, iterations)
    client_key = _hmac(hash_name, salted, b"Client Key")
    return ScramCredential(
        salt=salt,
        iterations=iterations,
        stored_key=hashlib.new(hash_name, client_key).digest(),
        server_key=_hmac(hash_name, salted, b"Server Key"),
    )


@dataclasses.dataclass(frozen=True)
class ClientFirst:
    """A parsed client-first-message."""

    gs2_header: str  # "n,," / "y,," / "n,a=...," — echoed (base64) in the client-final
    authzid: str | None
    username: str  # decoded: "=2C" -> ",", "=3D" -> "="
    nonce: str
    extensions: dict[str, str]  # e.g. Kafka's {"tokenauth": "true"}
    bare: str  # client-first-message-bare, part of AuthMessage


def decode_saslname(value: str) -> str:
    """RFC 5802 saslname: "=2C" is ",", "=3D" is "="; any other "=" is an error."""
    out, i = [], 0
    while i < len(value):
        char = value[i]
        if char == ",":
            raise ScramError("invalid-username-encoding", "',' in a user name must be =2C")
        if char == "=":
            escape = value[i : i + 3]
            if escape == "=2C":
                out.append(",")
            elif escape == "=3D":
                out.append("=")
            else:
                raise ScramError("invalid-username-encoding", f"bad escape {escape!r}")
            i += 3
        else:
            out.append(char)
            i += 1
    return "".join(out)


def encode_saslname(name: str) -> str:
    return name.replace("=", "=3D").replace(",", "=2C")


def _attributes(parts: list[str], what: str) -> list[tuple[str, str]]:
    pairs = []
    for part in parts:
        if len(part) < 2 or part[1] != "=" or not part[0].isalpha():
            raise ScramError("other-error", f"malformed attribute {part[:20]!r} in {what}")
        pairs.append((part[0], part[2:]))
    return pairs


def _valid_nonce(nonce: str) -> bool:
    # printable = %x21-2B / %x2D-7E: visible ASCII except ','
    return bool(nonce) and all(0x21 <= ord(c) <= 0x7E and c != "," for c in nonce)


def _decode(message: bytes, what: str) -> str:
    try:
        return message.decode("utf-8")
    except UnicodeDecodeError:
        raise ScramError("invalid-encoding", f"{what} is not UTF-8") from None


def parse_client_first(message: bytes) -> ClientFirst:
    text = _decode(message, "client-first-message")
    parts = text.split(",")
    if len(parts) < 4:
        raise ScramError("other-error", "client-first-message too short")
    cbind, authz = parts[0], parts[1]
    if cbind == "p" or cbind.startswith("p="):
        raise ScramError("channel-binding-not-supported", "channel binding is not supported")
    if cbind not in ("n", "y"):
        raise ScramError("other-error", f"bad gs2 channel-binding flag {cbind[:10]!r}")
    if authz and not authz.startswith("a="):
        raise ScramError("other-error", "bad gs2 authzid")
    authzid = decode_saslname(authz[2:]) if authz else None
    bare_parts = parts[2:]
    if bare_parts[0].startswith("m="):
        raise ScramError("extensions-not-supported", "mandatory extension not supported")
    attrs = _attributes(bare_parts[:2], "client-first-message")
    if attrs[0][0] != "n" or attrs[1][0] != "r":
        raise ScramError("other-error", "client-first-message must start n=...,r=...")
    nonce = attrs[1][1]
    if not _valid_nonce(nonce):
        raise ScramError("other-error", "client nonce is empty or not printable")
    extensions: dict[str, str] = {}
    for part in bare_parts[2:]:  # Kafka extensions look like "tokenauth=true"
        key, sep, value = part.partition("=")
        if not sep or not key:
            raise ScramError("other-error", f"malformed extension {part[:20]!r}")
        extensions[key] = value
    return ClientFirst(
        gs2_header=f"{cbind},{authz},",
        authzid=authzid,
        username=decode_saslname(attrs[0][1]),
        nonce=nonce,
        extensions=extensions,
        bare=",".join(bare_parts),
    )


def _fake_credential(mechanism: str, username: str) -> ScramCredential:
    """Stands in for an unknown user: the same salt every time for the same name, and keys
    that no proof can match (random, so they match no password)."""
    salt = hmac.digest(_FAKE_SALT_KEY, username.encode("utf-8", "surrogatepass"), "sha256")
    size = hashlib.new(_hash_name(mechanism)).digest_size
    return ScramCredential(
        salt[:SALT_BYTES], DEFAULT_ITERATIONS, secrets.token_bytes(size), secrets.token_bytes(size)
    )


class ScramServer:
    """The server side of one SCRAM exchange (see the module docstring)."""

    def __init__(self, mechanism: str) -> None:
        self.mechanism = mechanism
        self._hash = _hash_name(mechanism)
        self.client_first: ClientFirst | None = None
        self.credential: ScramCredential | None = None
        self.unknown_user = False
        self._server_first: str | None = None
        self._nonce = ""
        self.done = False

    def receive_client_first(self, message: bytes) -> ClientFirst:
        if self.client_first is not None:
            raise ScramError("other-error", "client-first-message received twice")
        self.client_first = parse_client_first(message)
        return self.client_first

    def server_first(self, credential: ScramCredential | None, nonce: str | None = None) -> bytes:
        """The server-first-message for the user's credential (``None``: unknown user).
        ``nonce`` is the server's part of the nonce (random by default; tests pin it)."""
        first = self.client_first
        if first is None or self._server_first is not None:
            raise ScramError("other-error", "server-first out of order")
        if credential is None:
            self.unknown_user = True
            credential = _fake_credential(self.mechanism, first.username)
        server_nonce = secrets.token_urlsafe(24) if nonce is None else nonce
        if not _valid_nonce(server_nonce):
            raise ValueError("server nonce must be printable ASCII without ','")
        self.credential = credential
        self._nonce = first.nonce + server_nonce
        self._server_first = f"r={self._nonce},s={_b64(credential.salt)},i={credential.iterations}"
        return self._server_first.encode("ascii")

    def receive_client_final(self, message: bytes) -> bytes:
        """Verify the client's proof; returns the server-final-message ``v=<signature>``.
        Raises ``ScramError`` (send ``exc.server_final_error``, or fail the SASL step)."""
        first, credential = self.client_first, self.credential
        if first is None or credential is None or self._server_first is None or self.done:
            raise ScramError("other-error", "client-final out of order")
        self.done = True
        text = _decode(message, "client-final-message")
        without_proof, sep, proof_part = text.rpartition(",p=")
        if not sep:
            raise ScramError("other-error", "client-final-message has no proof")
        attrs = _attributes(without_proof.split(","), "client-final-message")
        if len(attrs) < 2 or attrs[0][0] != "c" or attrs[1][0] != "r":
            raise ScramError("other-error", "client-final-message must start c=...,r=...")
        try:
            channel_binding = base64.b64decode(attrs[0][1], validate=True)
            proof = base64.b64decode(proof_part, validate=True)
        except (binascii.Error, ValueError):
            raise ScramError("invalid-encoding", "bad base64 in client-final-message") from None
        if channel_binding != first.gs2_header.encode("utf-8"):
            raise ScramError("channel-bindings-dont-match", "channel binding does not match")
        if not hmac.compare_digest(attrs[1][1].encode(), self._nonce.encode()):
            raise ScramError("other-error", "nonce does not match")
        auth_message = f"{first.bare},{self._server_first},{without_proof}".encode()
        client_signature = _hmac(self._hash, credential.stored_key, auth_message)
        if len(proof) != len(client_signature):
            raise ScramError("invalid-proof", "invalid proof")
        client_key = bytes(a ^ b for a, b in zip(proof, client_signature, strict=True))
        stored_key = hashlib.new(self._hash, client_key).digest()
        if not hmac.compare_digest(stored_key, credential.stored_key) or self.unknown_user:
            raise ScramError("invalid-proof", "invalid proof")
        server_signature = _hmac(self._hash, credential.server_key, auth_message)
        return b"v=" + _b64(server_signature).encode("ascii")
