"""flowmq_broker.tls: the TLS keys checked before anything binds, one line per problem; the
context built from them; the certificate CN a connection logs in as."""

from __future__ import annotations

import ssl

import pytest
from cryptography.hazmat.primitives import serialization

from flowmq_broker.tls import ServerTls, TlsError, certificate_cn, server_tls
from flowmq_core.config import BrokerConfig, load_config
from tests.fixtures.tls import Pki, make_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def tls(pki: Pki, **keys) -> BrokerConfig:
    return BrokerConfig(tls_cert=str(pki.server.cert), tls_key=str(pki.server.key), **keys)


def test_keys_flags_env_and_defaults(tmp_path):
    defaults = BrokerConfig()
    assert (defaults.mqtt_tls_port, defaults.kafka_tls_port) == (8883, 9093)
    assert (defaults.amqp_tls_port, defaults.http_tls_port) == (5671, 8443)
    assert (defaults.tls_cert, defaults.tls_key, defaults.tls_ca) == ("", "", "")
    assert defaults.tls_cert_as_username is False
    config_file = tmp_path / "c.toml"
    config_file.write_text('tls_cert = "/etc/flowmq/server.crt"\nkafka_tls_port = 19093\n')
    env = {"FLOWMQ_TLS_KEY": "/etc/flowmq/server.key", "FLOWMQ_TLS_CERT_AS_USERNAME": "true"}
    flags = {"tls_ca": "/etc/flowmq/ca.crt", "mqtt_tls_port": "0"}
    cfg = load_config(flags, env=env, config_file=str(config_file))
    assert (cfg.tls_cert, cfg.tls_key, cfg.tls_ca) == (
        "/etc/flowmq/server.crt",
        "/etc/flowmq/server.key",
        "/etc/flowmq/ca.crt",
    )
    assert cfg.tls_cert_as_username is True
    assert (cfg.mqtt_tls_port, cfg.kafka_tls_port) == (0, 19093)


def test_no_certificate_no_tls():
    assert server_tls(BrokerConfig()) is None


def test_certificate_and_key_make_a_server_context(pki):
    settings = server_tls(tls(pki))
    assert isinstance(settings, ServerTls)
    assert settings.context.verify_mode == ssl.CERT_NONE
    assert settings.context.minimum_version >= ssl.TLSVersion.TLSv1_2
    assert settings.cert_as_username is False


def test_a_ca_makes_client_certificates_required(pki):
    settings = server_tls(tls(pki, tls_ca=str(pki.ca), tls_cert_as_username=True))
    assert settings is not None
    assert settings.context.verify_mode == ssl.CERT_REQUIRED
    assert settings.cert_as_username is True


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"tls_key": "k.pem"}, "need tls_cert"),
        ({"tls_ca": "ca.pem"}, "need tls_cert"),
        ({"tls_cert": "c.pem"}, "tls_cert needs tls_key"),
        ({"tls_cert": "c.pem", "tls_key": "k.pem", "tls_cert_as_username": True}, "needs tls_ca"),
    ],
)
def test_incomplete_settings_are_named(keys, message):
    with pytest.raises(TlsError, match=message):
        server_tls(BrokerConfig(**keys))


def test_unusable_files_are_named(pki, tmp_path):
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not PEM\n")
    broken = tmp_path / "broken.crt"
    text = pki.server.cert.read_text().splitlines()
    broken.write_text("\n".join([text[0], "AAAA" + text[1][4:], *text[2:]]) + "\n")
    encrypted = tmp_path / "encrypted.key"
    key = serialization.load_pem_private_key(pki.server.key.read_bytes(), None)
    encrypted.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
    )
    cert, key_path = str(pki.server.cert), str(pki.server.key)
    cases = [
        ({"tls_cert": str(tmp_path / "nope.crt"), "tls_key": key_path}, "cannot read tls_cert"),
        ({"tls_cert": cert, "tls_key": str(tmp_path)}, "cannot read tls_key"),
        ({"tls_cert": str(garbage), "tls_key": key_path}, "holds no PEM certificate"),
        ({"tls_cert": str(broken), "tls_key": key_path}, "holds an invalid PEM certificate"),
        ({"tls_cert": cert, "tls_key": str(garbage)}, "holds no PEM private key"),
        ({"tls_cert": cert, "tls_key": str(encrypted)}, "is encrypted"),
        (
            {"tls_cert": cert, "tls_key": str(pki.clients["alice"].key)},
            "is not the private key of tls_cert",
        ),
        ({"tls_cert": cert, "tls_key": key_path, "tls_ca": str(garbage)}, "tls_ca .* no PEM"),
    ]
    for keys, message in cases:
        with pytest.raises(TlsError, match=message) as caught:
            server_tls(BrokerConfig(**keys))
        assert "\n" not in str(caught.value)


def test_certificate_cn():
    subject = ((("countryName", "DE"),), (("commonName", "alice"),))
    assert certificate_cn({"subject": subject}) == "alice"
    assert certificate_cn({"subject": ((("organizationName", "x"),),)}) is None
    assert certificate_cn(None) is None


class _Transport:
    def __init__(self, ssl_object) -> None:
        self.ssl_object = ssl_object

    def get_extra_info(self, name: str):
        return self.ssl_object if name == "ssl_object" else None


class _SslObject:
    def getpeercert(self):
        return {"subject": ((("commonName", "alice"),),)}


def test_peer_username_only_with_cert_as_username_over_tls(pki):
    context = server_tls(tls(pki)).context  # type: ignore[union-attr]
    on = ServerTls(context, cert_as_username=True)
    off = ServerTls(context, cert_as_username=False)
    assert on.peer_username(_Transport(_SslObject())) == "alice"  # type: ignore[arg-type]
    assert off.peer_username(_Transport(_SslObject())) is None  # type: ignore[arg-type]
    assert on.peer_username(_Transport(None)) is None  # type: ignore[arg-type]
