"""``flowmq serve`` as a user runs it: a real process, real ports, real signals."""

from __future__ import annotations

import json
import signal
import socket
import urllib.error
import urllib.request

import pytest

from tests.fixtures.broker_process import run_broker_expecting_failure, start_broker


def get_json(url: str, token: str | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_first_start_generates_token_and_serves_api(tmp_path):
    data_dir = tmp_path / "data"
    broker = start_broker(data_dir)
    try:
        token = broker.token
        assert len(token) >= 32
        assert (data_dir / "admin_token").stat().st_mode & 0o077 == 0
        assert any(token in line for line in broker.output), "token printed once at first start"
        assert (data_dir / "meta.db").exists() and (data_dir / "objects").is_dir()
        assert set(broker.ports) >= {"http", "node_id"}
        status, body = get_json(f"{broker.http}/api/v1/streams", token)
        assert status == 200 and body["success"] is True
        assert get_json(f"{broker.http}/api/v1/streams")[0] == 401
    finally:
        assert broker.stop() == 0, "".join(broker.output)

    # Second start: same token, not printed again; the stream catalog persisted.
    broker = start_broker(data_dir)
    try:
        assert broker.token == token
        assert not any(token in line for line in broker.output)
    finally:
        assert broker.stop() == 0


def test_sigint_stops_cleanly_and_leaves_the_node_table(tmp_path):
    broker = start_broker(tmp_path / "d", "--admin-token", "t0k", "--node-id", "n1")
    status, body = get_json(f"{broker.http}/api/v1/cluster/nodes", "t0k")
    assert [n["node_id"] for n in body["data"]] == ["n1"]
    broker.proc.send_signal(signal.SIGINT)
    assert broker.proc.wait(10) == 0
    # A restarted node sees only itself: the stopped one removed its entry.
    broker = start_broker(tmp_path / "d", "--admin-token", "t0k", "--node-id", "n2")
    try:
        status, body = get_json(f"{broker.http}/api/v1/cluster/nodes", "t0k")
        assert [n["node_id"] for n in body["data"]] == ["n2"]
    finally:
        broker.stop()


def test_a_broker_restarted_after_sigkill_drops_the_entry_of_its_former_self(tmp_path):
    """Killed, a broker leaves its entry behind with a fresh heartbeat; restarted on the same
    data dir under another node id (derived from an HTTP port of 0), it took that entry for
    a live peer for up to 15 s, and told Kafka clients the dead process led some partitions
    (the SIGKILL durability test's ListOffsets timed out on its closed port)."""
    data_dir = tmp_path / "d"
    broker = start_broker(data_dir, "--admin-token", "t0k")
    former = broker.ports["node_id"]
    broker.proc.kill()
    broker.proc.wait(10)
    broker = start_broker(data_dir, "--admin-token", "t0k")
    try:
        assert broker.ports["node_id"] != former
        status, body = get_json(f"{broker.http}/api/v1/cluster/nodes", "t0k")
        assert [n["node_id"] for n in body["data"]] == [broker.ports["node_id"]]
        assert any(f"removed the entry of {former}" in line for line in broker.output)
        # A second broker on a data dir in use removes nothing: the first holds its lock.
        second = start_broker(data_dir, "--admin-token", "t0k")
        try:
            status, body = get_json(f"{second.http}/api/v1/cluster/nodes", "t0k")
            ids = {broker.ports["node_id"], second.ports["node_id"]}
            assert {n["node_id"] for n in body["data"] if n["status"] == "up"} == ids
            assert not any("removed the entry" in line for line in second.output)
        finally:
            second.stop()
    finally:
        broker.stop()


def test_env_and_config_file(tmp_path, monkeypatch):
    config = tmp_path / "flowmq.toml"
    config.write_text('admin_token = "from-file"\nroles = ["admin"]\n')
    monkeypatch.setenv("FLOWMQ_NODE_ID", "env-node")
    broker = start_broker(tmp_path / "d", "--config", str(config))
    try:
        status, body = get_json(f"{broker.http}/api/v1/cluster/nodes", "from-file")
        assert status == 200 and body["data"][0]["node_id"] == "env-node"
        assert body["data"][0]["roles"] == ["admin"]
    finally:
        broker.stop()


def test_port_in_use_is_one_clear_line(tmp_path):
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, output = run_broker_expecting_failure(tmp_path / "d", "--http-port", str(port))
    assert code != 0
    assert f"cannot listen on HTTP port {port}" in output
    assert "Traceback" not in output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--meta", "postgres://x"], "meta store URL"),
        (["--objects", "ftp://x"], "object store URL"),
        (["--http-port", "http"], "--http-port"),
        (["--roles", "smtp"], "roles"),
        (
            ["--gossip-probe-interval", "0.5", "--gossip-probe-timeout", "0.5"],
            "gossip settings: probe_timeout must be shorter than probe_interval",
        ),
    ],
)
def test_bad_settings_are_one_clear_line(tmp_path, args, message):
    code, output = run_broker_expecting_failure(tmp_path / "d", *args)
    assert code != 0 and message in output, output
    assert "Traceback" not in output


def test_unusable_data_dir(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    code, output = run_broker_expecting_failure(blocker / "data", "--http-port", "0")
    assert code != 0 and "data dir" in output and "Traceback" not in output, output
