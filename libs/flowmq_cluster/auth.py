"""The closed cluster plane (DESIGN.md §12): who may speak on gossip and on the links.

Invariants:

- With a secret, no gossip datagram is parsed unless its MAC verifies and its timestamp is
  within ``WINDOW_S`` of our clock; no link frame reaches the frame handler unless the peer
  proved, on that connection, that it knows the secret (challenge-response below); and no
  frame of ours goes out on a link until the peer proved it to us.
- Without a secret the plane is open, so it may only be bound to a loopback address
  (``check_bind``); the broker refuses to start otherwise.
- The gossip key and the link key are derived from the secret for their plane alone, so a
  value valid on one plane is never valid on the other.
- A rejected datagram or connection is counted in ``cluster_auth_failures_count{plane}``
  every time, and logged once per source address (``FailureLog``): a flood from one address
  is one log line.

Gossip wire format (``GossipSeal``)::

    version (1 byte, 1) | timestamp (8 bytes, big-endian ms since the Unix epoch)
    | mac (32 bytes) | body
    mac = HMAC-SHA256(gossip key, version | timestamp | body)

Link handshake (``LinkHandshake``; msgpack frames, ``role`` is ``initiator`` for the side
that connected, ``acceptor`` for the other)::

    both, at once:                       ["hello", node id, nonce (16 random bytes)]
    initiator, on the acceptor's hello:  ["proof", proof(initiator)]
    acceptor, once that proof verified:  ["proof", proof(acceptor)]
    proof(role) = HMAC-SHA256(link key, msgpack(["flowmq-link-v1", initiator nonce,
                                                 acceptor nonce, prover's node id, role]))

Each side checks the other's proof with the other's node id and role; then frames flow, with
no per-frame cost (the TCP connection is what was authenticated).  A proof cannot be replayed
(fresh nonces on both sides) nor reflected (it names the prover's role); the acceptor proves
only to an initiator that proved first, so an unauthenticated client gets no MAC of ours to
attack offline.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import os
import time

import msgpack

import flowmq_metrics as metrics

log = logging.getLogger("flowmq.cluster.auth")

WINDOW_S = 30.0  # a gossip datagram older or newer than this is rejected
GOSSIP_VERSION = 1
NONCE_BYTES = 16
MAC_BYTES = hashlib.sha256().digest_size
_GOSSIP_HEADER = 1 + 8 + MAC_BYTES
_LINK_LABEL = "flowmq-link-v1"
MIN_SECRET_BYTES = 16
# Distinct sources logged individually; past this (a spoofing flood) they are only counted.
MAX_LOGGED_SOURCES = 1024

INITIATOR = "initiator"
ACCEPTOR = "acceptor"


class AuthFailure(Exception):
    """A datagram or a connection failed authentication; the message says why."""


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(host: str, secret: ClusterSecret | None) -> None:
    """Refuse an open plane (no secret) on anything but a loopback address."""
    if secret is None and not is_loopback(host):
        raise ValueError(
            f"cluster_bind {host} is not loopback, so the cluster plane needs a secret: "
            "set cluster_secret_file (or cluster_secret, FLOWMQ_CLUSTER_SECRET)"
        )


class ClusterSecret:
    """The shared secret of a cluster, as one key per plane."""

    __slots__ = ("gossip_key", "link_key")

    def __init__(self, secret: str | bytes) -> None:
        raw = secret.encode() if isinstance(secret, str) else bytes(secret)
        if len(raw) < MIN_SECRET_BYTES:
            raise ValueError(f"the cluster secret must be at least {MIN_SECRET_BYTES} bytes")
        self.gossip_key = hmac.new(raw, b"flowmq gossip v1", hashlib.sha256).digest()
        self.link_key = hmac.new(raw, b"flowmq link v1", hashlib.sha256).digest()

    def __repr__(self) -> str:  # never show the keys
        return "ClusterSecret(…)"


class FailureLog:
    """Counts every authentication failure of one plane; logs once per source address."""

    def __init__(self, plane: str) -> None:
        self.plane = plane
        self.count = 0
        self._counter = metrics.cluster_auth_failures_count.labels(plane)
        self._logged: set[str] = set()
        self._overflowed = False

    def __call__(self, host: str, reason: str) -> None:
        self.count += 1
        self._counter.inc()
        if host in self._logged:
            return
        if len(self._logged) >= MAX_LOGGED_SOURCES:
            if not self._overflowed:
                self._overflowed = True
                log.warning(
                    "cluster %s: authentication failures from more than %d addresses; "
                    "further addresses are only counted (cluster_auth_failures_count)",
                    self.plane,
                    MAX_LOGGED_SOURCES,
                )
            return
        self._logged.add(host)
        log.warning(
            "cluster %s: rejected %s from %s; further failures from this address are only "
            "counted (cluster_auth_failures_count)",
            self.plane,
            reason,
            host,
        )


class GossipSeal:
    """Seals outgoing gossip datagrams and opens incoming ones (format: module docstring)."""

    overhead = _GOSSIP_HEADER

    def __init__(self, secret: ClusterSecret, window_s: float = WINDOW_S) -> None:
        self._key = secret.gossip_key
        self._window_ms = int(window_s * 1000)

    def seal(self, body: bytes, now_ms: int | None = None) -> bytes:
        head = bytes((GOSSIP_VERSION,)) + _now_ms(now_ms).to_bytes(8, "big")
        mac = hmac.new(self._key, head + body, hashlib.sha256).digest()
        return head + mac + body

    def open(self, packet: bytes, now_ms: int | None = None) -> bytes:
        """The body of an authentic, fresh ``packet``; AuthFailure otherwise."""
        if len(packet) < _GOSSIP_HEADER or packet[0] != GOSSIP_VERSION:
            raise AuthFailure("an unsealed gossip datagram (a node with no cluster secret?)")
        head, mac, body = packet[:9], packet[9:_GOSSIP_HEADER], packet[_GOSSIP_HEADER:]
        expected = hmac.new(self._key, head + body, hashlib.sha256).digest()
        if not hmac.compare_digest(mac, expected):
            raise AuthFailure("a gossip datagram with a bad MAC (another cluster secret?)")
        skew = _now_ms(now_ms) - int.from_bytes(head[1:9], "big")
        if abs(skew) > self._window_ms:
            raise AuthFailure(f"a gossip datagram {skew / 1000:+.0f} s off our clock")
        return body


def _now_ms(now_ms: int | None) -> int:
    return time.time_ns() // 1_000_000 if now_ms is None else now_ms


class LinkHandshake:
    """One connection's side of the challenge-response (format: module docstring)."""

    __slots__ = ("_key", "node_id", "role", "nonce", "peer_nonce", "peer", "proved")

    def __init__(self, secret: ClusterSecret, node_id: str, role: str) -> None:
        self._key = secret.link_key
        self.node_id = node_id
        self.role = role
        self.nonce = os.urandom(NONCE_BYTES)
        self.peer_nonce: bytes | None = None
        self.peer = ""
        self.proved = False  # the peer proved that it knows the secret

    def hello(self) -> list[object]:
        return ["hello", self.node_id, self.nonce]

    def on_hello(self, frame: object) -> None:
        """Take the peer's hello (its node id and nonce)."""
        if not (isinstance(frame, list) and frame and frame[0] == "hello"):
            raise AuthFailure("a frame before the handshake completed")
        if not (
            len(frame) == 3
            and isinstance(frame[1], str)
            and isinstance(frame[2], bytes)
            and len(frame[2]) == NONCE_BYTES
        ):
            raise AuthFailure("a link hello without a nonce (a peer with no cluster secret?)")
        self.peer, self.peer_nonce = frame[1], frame[2]

    def proof(self) -> list[object]:
        """Our proof frame (once the peer's hello is in)."""
        return ["proof", self._proof(self.node_id, self.role)]

    def on_proof(self, frame: object) -> None:
        """Check the peer's proof; AuthFailure unless it is right."""
        if not (isinstance(frame, list) and len(frame) == 2 and frame[0] == "proof"):
            raise AuthFailure("a frame before the handshake completed")
        peer_role = ACCEPTOR if self.role == INITIATOR else INITIATOR
        if not (
            isinstance(frame[1], bytes)
            and hmac.compare_digest(frame[1], self._proof(self.peer, peer_role))
        ):
            raise AuthFailure("a link handshake with a wrong proof (another cluster secret?)")
        self.proved = True

    def _proof(self, node_id: str, role: str) -> bytes:
        assert self.peer_nonce is not None
        if self.role == INITIATOR:
            nonces = (self.nonce, self.peer_nonce)
        else:
            nonces = (self.peer_nonce, self.nonce)
        data = msgpack.packb([_LINK_LABEL, *nonces, node_id, role], use_bin_type=True)
        return hmac.new(self._key, data, hashlib.sha256).digest()


__all__ = [
    "ACCEPTOR",
    "INITIATOR",
    "AuthFailure",
    "ClusterSecret",
    "FailureLog",
    "GossipSeal",
    "LinkHandshake",
    "check_bind",
    "is_loopback",
]
