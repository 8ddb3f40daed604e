"""Server keep alive (MQTT 5 §3.2.2.3.14) under `--mqtt-max-keep-alive`, as Mosquitto's
max_keepalive: longer or absent keep alives are replaced and, for v5, announced."""

from __future__ import annotations

import time

import pytest

from tests.fixtures.broker_process import start_broker
from tests.integration.mqtt.conftest import ROLES, RawClient


@pytest.fixture(scope="module")
def capped_broker(tmp_path_factory):
    proc = start_broker(
        tmp_path_factory.mktemp("ka") / "data", *ROLES, "--mqtt-max-keep-alive", "1"
    )
    yield proc
    proc.stop()


@pytest.mark.parametrize("asked", [0, 60])
def test_v5_client_is_told_the_server_keep_alive_and_held_to_it(capped_broker, asked):
    client = RawClient(capped_broker.ports["mqtt"], 5)
    try:
        ack = client.connect(f"cap-{asked}", keep_alive=asked)
        assert ack.properties.get("server_keep_alive") == 1
        start = time.monotonic()
        got = client.wait_closed(timeout=5)
        assert [p.reason_code for p in got] == [0x8D]
        assert time.monotonic() - start <= 3.0
    finally:
        client.close()


def test_keep_alive_within_the_cap_is_not_announced(capped_broker):
    client = RawClient(capped_broker.ports["mqtt"], 5)
    try:
        ack = client.connect("cap-ok", keep_alive=1)
        assert "server_keep_alive" not in ack.properties
    finally:
        client.close()


def test_v311_client_is_held_to_the_cap(capped_broker):
    client = RawClient(capped_broker.ports["mqtt"], 4)
    try:
        client.connect("cap-v4", keep_alive=600)
        start = time.monotonic()
        assert client.wait_closed(timeout=5) == []
        assert time.monotonic() - start <= 3.0
    finally:
        client.close()
