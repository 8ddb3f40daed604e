import pytest

from flowmq_core.errors import InvalidFilter
from flowmq_core.trie import RouteTrie


def make(*bindings, **kw):
    t = RouteTrie(**kw)
    for f, d in bindings:
        assert t.add(f, d) is True
    return t


def test_empty_trie():
    t = RouteTrie()
    assert t.match("a") == frozenset()
    assert len(t) == 0
    assert list(t.filters()) == []


def test_exact_and_wildcards():
    t = make(("a/b", 1), ("a/+", 2), ("a/#", 3), ("#", 4), ("+/b", 5), ("a/b/c", 6))
    assert t.match("a/b") == {1, 2, 3, 4, 5}
    assert t.match("a/c") == {2, 3, 4}
    assert t.match("a/b/c") == {3, 4, 6}
    assert t.match("b") == {4}
    assert isinstance(t.match("a/b"), frozenset)


def test_dollar_topics_skip_leading_wildcards():
    t = make(("#", "all"), ("+/x", "plus"), ("+", "one"), ("$SYS/#", "sys"), ("$SYS/x", "exact"))
    assert t.match("$SYS/x") == {"sys", "exact"}
    assert t.match("$SYS") == {"sys"}
    assert t.match("a/x") == {"all", "plus"}
    assert t.match("$") == frozenset()


def test_dollar_only_matters_in_first_level():
    t = make(("a/+", 1), ("a/#", 2))
    assert t.match("a/$x") == {1, 2}


def test_hash_matches_parent_level():
    t = make(("a/#", 1), ("a/b/#", 2))
    assert t.match("a") == {1}
    assert t.match("a/b") == {1, 2}
    assert t.match("a/b/c/d") == {1, 2}
    assert t.match("ab") == frozenset()


def test_plus_matches_empty_level():
    t = make(("+", 1), ("a/+", 2), ("+/+", 3), ("a/+/c", 4))
    assert t.match("") == {1}
    assert t.match("a/") == {2, 3}
    assert t.match("/") == {3}
    assert t.match("a//c") == {4}
    assert t.match("a") == {1}


def test_empty_levels_are_literal():
    t = make(("/", 1), ("a//b", 2), ("/#", 3))
    assert t.match("/") == {1, 3}
    assert t.match("a//b") == {2}
    assert t.match("a/b") == frozenset()
    assert t.match("") == {3}  # "/#" matches parent level "" (the topic "" is not publishable)


def test_add_is_idempotent_and_len_counts_bindings():
    t = RouteTrie()
    assert t.add("a/+", 1) is True
    assert t.add("a/+", 1) is False
    assert t.add("a/+", 2) is True
    assert t.add("x", 1) is True
    assert t.add("x", 1) is False
    assert len(t) == 3
    assert sorted(t.filters()) == [("a/+", 1), ("a/+", 2), ("x", 1)]


def test_filters_round_trip():
    bindings = {
        ("#", "h"),
        ("+", "p"),
        ("/", "s"),
        ("/#", "sh"),
        ("a//+", "x"),
        ("a/+/#", "y"),
        ("a", "z"),
        ("$SYS/+", "w"),
    }
    t = make(*bindings)
    assert set(t.filters()) == bindings
    assert len(t) == len(bindings)


def test_remove():
    t = make(("a/+", 1), ("a/+", 2), ("a/b", 3))
    assert t.remove("a/+", 1) is True
    assert t.remove("a/+", 1) is False
    assert t.remove("a/b", 9) is False
    assert t.remove("nope/#", 1) is False
    assert t.remove("a/+/c", 2) is False
    assert t.match("a/b") == {2, 3}
    assert len(t) == 2
    assert t.remove("a/b", 3) is True
    assert t.match("a/b") == {2}


def _node_count(t):
    n, stack = 0, [t._root]
    while stack:
        node = stack.pop()
        n += 1
        if node.plus is not None:
            stack.append(node.plus)
        stack.extend((node.children or {}).values())
    return n


