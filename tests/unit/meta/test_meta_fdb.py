"""FoundationDB backend pieces that need no cluster: loading the native client and error
translation (the adapter itself runs the conformance suite as fdb-fake)."""

from __future__ import annotations

import fake_fdb_for_meta as fake
import pytest

from flowmq_meta import (
    KeyTooLarge,
    MetaError,
    RetryLimitExceeded,
    TransactionTooLarge,
    fdb_backend,
    open_meta_store,
)


def native_client_present() -> bool:
    try:
        fdb_backend.load_fdb()
    except MetaError:
        return False
    return True


@pytest.mark.skipif(native_client_present(), reason="libfdb_c is installed here")
def test_missing_native_client_is_a_clear_meta_error() -> None:
    for _ in range(2):  # a failed load leaves nothing half-initialised
        with pytest.raises(MetaError, match="libfdb_c"):
            open_meta_store("fdb://")


@pytest.fixture
def store(monkeypatch):
    monkeypatch.setattr(fdb_backend, "load_fdb", lambda: fake)
    return fdb_backend.FdbMetaStore(None, timeout=7)


@pytest.mark.parametrize(
    ("code", "error"),
    [(2101, TransactionTooLarge), (2102, KeyTooLarge), (1031, RetryLimitExceeded), (1, MetaError)],
)
async def test_non_retryable_errors_are_translated(store, monkeypatch, code, error) -> None:
    calls = 0

    def failing_commit(self):
        return fake.Future(code, ready=True)

    monkeypatch.setattr(fake.Transaction, "commit", failing_commit)

    def fn(tr):
        nonlocal calls
        calls += 1
        tr.set(b"k", b"v")

    with pytest.raises(error, match=str(code)):
        await store.transact(fn)
    assert calls == 1


async def test_retryable_errors_rerun_fn(store) -> None:
    calls = 0

    def fn(tr):
        nonlocal calls
        calls += 1
        tr.add(b"n", 1)

    await store.transact(fn)
    assert calls == 2  # the fake's first commit always fails with not_committed
    assert store._db.data[b"n"] == (1).to_bytes(8, "little")
    assert store._db.options.timeout_ms == 7000
    await store.close()


def test_url_forms(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(fdb_backend, "load_fdb", lambda: fake)
    cluster = tmp_path / "fdb.cluster"
    cluster.write_text("test:test@127.0.0.1:4500\n")
    assert open_meta_store(f"fdb://{cluster}").url == f"fdb://{cluster}"
    assert open_meta_store("fdb://").url == "fdb://"
