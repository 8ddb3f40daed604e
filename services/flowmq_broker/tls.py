"""TLS for the client listeners (DESIGN.md §12, docs/security.md "TLS"): one server
``SSLContext`` built once at start from ``tls_cert``/``tls_key`` (and ``tls_ca``), shared by
the MQTT, Kafka, AMQP and HTTP TLS listeners.

Invariants:

- A broker with no ``tls_cert`` has no ``ServerTls`` and opens no TLS port.
- Every problem with the files (missing, unreadable, not PEM, encrypted key, key not the
  certificate's) is found here, before anything is bound, and told as one line
  (``TlsError``; the broker turns it into a ``StartupError``).
- With ``tls_ca`` every TLS client must present a certificate signed by it, else the
  handshake fails; the connection never reaches a protocol adapter.
- ``peer_username`` gives a user name only for a verified client certificate, and only
  with ``tls_cert_as_username``: adapters use it in place of a password login.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ssl
from pathlib import Path

from flowmq_core.config import BrokerConfig


class TlsError(Exception):
    """The TLS settings cannot be used; the message is one line naming the key and file."""


@dataclasses.dataclass(frozen=True)
class ServerTls:
    context: ssl.SSLContext
    # Mosquitto's use_identity_as_username: the client certificate's subject CN is the user.
    cert_as_username: bool = False

    def peer_username(self, transport: asyncio.BaseTransport) -> str | None:
        """The user a connection is authenticated as by its client certificate: the subject
        CN, when ``cert_as_username`` is on and the transport is TLS; else None."""
        if not self.cert_as_username:
            return None
        ssl_object = transport.get_extra_info("ssl_object")
        if ssl_object is None:
            return None
        return certificate_cn(ssl_object.getpeercert())


def certificate_cn(cert: dict | None) -> str | None:
    """The (last) commonName of a certificate's subject, as ``getpeercert()`` gives it."""
    names = [
        value
        for rdn in (cert or {}).get("subject", ())
        for key, value in rdn
        if key == "commonName"
    ]
    return names[-1] if names else None


def _read(key: str, path: str) -> str:
    try:
        return Path(path).expanduser().read_text()
    except UnicodeDecodeError:
        raise TlsError(f"{key} {path} is not a PEM file (not text)") from None
    except OSError as exc:
        raise TlsError(f"cannot read {key} {path}: {exc.strerror}") from None


def _check_certificates(key: str, path: str, text: str) -> None:
    """``text`` holds at least one PEM certificate and all of them parse."""
    if "-----BEGIN CERTIFICATE-----" not in text:
        raise TlsError(f"{key} {path} holds no PEM certificate")
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cadata=text)
    except ssl.SSLError as exc:
        raise TlsError(f"{key} {path} holds an invalid PEM certificate{_reason(exc)}") from None


def _reason(exc: ssl.SSLError) -> str:
    """`` (OpenSSL's reason)`` to end a message with, or nothing when it gives none."""
    return f" ({exc.reason.replace('_', ' ').lower()})" if exc.reason else ""


def _encrypted_key() -> bytes:
    raise TlsError("encrypted")


def server_tls(config: BrokerConfig) -> ServerTls | None:
    """The TLS settings of ``config`` checked and loaded; None when TLS is not configured."""
    cert, key, ca = config.tls_cert, config.tls_key, config.tls_ca
    if not cert:
        if key or ca or config.tls_cert_as_username:
            raise TlsError("tls_key, tls_ca and tls_cert_as_username need tls_cert")
        return None
    if not key:
        raise TlsError("tls_cert needs tls_key (the certificate's private key, PEM)")
    if config.tls_cert_as_username and not ca:
        raise TlsError("tls_cert_as_username needs tls_ca (client certificates to read)")
    _check_certificates("tls_cert", cert, _read("tls_cert", cert))
    key_text = _read("tls_key", key)
    if "PRIVATE KEY-----" not in key_text:
        raise TlsError(f"tls_key {key} holds no PEM private key")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(
            Path(cert).expanduser(), Path(key).expanduser(), password=_encrypted_key
        )
    except TlsError:
        raise TlsError(
            f"tls_key {key} is encrypted; give the key without a passphrase (mode 0600)"
        ) from None
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            raise TlsError(f"tls_key {key} is not the private key of tls_cert {cert}") from None
        raise TlsError(f"tls_key {key} holds an invalid PEM private key{_reason(exc)}") from None
    if ca:
        _check_certificates("tls_ca", ca, _read("tls_ca", ca))
        context.load_verify_locations(cafile=Path(ca).expanduser())
        context.verify_mode = ssl.CERT_REQUIRED
    return ServerTls(context, cert_as_username=config.tls_cert_as_username)


__all__ = ["ServerTls", "TlsError", "certificate_cn", "server_tls"]
