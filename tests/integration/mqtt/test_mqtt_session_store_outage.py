"""A persistent session whose record cannot be stored is not kept as persistent: the meta
store is made to fail for real (another connection holds the SQLite write lock, and the broker
gives up after a short busy and retry timeout), and the client is disconnected (v5 DISCONNECT
0x80, 3.1.1 a closed connection) instead of believing its session would outlive it.  A new
session is dropped (a reconnect gets session present 0); a resumed one stays as it was
stored."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterator

import pytest

from flowmq_meta import keys
from flowmq_meta.catalog import DEFAULT_NAMESPACE
from flowmq_wire.mqtt import reason_codes as rc
from flowmq_wire.mqtt.packets import Disconnect, Publish, SubscriptionOptions
from tests.fixtures.broker_process import BrokerProcess

from .conftest import RawClient, broker_with, wait_until

PERSIST_V5 = {"session_expiry_interval": 300}


@pytest.fixture
def outage_broker(tmp_path) -> Iterator[BrokerProcess]:
    db = tmp_path / "data" / "meta.db"
    url = f"sqlite:///{db}?busy_timeout=0.1&retry_timeout=0.3"
    yield from broker_with(tmp_path / "data", "--meta", url)


@contextlib.contextmanager
def meta_store_locked(broker: BrokerProcess) -> Iterator[None]:
    """Another connection holds the meta store's write lock: the broker's writes fail."""
    holder = sqlite3.connect(broker.data_dir / "meta.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        yield
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def stored_session(broker: BrokerProcess, client_id: str) -> dict | None:
    """The session record the meta store holds for ``client_id``, read from the file."""
    with contextlib.closing(sqlite3.connect(broker.data_dir / "meta.db")) as db:
        key = keys.SESSIONS.pack(DEFAULT_NAMESPACE, client_id)
        row = db.execute("SELECT value FROM kv WHERE key = ?", (key,)).fetchone()
    return json.loads(row[0]) if row else None


def test_a_new_session_that_cannot_be_stored_is_not_kept(outage_broker, uid):
    port = outage_broker.ports["mqtt"]
    with meta_store_locked(outage_broker):
        c = RawClient(port, 5)
        c.connect(f"new-{uid}", clean_start=False, properties=PERSIST_V5)
        got = c.wait_closed()
        assert [type(p) for p in got] == [Disconnect], got
        assert got[0].reason_code == rc.UNSPECIFIED_ERROR
        legacy = RawClient(port, 4)
        legacy.connect(f"legacy-{uid}", clean_start=False)
        assert legacy.wait_closed() == []  # 3.1.1 has no DISCONNECT from the server
    # The store is back: nothing of either session was kept, and a new one is stored.
    c = RawClient(port, 5)
    assert not c.connect(f"new-{uid}", clean_start=False, properties=PERSIST_V5).session_present
    legacy = RawClient(port, 4)
    assert not legacy.connect(f"legacy-{uid}", clean_start=False).session_present
    c.expect_nothing()
    legacy.expect_nothing()
    assert stored_session(outage_broker, f"new-{uid}") is not None


def test_a_resumed_session_stays_as_it_was_stored(outage_broker, uid):
    port = outage_broker.ports["mqtt"]
    first = RawClient(port, 5)
    first.connect(f"resumed-{uid}", clean_start=False, properties=PERSIST_V5)
    first.subscribe((f"t/{uid}", SubscriptionOptions(qos=1)))
    first.disconnect()
    # SUBACK does not wait for the record: wait for it before the store fails.
    wait_until(lambda: (stored_session(outage_broker, f"resumed-{uid}") or {}).get("subscriptions"))
    with meta_store_locked(outage_broker):
        again = RawClient(port, 5)
        ack = again.connect(f"resumed-{uid}", clean_start=False, properties=PERSIST_V5)
        assert ack.session_present
        got = again.wait_closed()
        assert [type(p) for p in got] == [Disconnect], got
        assert got[0].reason_code == rc.UNSPECIFIED_ERROR
    # The session is still here, subscription and all.
    last = RawClient(port, 5)
    assert last.connect(f"resumed-{uid}", clean_start=False, properties=PERSIST_V5).session_present
    publisher = RawClient(port, 5)
    publisher.connect(f"pub-{uid}")
    publisher.publish(f"t/{uid}", b"still subscribed", 1)
    assert last.expect(Publish).payload == b"still subscribed"
