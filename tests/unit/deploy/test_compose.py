"""The production compose file is valid Compose and refers only to files that exist.

No Docker engine runs here, so the file is checked against the Compose specification
(check-jsonschema's vendored `compose-spec` schema) rather than by `docker compose config`.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
