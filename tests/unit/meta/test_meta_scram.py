"""The SCRAM server side against RFC 7677's test vector, and round trips with a client written
here from the RFC 5802 formulas (not from the module under test)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

import pytest

from flowmq_meta.scram import (
    MIN_ITERATIONS,
    SCRAM_SHA_256,
    SCRAM_SHA_512,
    ScramError,
    ScramServer,
    make_credential,
    parse_client_first,
)

# RFC 7677 §3
RFC7677_CLIENT_FIRST = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
RFC7677_SERVER_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
RFC7677_SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
RFC7677_SERVER_FIRST = (
    b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
)
RFC7677_CLIENT_FINAL = (
    b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
    b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
)
RFC7677_SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def test_rfc7677_sha256_vector():
    credential = make_credential(SCRAM_SHA_256, "pencil", salt=RFC7677_SALT, iterations=4096)
    server = ScramServer(SCRAM_SHA_256)
    first = server.receive_client_first(RFC7677_CLIENT_FIRST)
    assert (first.username, first.nonce, first.authzid) == ("user", "rOprNGfwEbeRWgbNEkqO", None)
    assert server.server_first(credential, nonce=RFC7677_SERVER_NONCE) == RFC7677_SERVER_FIRST
    assert server.receive_client_final(RFC7677_CLIENT_FINAL) == RFC7677_SERVER_FINAL


def test_rfc7677_vector_with_a_wrong_password_is_refused():
    credential = make_credential(SCRAM_SHA_256, "pencil!", salt=RFC7677_SALT, iterations=4096)
    server = ScramServer(SCRAM_SHA_256)
    server.receive_client_first(RFC7677_CLIENT_FIRST)
    server.server_first(credential, nonce=RFC7677_SERVER_NONCE)
    with pytest.raises(ScramError) as refused:
        server.receive_client_final(RFC7677_CLIENT_FINAL)
    assert refused.value.error == "invalid-proof"
    assert refused.value.server_final_error == b"e=invalid-proof"


class Client:
    """The client side of RFC 5802 §3, straight from its formulas."""

    def __init__(self, hash_name: str, user: str, password: str) -> None:
        self.hash_name, self.user, self.password = hash_name, user, password
        self.nonce = base64.b64encode(secrets.token_bytes(18)).decode()
        name = user.replace("=", "=3D").replace(",", "=2C")
        self.first_bare = f"n={name},r={self.nonce}"

    def first(self) -> bytes:
        return f"n,,{self.first_bare}".encode()

    def final(self, server_first: bytes) -> bytes:
        attrs = dict(part.split("=", 1) for part in server_first.decode().split(","))
        assert attrs["r"].startswith(self.nonce)
        h = self.hash_name
        salted = hashlib.pbkdf2_hmac(
            h, self.password.encode(), base64.b64decode(attrs["s"]), int(attrs["i"])
        )
        client_key = hmac.new(salted, b"Client Key", h).digest()
        stored_key = hashlib.new(h, client_key).digest()
        without_proof = f"c={base64.b64encode(b'n,,').decode()},r={attrs['r']}"
        auth_message = f"{self.first_bare},{server_first.decode()},{without_proof}".encode()
        signature = hmac.new(stored_key, auth_message, h).digest()
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        server_key = hmac.new(salted, b"Server Key", h).digest()
        self.expected_verifier = hmac.new(server_key, auth_message, h).digest()
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def check_server_final(self, message: bytes) -> None:
        assert message == b"v=" + base64.b64encode(self.expected_verifier)


@pytest.mark.parametrize(("mechanism", "hash_name"), [(SCRAM_SHA_256, "sha256"),
                                                       (SCRAM_SHA_512, "sha512")])  # fmt: skip
@pytest.mark.parametrize("user", ["alice", "a,b=c", "ünïcødé"])
def test_round_trip_with_an_rfc_client(mechanism, hash_name, user):
    credential = make_credential(mechanism, "s3cret")
    assert credential.iterations >= MIN_ITERATIONS
    client = Client(hash_name, user, "s3cret")
    server = ScramServer(mechanism)
    assert server.receive_client_first(client.first()).username == user
    final = client.final(server.server_first(credential))
    client.check_server_final(server.receive_client_final(final))


@pytest.mark.parametrize("mechanism", [SCRAM_SHA_256, SCRAM_SHA_512])
def test_wrong_password_refused(mechanism):
    client = Client("sha256" if mechanism == SCRAM_SHA_256 else "sha512", "alice", "guess")
    server = ScramServer(mechanism)
    server.receive_client_first(client.first())
    final = client.final(server.server_first(make_credential(mechanism, "s3cret")))
    with pytest.raises(ScramError, match="invalid proof"):
        server.receive_client_final(final)


def test_unknown_user_gets_a_stable_salt_and_is_refused_even_with_a_good_proof():
    salts = []
    for _ in range(2):
        client = Client("sha256", "nobody", "x")
        server = ScramServer(SCRAM_SHA_256)
        server.receive_client_first(client.first())
        server_first = server.server_first(None)
        salts.append(dict(p.split("=", 1) for p in server_first.decode().split(","))["s"])
        with pytest.raises(ScramError) as refused:
            server.receive_client_final(client.final(server_first))
        assert refused.value.error == "invalid-proof"
    assert salts[0] == salts[1]


def test_a_changed_nonce_is_refused():
    client = Client("sha256", "alice", "s3cret")
    server = ScramServer(SCRAM_SHA_256)
    server.receive_client_first(client.first())
    final = client.final(server.server_first(make_credential(SCRAM_SHA_256, "s3cret")))
    nonce = client.nonce.encode()
    other = b"Y" if nonce.startswith(b"X") else b"X"  # a nonce may begin with X (1 in 64)
    tampered = final.replace(b",r=" + nonce, b",r=" + other + nonce[1:])
    with pytest.raises(ScramError, match="nonce"):
        server.receive_client_final(tampered)


def test_a_replayed_client_final_is_refused():
    client = Client("sha256", "alice", "s3cret")
    server = ScramServer(SCRAM_SHA_256)
    server.receive_client_first(client.first())
    final = client.final(server.server_first(make_credential(SCRAM_SHA_256, "s3cret")))
    server.receive_client_final(final)
    with pytest.raises(ScramError, match="out of order"):
        server.receive_client_final(final)


@pytest.mark.parametrize(
    ("message", "error"),
    [
        (b"p=tls-unique,,n=u,r=abc", "channel-binding-not-supported"),
        (b"n,,m=ext,n=u,r=abc", "extensions-not-supported"),
        (b"n,,n=a=2Xb,r=abc", "invalid-username-encoding"),
        (b"n,,n=u,r=", "other-error"),
        (b"n,,r=abc,n=u", "other-error"),
        (b"n,,n=u", "other-error"),
        (b"\xff,,n=u,r=abc", "invalid-encoding"),
    ],
)
def test_malformed_client_first_refused(message, error):
    with pytest.raises(ScramError) as refused:
        parse_client_first(message)
    assert refused.value.error == error


def test_client_first_with_authzid_and_kafka_extension():
    first = parse_client_first(b"n,a=admin,n=bob,r=xyz,tokenauth=true")
    assert first.authzid == "admin"
    assert first.username == "bob"
    assert first.extensions == {"tokenauth": "true"}
    assert first.gs2_header == "n,a=admin,"
    assert first.bare == "n=bob,r=xyz,tokenauth=true"


def test_too_few_iterations_refused():
    with pytest.raises(ValueError):
        make_credential(SCRAM_SHA_256, "pw", iterations=MIN_ITERATIONS - 1)


def test_credential_json_round_trip():
    credential = make_credential(SCRAM_SHA_512, "pw")
    assert type(credential).from_json(credential.to_json()) == credential
