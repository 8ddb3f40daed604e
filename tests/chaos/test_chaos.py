"""The chaos harness's short schedule (benchmarks/chaos.py; long runs: ``--faults 50
--seconds 600``): a 3-node cluster of ``flowmq serve`` processes under Kafka, MQTT and AMQP
load through SIGKILLs and restarts and an object-store outage; nothing acknowledged may be
missing (Kafka, AMQP, MQTT into a Stream and into persistent sessions on other nodes), no
record an idempotent producer sent once may be in the log twice, no committed offset may go
backwards, and no consumer may be stuck.

Pauses (SIGSTOP past the failure detector, then SIGCONT) are in the long runs
(``chaos.py --kinds pause --seed 3``, benchmarks/README.md "Chaos") and in the focused
``test_mqtt_forward_durability.py``; this schedule stays short. Nor is the meta store locked
(``--kinds meta``): nothing is lost through it, but it stretches this schedule from about 50 s
to 130 s."""

from __future__ import annotations

import json

import pytest

from benchmarks import chaos

pytestmark = pytest.mark.timeout(240)


def test_nothing_acknowledged_is_lost_through_kills_and_a_store_outage(tmp_path) -> None:
    report = chaos.run(
        faults=3, seconds=24, objects="file", seed=11, workdir=tmp_path,
        kinds=("kill", "objects"),
    )  # fmt: skip
    summary = chaos.summary(report)
    assert [fault["kind"] for fault in report["faults"]] == ["kill", "objects", "kill"]
    # The load ran: every protocol had messages acknowledged around the faults.
    assert report["kafka"]["acknowledged"] > 100, summary
    assert all(s["acknowledged"] > 20 for s in report["mqtt"]["subscribers"].values()), summary
    assert report["amqp"]["acknowledged"] > 20, summary
    details = summary + "\n" + json.dumps(report, indent=1)[:6000]
    assert report["kafka"]["lost"] == 0, details
    assert report["amqp"]["lost"] == 0, details
    assert report["mqtt"]["stream"]["lost"] == 0, details
    # MQTT QoS 1 into persistent sessions on another node (tests/chaos/
    # test_mqtt_forward_durability.py is the focused version).
    missing = {
        pair: sub["missing"] for pair, sub in report["mqtt"]["subscribers"].items() if sub["lost"]
    }
    assert not missing, f"MQTT persistent sessions: acknowledged, missing {missing}\n{details}"
    assert report["kafka"]["lost_from_log"] == 0, details
    assert not report["kafka"]["offsets_backwards"], details
    assert not report["stuck_consumers"], details
    # Records an idempotent producer sent once are in the log once, whichever broker its
    # retries reached (the flush transaction checks the stored sequence state).
    assert report["kafka"]["log_duplicates_not_resent"] == 0, details