def test_remove_cleans_up_nodes():
    t = RouteTrie()
    filters = ["a/b/c/+", "a/b/#", "a/+/c", "+/+/+", "#", "x/y", "a//#"]
    for f in filters:
        t.add(f, "d")
    t.add("a/b/c/d", "e")  # exact: not in the trie nodes
    assert _node_count(t) > 1
    for f in filters:
        assert t.remove(f, "d")
    assert t.remove("a/b/c/d", "e")
    assert _node_count(t) == 1
    assert t._root.is_empty()
    assert t._exact == {}
    assert len(t) == 0
    assert list(t.filters()) == []


def test_remove_keeps_shared_prefixes():
    t = make(("a/b/+", 1), ("a/b/+/d", 2))
    t.remove("a/b/+/d", 2)
    assert t.match("a/b/c") == {1}
    t.add("a/b/+/d", 2)
    t.remove("a/b/+", 1)
    assert t.match("a/b/c/d") == {2}
    assert t.match("a/b/c") == frozenset()


def test_generation_bumps_only_on_change():
    t = RouteTrie()
    g = t.generation
    t.add("a/+", 1)
    assert t.generation == g + 1
    t.add("a/+", 1)
    assert t.generation == g + 1
    t.add("a/b", 1)
    assert t.generation == g + 2
    t.remove("a/c", 1)
    assert t.generation == g + 2
    t.remove("a/b", 1)
    t.remove("a/+", 1)
    assert t.generation == g + 4


@pytest.mark.parametrize("f", ["a/+", "a/#", "#", "+/b", "a/b"])
def test_cached_result_changes_after_add_and_remove(f):
    t = make(("a/b", "base"))
    assert t.match("a/b") == {"base"}  # now cached
    assert "a/b" in t._cache
    t.add(f, "new")
    assert t.match("a/b") == {"base", "new"}
    t.remove(f, "new")
    assert t.match("a/b") == {"base"}


def test_exact_change_keeps_unrelated_cache_entries():
    t = make(("x/+", 1))
    t.match("x/a")
    t.match("x/b")
    t.add("x/a", 2)
    assert "x/b" in t._cache and "x/a" not in t._cache
    assert t.match("x/a") == {1, 2}
    t.add("y/+", 3)  # wildcard change: everything goes
    assert t._cache == {}


def test_cache_is_bounded_and_can_be_disabled():
    t = make(("#", 1), cache_size=3)
    for i in range(10):
        assert t.match(f"t/{i}") == {1}
        assert len(t._cache) <= 3
    off = make(("#", 1), cache_size=0)
    assert off.match("a") == {1}
    assert off._cache == {}


def test_cached_no_match_result():
    t = RouteTrie()
    assert t.match("a") == frozenset()
    t.add("a", 1)
    assert t.match("a") == {1}


def test_arbitrary_hashable_destinations():
    class Dest:
        pass

    d1, d2 = Dest(), Dest()
    t = make(("a/#", d1), ("a/#", ("node", 7)), ("a/b", d2), ("a/b", frozenset({1})))
    assert t.match("a/b") == {d1, d2, ("node", 7), frozenset({1})}


def test_same_destination_via_several_filters_is_delivered_once():
    t = make(("a/+", "d"), ("a/#", "d"), ("a/b", "d"))
    assert t.match("a/b") == {"d"}
    t.remove("a/+", "d")
    assert t.match("a/b") == {"d"}


@pytest.mark.parametrize("bad", ["", "a/#/b", "a+", "x\x00"])
def test_add_remove_validate_filters(bad):
    t = RouteTrie()
    with pytest.raises(InvalidFilter):
        t.add(bad, 1)
    with pytest.raises(InvalidFilter):
        t.remove(bad, 1)
    assert len(t) == 0 and t.generation == 0


def test_unhashable_destination_leaves_no_trace():
    t = RouteTrie()
    with pytest.raises(TypeError):
        t.add("a/b/+", [1])
    with pytest.raises(TypeError):
        t.add("a/b", {1})
    assert t._root.is_empty() and t._exact == {} and len(t) == 0 and t.generation == 0


def test_shared_filters_are_rejected():
    t = RouteTrie()
    with pytest.raises(InvalidFilter, match="unwrapped"):
        t.add("$share/g/a/#", 1)


def test_repr():
    assert "2 bindings" in repr(make(("a", 1), ("b/#", 1)))
