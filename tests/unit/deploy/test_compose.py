"""The production compose file is valid Compose and refers only to files that exist.

No Docker engine runs here, so the file is checked against the Compose specification
(check-jsonschema's vendored `compose-spec` schema) rather than by `docker compose config`.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
COMPOSE = ROOT / "docker-compose.yml"


def test_compose_file_matches_the_compose_specification():
    checker = Path(sys.executable).with_name("check-jsonschema")
    done = subprocess.run(
        [str(checker), "--builtin-schema", "vendor.compose-spec", str(COMPOSE)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_file_the_compose_file_refers_to_exists():
    spec = yaml.safe_load(COMPOSE.read_text())
    referenced = []
    for service in spec["services"].values():
        build = service.get("build")
        if isinstance(build, dict):
            referenced.append(Path(build.get("context", ".")) / build["dockerfile"])
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith((".", "/")):
                referenced.append(Path(source))
    assert referenced, "the compose file should build the image and mount the Prometheus config"
    missing = [str(path) for path in referenced if not (ROOT / path).exists()]
    assert not missing, missing


def test_the_example_cluster_file_has_the_fdb_format():
    lines = [
        line
        for line in (ROOT / "fdb.cluster.example").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert len(lines) == 1
    description_id, _, coordinators = lines[0].partition("@")
    assert ":" in description_id and coordinators
    assert all(":" in address for address in coordinators.split(","))


def _services() -> dict:
    return yaml.safe_load(COMPOSE.read_text())["services"]


def _brokers() -> dict:
    return {name: svc for name, svc in _services().items() if name.startswith("broker-")}


def test_brokers_wait_for_a_healthy_store_and_completed_setup():
    services = _services()
    assert services["fdb"]["healthcheck"]["test"], "FoundationDB needs a health check"
    assert len(_brokers()) >= 3
    for name, broker in _brokers().items():
        depends = broker["depends_on"]
        assert isinstance(depends, dict), name
        assert depends["fdb"]["condition"] == "service_healthy", name
        for setup in ("fdb-init", "minio-init"):
            assert depends[setup]["condition"] == "service_completed_successfully", name
    for name in ("broker-mqtt", "broker-kafka"):  # they seed from broker-all
        assert _brokers()[name]["depends_on"]["broker-all"]["condition"] == "service_healthy"


def test_every_broker_has_a_readiness_health_check_runnable_in_the_image():
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    assert "FROM python:" in dockerfile  # so the probe can be python's urllib
    for name, broker in _brokers().items():
        test = broker["healthcheck"]["test"]
        assert test[:3] == ["CMD", "python", "-c"], name
        assert "/api/v1/ready" in test[3], name
        compile(test[3], "healthcheck", "exec")


FDB_INIT = ROOT / "deploy" / "fdb-init.sh"


def _run_fdb_init(tmp_path: Path, output: str, rc: int) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "output").write_text(output + "\n")
    fake = bin_dir / "fdbcli"
    fake.write_text(f"#!/bin/sh\ncat '{tmp_path / 'output'}'\nexit {rc}\n")
    fake.chmod(0o755)
    cluster = tmp_path / "fdb.cluster"
    cluster.write_text("docker:docker@127.0.0.1:4500\n")
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "FDB_CLUSTER_FILE": str(cluster),
        "FDB_INIT_ATTEMPTS": "2",
        "FDB_INIT_DELAY": "0",
    }
    return subprocess.run(
        ["/bin/sh", str(FDB_INIT)], env=env, capture_output=True, text=True, timeout=30
    )


def test_fdb_init_runs_the_mounted_script():
    init = _services()["fdb-init"]
    assert "./deploy/fdb-init.sh:/fdb-init.sh:ro" in init["volumes"]
    assert init["entrypoint"] == ["/bin/sh", "/fdb-init.sh"]
    assert "|| true" not in FDB_INIT.read_text()


@pytest.mark.parametrize(
    ("output", "rc", "ok"),
    [
        ("Database created", 0, True),
        ("ERROR: Database already exists! To change configuration, don't say `new'", 1, True),
        ("ERROR: Database already exists! To change configuration, don't say `new'", 0, True),
        ("ERROR: Could not communicate with a quorum of coordination servers", 1, False),
        ("ERROR: unknown storage engine", 0, False),
    ],
)
def test_fdb_init_fails_loudly_except_when_the_database_exists(tmp_path, output, rc, ok):
    done = _run_fdb_init(tmp_path, output, rc)
    assert (done.returncode == 0) is ok, done.stdout + done.stderr
    if not ok:
        assert "failed after 2 attempts" in done.stderr
