"""One conformance suite for every meta-store backend (DESIGN.md §7).

memory and sqlite always run; fdb runs when FDB_CLUSTER_FILE names a reachable cluster.  On a
real cluster every test works under its own random subspace and clears it afterwards (the
change-log test only checks relative versions, since the version key is global).
"""

from __future__ import annotations

import asyncio
import functools
import os
import random
import uuid

import pytest

from flowmq_meta import (
    MAX_KEY_BYTES,
    MAX_TRANSACTION_BYTES,
    MAX_VALUE_BYTES,
    KeyTooLarge,
    MetaError,
    MetaStore,
    TransactionTooLarge,
    ValueTooLarge,
    decode_int,
    encode_int,
    open_meta_store,
)
from flowmq_meta.changelog import changes_since, read_version, record_change
from flowmq_meta.keys import Subspace

WAIT = 5.0  # generous upper bound for a watch that must fire; it normally takes < 60 ms


@functools.cache
def fdb_skip_reason() -> str | None:
    cluster = os.environ.get("FDB_CLUSTER_FILE")
    if not cluster:
        return "FDB_CLUSTER_FILE is not set: no FoundationDB cluster to test against"
    if not os.path.isfile(cluster):
        return f"FDB_CLUSTER_FILE={cluster} does not exist"
    try:
        from flowmq_meta.fdb_backend import load_fdb

        fdb = load_fdb()
        tr = fdb.open(cluster).create_transaction()
        tr.options.set_timeout(3000)
        tr.get_read_version().wait()
    except Exception as exc:
        return f"FoundationDB cluster in FDB_CLUSTER_FILE={cluster} is not reachable: {exc}"
    return None


# fdb-fake runs the FdbMetaStore adapter over a stand-in for the bindings (see
# fake_fdb_for_meta.py); fdb is the real thing.
BACKENDS = ["memory", "sqlite", "fdb-fake", pytest.param("fdb", marks=pytest.mark.fdb)]


@pytest.fixture(params=BACKENDS)
async def store(request: pytest.FixtureRequest, tmp_path, monkeypatch) -> MetaStore:
    backend = request.param
    if backend == "memory":
        s = open_meta_store("memory://")
    elif backend == "sqlite":
        s = open_meta_store(f"sqlite:///{tmp_path}/meta.db")
    elif backend == "fdb-fake":
        import fake_fdb_for_meta

        from flowmq_meta import fdb_backend

        monkeypatch.setattr(fdb_backend, "load_fdb", lambda: fake_fdb_for_meta)
        s = open_meta_store("fdb://")
    else:
        reason = fdb_skip_reason()
        if reason:
            pytest.skip(reason)
        s = open_meta_store(f"fdb://{os.environ['FDB_CLUSTER_FILE']}")
    yield s
    if backend == "fdb":
        begin, end = SPACE_ROOT.range()
        await s.transact(lambda tr: tr.clear_range(begin, end))
    await s.close()


SPACE_ROOT = Subspace(("flowmq-test",))


@pytest.fixture
def space() -> Subspace:
    return SPACE_ROOT.subspace(uuid.uuid4().hex)


async def put(store: MetaStore, items: dict[bytes, bytes]) -> None:
    def fn(tr):
        for k, v in items.items():
            tr.set(k, v)

    await store.transact(fn)


async def dump(store: MetaStore, space: Subspace) -> list[tuple[bytes, bytes]]:
    begin, end = space.range()
    return await store.transact(lambda tr: tr.get_range(begin, end))


# -- key ordering ---------------------------------------------------------------------------

INTS = [-(2**70), -(2**64), -(2**63), -65536, -256, -255, -1, 0, 1, 255, 256, 2**32, 2**63, 2**70]
STRS = ["", "a", "a\x00", "a\x00b", "ab", "b", "z", "é", "中文", "\U0001f600"]
BYTES = [b"", b"\x00", b"\x00\x00", b"\x00\xff", b"\x01", b"a", b"\xfe", b"\xff", b"\xff\xff"]
TUPLES = [(), (-1,), (0,), (1,), (1, 2), (1, 2, 3), (1, 3), (2,), (2, -5), (10,)]
# Already in FoundationDB order; the last one shows a string sorting before a tuple.
NESTED = [((),), (("a",),), (("a", "b"),), (("b",),), ((("a",),),)]


