"""The key schema: tuple packing orders like Python tuples, subspaces are disjoint."""

from __future__ import annotations

import fdb.tuple
import pytest
from hypothesis import given
from hypothesis import strategies as st

from flowmq_meta import keys
from flowmq_meta.keys import Subspace

# Strings without surrogates (not encodable as UTF-8, so not valid tuple elements).
texts = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=8)
ints = st.integers(min_value=-(2**80), max_value=2**80)
elements = st.one_of(
    st.tuples(ints), st.tuples(texts), st.tuples(st.binary(max_size=8)), st.tuples(ints, texts)
)


@given(st.lists(st.tuples(ints, texts, st.binary(max_size=6)), min_size=2, max_size=20))
def test_packed_order_is_tuple_order(items: list[tuple[int, str, bytes]]) -> None:
    space = keys.STREAM_INDEX
    assert sorted(items) == [space.unpack(k) for k in sorted(space.pack(*t) for t in items)]


@given(st.lists(elements, min_size=2, max_size=20))
def test_nested_tuples_order_like_tuples(items: list[tuple]) -> None:
    # One element type per list keeps Python's comparison defined.
    kinds = {tuple(type(x) for x in t) for t in items}
    if len(kinds) > 1:
        items = [t for t in items if tuple(type(x) for x in t) == next(iter(kinds))]
    space = keys.ACLS
    packed = sorted(space.pack(t) for t in items)
    assert [space.unpack(k)[0] for k in packed] == sorted(items)


def test_subspace_pack_unpack_range() -> None:
    space = keys.QUEUE_READY
    key = space.pack("ns", "q", 3, 17)
    assert key == fdb.tuple.pack(("q_ready", "ns", "q", 3, 17))
    assert space.unpack(key) == ("ns", "q", 3, 17)
    begin, end = space.range("ns", "q")
    assert begin < key < end
    assert not begin <= space.pack("ns", "q2", 0, 0) < end  # a longer name is not a child
    assert not begin <= space.pack("ns", "q") < end  # the prefix key itself is excluded
    with pytest.raises(ValueError, match="not in subspace"):
        space.unpack(keys.QUEUE_DEAD.pack("ns", "q", 1))


def test_nested_subspace() -> None:
    stream = keys.STREAM_INDEX.subspace("ns", "orders")
    key = stream.pack(2, 1000)
    assert key == keys.STREAM_INDEX.pack("ns", "orders", 2, 1000)
    assert stream.unpack(key) == (2, 1000)
    assert keys.STREAM_INDEX.contains(key) and stream.contains(key)


def test_subspaces_are_disjoint() -> None:
    subspaces = list(keys.ALL_SUBSPACES.values())
    raws = [s.raw for s in subspaces] + [keys.META_VERSION]
    assert len(set(raws)) == len(raws)
    for a in raws:
        for b in raws:
            assert a == b or not b.startswith(a), (a, b)
    for name in (
        "CHANGELOG",
        "NAMESPACES",
        "DESTINATIONS",
        "ROUTES",
        "STREAM_INDEX",
        "STREAM_HWM",
        "GROUP_OFFSETS",
        "QUEUE_READY",
        "QUEUE_INFLIGHT",
        "QUEUE_DEAD",
        "RETAINED",
        "SESSIONS",
        "USERS",
        "ACLS",
        "OBJECT_REFS",
        "OBJECTS_TO_DELETE",
        "NODES",
        "SETTINGS",
    ):
        assert isinstance(getattr(keys, name), Subspace)


def test_negative_offsets_sort_first() -> None:
    hwm = keys.STREAM_HWM
    assert hwm.pack("ns", "s", -1) < hwm.pack("ns", "s", 0) < hwm.pack("ns", "s", 1)
