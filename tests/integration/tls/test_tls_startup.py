"""A TLS setting the broker cannot use stops it before it binds anything, with one line
naming the key and the file, and exit code 1."""

from __future__ import annotations

import pytest

from tests.fixtures.broker_process import run_broker_expecting_failure


@pytest.mark.parametrize(
    ("files", "message"),
    [
        (
            lambda pki, d: (d / "missing.crt", pki.server.key),
            "cannot read tls_cert {d}/missing.crt: No such file or directory",
        ),
        (
            lambda pki, d: (pki.ca, d / "garbage.key"),
            "tls_key {d}/garbage.key holds no PEM private key",
        ),
        (
            lambda pki, d: (d / "garbage.key", pki.server.key),
            "tls_cert {d}/garbage.key holds no PEM certificate",
        ),
        (
            lambda pki, d: (pki.server.cert, pki.clients["alice"].key),
            "is not the private key of tls_cert",
        ),
    ],
    ids=["missing-cert", "key-not-pem", "cert-not-pem", "key-of-another-cert"],
)
def test_unusable_certificate_stops_the_broker_with_one_line(pki, tmp_path, files, message):
    (tmp_path / "garbage.key").write_text("not a PEM file\n")
    cert, key = files(pki, tmp_path)
    code, output = run_broker_expecting_failure(
        tmp_path / "data", "--tls-cert", str(cert), "--tls-key", str(key)
    )
    assert code == 1
    lines = output.strip().splitlines()
    assert len(lines) == 1, output
    assert lines[0].startswith("flowmq: tls_") or lines[0].startswith("flowmq: cannot read tls_")
    assert message.format(d=tmp_path) in lines[0]
    assert not (tmp_path / "data" / "ports.json").exists()