@pytest.mark.parametrize(
    "values",
    [INTS, STRS, BYTES, TUPLES],
    ids=["ints", "strings", "bytes", "nested-tuples"],
)
async def test_tuple_keys_sort_like_tuples(store: MetaStore, space: Subspace, values) -> None:
    shuffled = list(values)
    random.Random(42).shuffle(shuffled)
    await put(store, {space.pack(v, "tail"): b"" for v in shuffled})
    keys = [k for k, _ in await dump(store, space)]
    assert keys == sorted(space.pack(v, "tail") for v in values)
    assert [space.unpack(k)[0] for k in keys] == sorted(values)


async def test_tuple_keys_order_across_types(store: MetaStore, space: Subspace) -> None:
    # FoundationDB's type order: None < bytes < str < nested tuple < int.
    values = [7, ("t",), "s", b"b", None, -7]
    await put(store, {space.pack(v): b"" for v in values})
    got = [space.unpack(k)[0] for k, _ in await dump(store, space)]
    assert got == [None, b"b", "s", ("t",), -7, 7]
    assert [k for k, _ in await dump(store, space)] == sorted(space.pack(v) for v in values)


async def test_nested_tuple_elements(store: MetaStore, space: Subspace) -> None:
    await put(store, {space.pack(*v): b"" for v in reversed(NESTED)})
    assert [space.unpack(k) for k, _ in await dump(store, space)] == NESTED


# -- basic operations -----------------------------------------------------------------------


async def test_get_set_clear(store: MetaStore, space: Subspace) -> None:
    k = space.pack("k")
    assert await store.get(k) is None
    await store.transact(lambda tr: tr.set(k, b"v1"))
    assert await store.get(k) == b"v1"
    await store.transact(lambda tr: tr.set(k, b""))
    assert await store.get(k) == b""  # empty value is a value, not absence
    await store.transact(lambda tr: tr.clear(k))
    assert await store.get(k) is None
    await store.transact(lambda tr: tr.clear(k))  # clearing a missing key is fine


async def test_transact_returns_result(store: MetaStore, space: Subspace) -> None:
    assert await store.transact(lambda tr: ("result", tr.get(space.pack("x")))) == ("result", None)


async def test_get_range_limit_and_reverse(store: MetaStore, space: Subspace) -> None:
    items = {space.pack(i): str(i).encode() for i in range(10)}
    await put(store, items)
    await put(store, {space.pack("after"): b"", SPACE_ROOT.pack("zz-outside"): b""})
    b, e = space.pack(0), space.pack(10)

    async def rng(begin: bytes, end: bytes, limit: int = 0, reverse: bool = False):
        got = await store.transact(lambda tr: tr.get_range(begin, end, limit, reverse))
        return [space.unpack(k)[0] for k, _ in got]

    assert await rng(b, e) == list(range(10))
    assert await rng(b, e, limit=3) == [0, 1, 2]
    assert await rng(b, e, reverse=True) == list(range(9, -1, -1))
    assert await rng(b, e, limit=3, reverse=True) == [9, 8, 7]
    assert await rng(b, e, limit=100, reverse=True) == list(range(9, -1, -1))
    assert await rng(space.pack(3), space.pack(6)) == [3, 4, 5]  # begin in, end out
    assert await rng(space.pack(3), space.pack(3)) == []
    assert await rng(space.pack(6), space.pack(3)) == []
    values = await store.transact(lambda tr: tr.get_range(b, e, 2))
    assert values == [(space.pack(0), b"0"), (space.pack(1), b"1")]
    # Every value is bytes, as the contract says.
    assert all(type(k) is bytes and type(v) is bytes for k, v in values)


async def test_clear_range(store: MetaStore, space: Subspace) -> None:
    await put(store, {space.pack(i): b"x" for i in range(10)})
    await store.transact(lambda tr: tr.clear_range(space.pack(3), space.pack(6)))
    assert [space.unpack(k)[0] for k, _ in await dump(store, space)] == [0, 1, 2, 6, 7, 8, 9]
    await store.transact(lambda tr: tr.clear_range(space.pack(9), space.pack(0)))  # empty: no-op
    assert len(await dump(store, space)) == 7
    begin, end = space.range()
    await store.transact(lambda tr: tr.clear_range(begin, end))
    assert await dump(store, space) == []


