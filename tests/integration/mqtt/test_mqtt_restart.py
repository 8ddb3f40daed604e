"""Persistent sessions outlive the broker process: their subscriptions are in the meta store
(DESIGN.md §5), so a client reconnecting after a restart finds its session."""

from __future__ import annotations

from tests.fixtures.broker_process import start_broker

from .conftest import ROLES, Paho


def test_persistent_sessions_survive_a_broker_restart(tmp_path, uid):
    data = tmp_path / "data"
    persist = {"SessionExpiryInterval": 600}
    proc = start_broker(data, *ROLES)
    try:
        port = proc.ports["mqtt"]
        v5 = Paho(port, f"v5-{uid}", v5=True)
        v5.connect(clean_start=False, properties=persist)
        v5.subscribe("restart/v5/#", 1, sub_id=12)
        v5.subscribe("$share/grp/restart/shared", 1)
        v5.close()
        v311 = Paho(port, f"v311-{uid}", v5=False, clean=False)
        v311.connect()
        v311.subscribe("restart/v311", 2)
        v311.close()
        clean = Paho(port, f"clean-{uid}", v5=True)
        clean.connect()
        clean.subscribe("restart/clean", 1)
        clean.close()
    finally:
        proc.stop()

    proc = start_broker(data, *ROLES)
    try:
        port = proc.ports["mqtt"]
        # Published while the clients are away, after the restart: queued for them.
        pub = Paho(port, f"pub-{uid}", v5=True)
        pub.connect()
        pub.publish("restart/v5/a", b"for v5", 1)
        pub.publish("restart/shared", b"for the group", 1)
        pub.publish("restart/v311", b"for v311", 2)

        v5 = Paho(port, f"v5-{uid}", v5=True)
        assert v5.connect(clean_start=False, properties=persist)[0] is True
        got = {m.payload: m for m in v5.expect(2)}
        assert set(got) == {b"for v5", b"for the group"}
        assert got[b"for v5"].properties.SubscriptionIdentifier == [12]

        v311 = Paho(port, f"v311-{uid}", v5=False, clean=False)
        assert v311.connect()[0] is True
        m = v311.get()
        assert (m.payload, m.qos) == (b"for v311", 2)

        clean = Paho(port, f"clean-{uid}", v5=True)
        assert clean.connect(clean_start=False)[0] is False  # expiry 0: not kept
        for c in (pub, v5, v311, clean):
            c.close()
        assert "Traceback" not in "".join(proc.output)
    finally:
        proc.stop()
