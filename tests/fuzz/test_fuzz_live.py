"""A short live fuzz of each listener (``benchmarks/fuzz.py`` runs the long one): a few
thousand frames — valid handshakes, valid and mutated frames, junk, wrong lengths — in two
batches; after each the broker must be alive and serve paho-mqtt, kafka-python and pika
round trips, and its log must hold no traceback (a refused client gets one info line)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fixtures.broker_process import BrokerProcess, start_broker
from tests.fixtures.cli import flowmq_user
from tests.fixtures.fuzz.kafka import FUZZ_USER
from tests.fixtures.fuzz.run import fuzz

FRAMES = 3000


@pytest.fixture(scope="module")
def fuzz_target(tmp_path_factory) -> Iterator[BrokerProcess]:
    """One broker, every listener on.  Not named ``..._broker``: the fuzz run reads the log
    for tracebacks per protocol itself (``Report.log``)."""
    data = tmp_path_factory.mktemp("fuzz") / "data"
    user, password = FUZZ_USER
    added = flowmq_user(data, "add", user, "--password", password)
    assert added.returncode == 0, added.stderr
    broker = start_broker(data)
    yield broker
    broker.stop()


@pytest.mark.parametrize("protocol", ["mqtt", "kafka", "amqp"])
async def test_listener_survives_fuzzing(fuzz_target: BrokerProcess, protocol: str) -> None:
    report = await fuzz(fuzz_target, protocol, FRAMES, seed=11, batches=2)
    summary = "\n".join(report.lines())
    assert report.frames >= FRAMES, summary
    assert not report.crashed, summary + "\n" + "".join(fuzz_target.output[-40:])
    assert not report.log.tracebacks, summary
    assert not report.roundtrip_failures, summary
    assert report.roundtrips_ok == 3 * 3, summary  # warm-up and two batches, three protocols