async def test_atomic_add(store: MetaStore, space: Subspace) -> None:
    k = space.pack("counter")
    await store.transact(lambda tr: tr.add(k, 5))  # missing key counts as 0
    assert decode_int(await store.get(k)) == 5
    await store.transact(lambda tr: tr.add(k, -12))
    assert decode_int(await store.get(k)) == -7
    assert await store.get(k) == encode_int(-7)

    def twice(tr):
        tr.add(k, 10)
        tr.add(k, 10)
        return decode_int(tr.get(k))  # read-your-writes after atomic ops

    assert await store.transact(twice) == 13
    assert decode_int(await store.get(k)) == 13


async def test_atomic_add_wraps_and_resizes_like_fdb(store: MetaStore, space: Subspace) -> None:
    big, short = space.pack("big"), space.pack("short")
    await put(store, {big: encode_int(2**63 - 1), short: b"\x01"})
    await store.transact(lambda tr: (tr.add(big, 1), tr.add(short, 1)))
    assert decode_int(await store.get(big)) == -(2**63)
    assert await store.get(short) == encode_int(2)  # zero-extended to 8 bytes


async def test_adds_mixed_with_sets_and_a_range_read(store: MetaStore, space: Subspace) -> None:
    """An add to a key not read yet, an add after a set, a set after an add, then a range
    read of them all in the same transaction (SQLite keeps adds and writes until a range
    read or the commit applies them)."""
    a, b, c = space.pack("a"), space.pack("b"), space.pack("c")
    await put(store, {a: encode_int(1), b: encode_int(2)})

    def fn(tr):
        tr.add(a, 10)
        tr.set(b, encode_int(100))
        tr.add(b, 1)
        tr.add(c, 5)
        tr.set(c, encode_int(7))
        return tr.get_range(*space.range())

    expected = [(a, encode_int(11)), (b, encode_int(101)), (c, encode_int(7))]
    assert await store.transact(fn) == expected
    assert await dump(store, space) == expected


async def test_read_your_writes(store: MetaStore, space: Subspace) -> None:
    await put(store, {space.pack(i): b"old" for i in range(5)})

    def fn(tr):
        seen = {}
        tr.set(space.pack(1), b"new")
        seen["set"] = tr.get(space.pack(1))
        tr.clear(space.pack(2))
        seen["clear"] = tr.get(space.pack(2))
        tr.set(space.pack(7), b"added")
        tr.clear_range(space.pack(3), space.pack(5))
        begin, end = space.range()
        seen["range"] = tr.get_range(begin, end)
        seen["reverse"] = tr.get_range(begin, end, limit=2, reverse=True)
        return seen

    seen = await store.transact(fn)
    assert seen["set"] == b"new"
    assert seen["clear"] is None
    assert seen["range"] == [
        (space.pack(0), b"old"),
        (space.pack(1), b"new"),
        (space.pack(7), b"added"),
    ]
    assert seen["reverse"] == [(space.pack(7), b"added"), (space.pack(1), b"new")]
    assert await dump(store, space) == seen["range"]


async def test_exception_rolls_back_everything(store: MetaStore, space: Subspace) -> None:
    before = {space.pack(i): f"v{i}".encode() for i in range(6)}
    before[space.pack("n")] = encode_int(1)
    await put(store, before)
    calls = 0

    class Boom(Exception):
        pass

    def fn(tr):
        nonlocal calls
        calls += 1
        tr.set(space.pack(0), b"changed")
        tr.set(space.pack("new"), b"x")
        tr.clear(space.pack(1))
        tr.clear_range(space.pack(3), space.pack(5))
        tr.add(space.pack("n"), 41)
        raise Boom

    with pytest.raises(Boom):
        await store.transact(fn)
    assert calls == 1  # an error from fn is not a conflict: no retry
    assert dict(await dump(store, space)) == before


async def test_async_fn_is_rejected(store: MetaStore, space: Subspace) -> None:
    async def not_a_transaction(tr):  # pragma: no cover - never awaited
        tr.set(space.pack("x"), b"x")

    with pytest.raises(TypeError, match="synchronous"):
        await store.transact(not_a_transaction)
    assert await dump(store, space) == []


