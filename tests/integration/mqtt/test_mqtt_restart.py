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


def test_messages_acknowledged_for_an_offline_session_survive_a_crash(tmp_path, uid):
    """An offline persistent session's messages are in its durable queue once PUBACKed:
    SIGKILL loses none of them (DESIGN.md §5)."""
    data = tmp_path / "data"
    persist = {"SessionExpiryInterval": 600}
    proc = start_broker(data, *ROLES)
    try:
        port = proc.ports["mqtt"]
        sub = Paho(port, f"away-{uid}", v5=True)
        sub.connect(clean_start=False, properties=persist)
        sub.subscribe("crash/#", 2)
        sub.close()
        pub = Paho(port, f"pub-{uid}", v5=True)
        pub.connect()
        for i in range(30):
            pub.publish(f"crash/{i % 3}", f"m{i}".encode(), 1 + i % 2)  # QoS 1 and 2
        pub.close()
    finally:
        proc.proc.kill()  # no clean shutdown: only what is durable survives
        proc.proc.wait(10)

    proc = start_broker(data, *ROLES)
    try:
        sub = Paho(proc.ports["mqtt"], f"away-{uid}", v5=True)
        assert sub.connect(clean_start=False, properties=persist)[0] is True
        got = [sub.get() for _ in range(30)]
        for qos in (1, 2):  # in order per QoS (paho hands QoS 2 over at PUBREL)
            sent = [f"m{i}".encode() for i in range(30) if 1 + i % 2 == qos]
            assert [m.payload for m in got if m.qos == qos] == sent
        sub.close()
        # Taken from the store at the reconnect and acknowledged by the client: a second
        # reconnect gets nothing again.
        again = Paho(proc.ports["mqtt"], f"away-{uid}", v5=True)
        assert again.connect(clean_start=False, properties=persist)[0] is True
        again.publish("crash/done", b"last", 1)  # self-delivered: nothing came before it
        assert again.get().payload == b"last"
        again.close()
        assert "Traceback" not in "".join(proc.output)
    finally:
        proc.stop()