async def test_transaction_unusable_after_fn(store: MetaStore, space: Subspace) -> None:
    escaped = await store.transact(lambda tr: tr)
    with pytest.raises(MetaError, match="finished"):
        escaped.set(space.pack("late"), b"x")


async def test_str_keys_are_rejected(store: MetaStore) -> None:
    with pytest.raises(TypeError, match="bytes"):
        await store.transact(lambda tr: tr.set("not-bytes", b"x"))


# -- size guard -----------------------------------------------------------------------------


async def test_value_size_limit(store: MetaStore, space: Subspace) -> None:
    k = space.pack("v")
    await store.transact(lambda tr: tr.set(k, b"x" * MAX_VALUE_BYTES))
    assert len(await store.get(k)) == MAX_VALUE_BYTES
    calls = 0

    def too_big(tr):
        nonlocal calls
        calls += 1
        tr.set(space.pack("other"), b"y")
        tr.set(k, b"x" * (MAX_VALUE_BYTES + 1))

    with pytest.raises(ValueTooLarge) as info:
        await store.transact(too_big)
    assert "100001" in str(info.value) and "100000" in str(info.value)
    assert calls == 1
    assert await store.get(space.pack("other")) is None


async def test_key_size_limit(store: MetaStore, space: Subspace) -> None:
    fits = space.pack("k") + b"x" * (MAX_KEY_BYTES - len(space.pack("k")))
    assert len(fits) == MAX_KEY_BYTES
    await store.transact(lambda tr: tr.set(fits, b"ok"))
    assert await store.get(fits) == b"ok"
    for op in (
        lambda tr: tr.set(fits + b"x", b"v"),
        lambda tr: tr.add(fits + b"x", 1),
        lambda tr: tr.clear(fits + b"x"),
    ):
        with pytest.raises(KeyTooLarge, match=f"{MAX_KEY_BYTES + 1} bytes.*{MAX_KEY_BYTES}"):
            await store.transact(op)


async def test_transaction_size_limit(store: MetaStore, space: Subspace) -> None:
    calls = 0
    chunk = b"x" * MAX_VALUE_BYTES

    def huge(tr):
        nonlocal calls
        calls += 1
        for i in range(MAX_TRANSACTION_BYTES // MAX_VALUE_BYTES + 1):
            tr.set(space.pack(i), chunk)

    with pytest.raises(TransactionTooLarge) as info:
        await store.transact(huge)
    assert str(MAX_TRANSACTION_BYTES) in str(info.value)
    assert calls == 1
    assert await dump(store, space) == []


# -- read-only transactions ----------------------------------------------------------------


def change_of(k: bytes, space: Subspace, how: str):
    """A transaction function changing ``k`` by ``how``: set, clear, add or clear_range."""
    begin, end = space.range()
    return {
        "set": lambda tr: tr.set(k, b"changed"),
        "clear": lambda tr: tr.clear(k),
        "add": lambda tr: tr.add(k, 1),
        "clear_range": lambda tr: tr.clear_range(begin, end),
    }[how]


async def test_read_sees_what_was_committed(store: MetaStore, space: Subspace) -> None:
    await put(store, {space.pack("a"): b"1", space.pack("b"): b"2"})
    begin, end = space.range()
    got = await store.read(lambda tr: (tr.get(space.pack("a")), tr.get_range(begin, end)))
    assert got == (b"1", [(space.pack("a"), b"1"), (space.pack("b"), b"2")])
    await put(store, {space.pack("a"): b"3"})
    assert await store.read(lambda tr: tr.get(space.pack("a"))) == b"3"


@pytest.mark.parametrize("write", ["set", "clear", "add", "clear_range"])
async def test_a_write_in_a_read_is_refused(store: MetaStore, space: Subspace, write: str) -> None:
    k = space.pack("k")
    await put(store, {k: encode_int(1)})
    with pytest.raises(MetaError, match="may not write"):
        await store.read(change_of(k, space, write))
    assert await store.get(k) == encode_int(1)


async def test_a_watch_set_in_a_read_fires_on_change(store: MetaStore, space: Subspace) -> None:
    k = space.pack("watched")
    await put(store, {k: b"1"})
    watch = await store.read(lambda tr: tr.watch(k))
    waiting = await assert_pending(watch)
    await put(store, {k: b"2"})
    await asyncio.wait_for(waiting, WAIT)


# -- watches --------------------------------------------------------------------------------


async def assert_pending(awaitable) -> asyncio.Future:
    """Start awaiting a watch and check it has not fired; returns the waiting future."""
    fut = asyncio.ensure_future(awaitable)
    done, _ = await asyncio.wait({fut}, timeout=0.05)
    assert not done, "watch fired although nothing changed"
    return fut


@pytest.mark.parametrize("change", ["set", "clear", "add", "clear_range"])
async def test_watch_fires_on_change(store: MetaStore, space: Subspace, change: str) -> None:
    k = space.pack("watched")
    await store.transact(lambda tr: tr.set(k, encode_int(1)))
    watch = await store.watch(k)
    waiting = await assert_pending(watch)
    await store.transact(change_of(k, space, change))
    await asyncio.wait_for(waiting, WAIT)


async def test_watch_on_missing_key_fires_when_created(store: MetaStore, space: Subspace) -> None:
    k = space.pack("later")
    watch = await store.watch(k)
    waiting = await assert_pending(watch)
    await store.transact(lambda tr: tr.set(k, b"now"))
    await asyncio.wait_for(waiting, WAIT)


async def test_unrelated_write_does_not_fire_watch(store: MetaStore, space: Subspace) -> None:
    k = space.pack("a")
    await store.transact(lambda tr: tr.set(k, b"1"))
    watch = await store.watch(k)
    await store.transact(lambda tr: tr.set(space.pack("b"), b"2"))
    waiting = await assert_pending(watch)
    await store.transact(lambda tr: tr.set(k, b"3"))
    await asyncio.wait_for(waiting, WAIT)


async def test_watch_created_then_key_written_in_same_transaction(
    store: MetaStore, space: Subspace
) -> None:
    k = space.pack("k")

    def fn(tr):
        w = tr.watch(k)
        tr.set(k, b"written after the watch")
        return w

    watch = await store.transact(fn)
    await asyncio.wait_for(watch, WAIT)


async def test_several_watches_on_one_key(store: MetaStore, space: Subspace) -> None:
    k = space.pack("k")
    first, second = await store.watch(k), await store.watch(k)
    await store.transact(lambda tr: tr.set(k, b"x"))
    await asyncio.wait_for(asyncio.gather(first, second), WAIT)


async def test_cancelled_watch(store: MetaStore, space: Subspace) -> None:
    k = space.pack("k")
    watch = await store.watch(k)
    watch.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(watch, WAIT)
    # A watch given up by wait_for's timeout does not disturb later watches on the key.
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(await store.watch(k), 0.01)
    again = await store.watch(k)
    await store.transact(lambda tr: tr.set(k, b"x"))
    await asyncio.wait_for(again, WAIT)


# -- change log -----------------------------------------------------------------------------


async def test_changelog(store: MetaStore) -> None:
    start = await store.transact(read_version)
    v1 = await store.transact(lambda tr: record_change(tr, "ns.create", {"ns": "a"}))
    assert v1 == start + 1

    def two(tr):
        return record_change(tr, "dest.create", {"ns": "a", "name": "s"}), record_change(
            tr, "route.add", {"filter": "x/#"}
        )

    assert await store.transact(two) == (start + 2, start + 3)
    assert await store.transact(read_version) == start + 3

    class Boom(Exception):
        pass

    def failed(tr):
        record_change(tr, "lost", {})
        raise Boom

    with pytest.raises(Boom):
        await store.transact(failed)
    assert await store.transact(read_version) == start + 3

    entries = await store.transact(lambda tr: changes_since(tr, start, 100))
    assert entries == [
        {"kind": "ns.create", "payload": {"ns": "a"}, "version": start + 1},
        {"kind": "dest.create", "payload": {"ns": "a", "name": "s"}, "version": start + 2},
        {"kind": "route.add", "payload": {"filter": "x/#"}, "version": start + 3},
    ]
    assert [e["version"] for e in await store.transact(lambda tr: changes_since(tr, start, 2))] == [
        start + 1,
        start + 2,
    ]
    assert await store.transact(lambda tr: changes_since(tr, start + 3, 100)) == []
