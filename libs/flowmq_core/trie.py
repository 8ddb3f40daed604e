"""The routing engine's index: filter → destinations, matched per published topic (DESIGN §4).

Layout, chosen for the match hot path:

* Filters without wildcards never enter the trie; they live in one dict keyed by the whole
  topic, so an exact subscription costs one hash lookup and does not widen the trie walk.
* Trie nodes keep literal children in a dict, the ``+`` child in its own slot, and the
  destinations of ``<node>/#`` directly on the node (``#`` is always a leaf), so the walk never
  looks up "+" or "#" by string.
* Each destination set keeps a lazily built frozenset snapshot. A topic matched by one binding
  site (the common case) returns that shared snapshot: no allocation per match, and the memo
  holds no per-topic objects for the garbage collector to traverse.
* ``match`` walks iteratively with a frontier list and memoises results per topic. The memo is
  cleared whenever a wildcard binding changes; an exact binding only evicts its own topic.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from typing import Generic, TypeVar

from flowmq_core.errors import InvalidFilter
from flowmq_core.topics import SHARE_PREFIX, is_wildcard, validate_filter

D = TypeVar("D", bound=Hashable)

DEFAULT_CACHE_SIZE = 100_000
_EMPTY: frozenset = frozenset()


class _Dests:
    """The destinations bound at one site; never kept once empty."""

    __slots__ = ("members", "frozen")

    def __init__(self) -> None:
        self.members: set = set()
        self.frozen: frozenset | None = None  # snapshot of members, None when stale

    def snapshot(self) -> frozenset:
        frozen = self.frozen
        if frozen is None:
            frozen = self.frozen = frozenset(self.members)
        return frozen


class _Node:
    __slots__ = ("children", "plus", "dests", "hdests")

    def __init__(self) -> None:
        self.children: dict[str, _Node] | None = None
        self.plus: _Node | None = None
        self.dests: _Dests | None = None  # bound to the filter ending at this node
        self.hdests: _Dests | None = None  # bound to "<this node>/#"

    def child_or_new(self, level: str) -> _Node:
        """The child for ``level`` (``+``: the wildcard slot), created if missing."""
        if level == "+":
            if self.plus is None:
                self.plus = _Node()
            return self.plus
        if self.children is None:
            self.children = {}
        child = self.children.get(level)
        if child is None:
            child = self.children[level] = _Node()
        return child

    def site_or_new(self, hash_tail: bool) -> _Dests:
        """The destinations of the filter ending here (with ``/#`` if ``hash_tail``), created
        if missing."""
        if hash_tail:
            if self.hdests is None:
                self.hdests = _Dests()
            return self.hdests
        if self.dests is None:
            self.dests = _Dests()
        return self.dests

    def is_empty(self) -> bool:
        return (
            not self.children and self.plus is None and self.dests is None and self.hdests is None
        )


def _split(filter: str) -> tuple[list[str], bool]:
    """Levels of a wildcard filter without a trailing '#', and whether it had one."""
    levels = filter.split("/")
    if levels[-1] == "#":
        levels.pop()
        return levels, True
    return levels, False


class RouteTrie(Generic[D]):
    """Filter → destination bindings; ``match(topic)`` gives every destination to deliver to.

    Destinations are opaque hashables (a Subscription, a Stream, a remote node id, a shared
    group...). Shared subscriptions are the caller's business: bind the inner filter to a
    destination that stands for the group. Not thread-safe; one instance per event loop.
    """

    __slots__ = (
        "_root",
        "_dollar_root",
        "_exact",
        "_count",
        "_cache",
        "_cache_size",
        "generation",
    )

    def __init__(self, cache_size: int = DEFAULT_CACHE_SIZE) -> None:
        self._root = _Node()
        # The root's literal children are shared (one dict, never replaced) with a second root
        # that has no '+' or '#', where topics starting with '$' begin their walk.
        self._root.children = {}
        self._dollar_root = _Node()
        self._dollar_root.children = self._root.children
        self._exact: dict[str, _Dests] = {}
        self._count = 0
        self._cache: dict[str, frozenset[D]] = {}
        self._cache_size = cache_size
        self.generation = 0  # bumped on every change; lets others tell if routes moved

    # --- mutation -------------------------------------------------------------------------

    @staticmethod
    def _check(filter: str) -> None:
        validate_filter(filter)
        if filter.startswith(SHARE_PREFIX):
            raise InvalidFilter(
                "shared subscription filters must be unwrapped by the caller "
                "(bind the inner filter to a group destination)",
                details={"filter": filter},
            )

    def _changed(self, exact_topic: str | None) -> None:
        self.generation += 1
        if exact_topic is not None:
            self._cache.pop(exact_topic, None)  # an exact filter only affects its own topic
        elif self._cache:
            self._cache.clear()

    def add(self, filter: str, dest: D) -> bool:
        """Bind ``dest`` to ``filter``; True if the binding is new."""
        self._check(filter)
        hash(dest)  # fail before creating nodes, not halfway through
        wildcard = is_wildcard(filter)
        if not wildcard:
            site = self._exact.get(filter)
            if site is None:
                site = self._exact[filter] = _Dests()
        else:
            levels, hash_tail = _split(filter)
            node = self._root
            for level in levels:
                node = node.child_or_new(level)
            site = node.site_or_new(hash_tail)
        if dest in site.members:  # a site exists only while non-empty: no node was created
            return False
        site.members.add(dest)
        site.frozen = None
        self._count += 1
        self._changed(None if wildcard else filter)
        return True

    def remove(self, filter: str, dest: D) -> bool:
        """Unbind ``dest`` from ``filter``; False if it was not bound. Empty nodes are freed."""
        self._check(filter)
        if not is_wildcard(filter):
            site = self._exact.get(filter)
            if site is None or dest not in site.members:
                return False
            site.members.discard(dest)
            site.frozen = None
            if not site.members:
                del self._exact[filter]
            self._count -= 1
            self._changed(filter)
            return True
        levels, hash_tail = _split(filter)
        path: list[tuple[_Node, str, _Node]] = []
        node = self._root
        for level in levels:
            if level == "+":
                nxt = node.plus
            else:
                nxt = node.children.get(level) if node.children is not None else None
            if nxt is None:
                return False
            path.append((node, level, nxt))
            node = nxt
        site = node.hdests if hash_tail else node.dests
        if site is None or dest not in site.members:
            return False
        site.members.discard(dest)
        site.frozen = None
        if not site.members:
            if hash_tail:
                node.hdests = None
            else:
                node.dests = None
            # Free nodes that now hold nothing, deepest first.
            for parent, level, child in reversed(path):
                if not child.is_empty():
                    break
                if level == "+":
                    parent.plus = None
                else:
                    children = parent.children
                    assert children is not None
                    del children[level]
                    if not children and parent is not self._root:
                        parent.children = None
        self._count -= 1
        self._changed(None)
        return True

    # --- lookup ---------------------------------------------------------------------------

    def match(self, topic: str) -> frozenset[D]:
        """Destinations whose filter matches ``topic`` (a valid topic name; not re-checked)."""
        cache = self._cache
        hit = cache.get(topic)
        if hit is not None:
            return hit
        # The walk is inlined here (not a helper) because a call costs ~5% of a cold match.
        found: list[frozenset] = []
        site = self._exact.get(topic)
        if site is not None:
            found.append(site.frozen or site.snapshot())
        # '$' topics start from a view of the root without its '+' and '#' (MQTT §4.7.2).
        frontier = [self._dollar_root if topic[:1] == "$" else self._root]
        for level in topic.split("/"):
            nxt: list[_Node] = []
            for node in frontier:
                site = node.hdests
                if site is not None:
                    found.append(site.frozen or site.snapshot())
                children = node.children
                if children is not None:
                    child = children.get(level)
                    if child is not None:
                        nxt.append(child)
                if node.plus is not None:
                    nxt.append(node.plus)
            if not nxt:
                break
            frontier = nxt
        else:
            for node in frontier:
                site = node.dests
                if site is not None:
                    found.append(site.frozen or site.snapshot())
                site = node.hdests  # "a/#" also matches "a"
                if site is not None:
                    found.append(site.frozen or site.snapshot())
        if not found:
            result = _EMPTY
        elif len(found) == 1:
            result = found[0]
        else:
            result = found[0].union(*found[1:])
        if self._cache_size > 0:
            if len(cache) >= self._cache_size:
                cache.clear()
            cache[topic] = result
        return result

    def clear_cache(self) -> None:
        """Drop memoised results (memory pressure, benchmarks); routing is unaffected."""
        self._cache.clear()

    def filters(self) -> Iterator[tuple[str, D]]:
        """Every (filter, destination) binding, in no particular order (e.g. for resync)."""
        for topic, site in self._exact.items():
            for dest in site.members:
                yield topic, dest
        stack: list[tuple[_Node, tuple[str, ...]]] = [(self._root, ())]
        while stack:
            node, prefix = stack.pop()
            if node.dests is not None:
                f = "/".join(prefix)
                for dest in node.dests.members:
                    yield f, dest
            if node.hdests is not None:
                f = "/".join((*prefix, "#"))
                for dest in node.hdests.members:
                    yield f, dest
            if node.plus is not None:
                stack.append((node.plus, (*prefix, "+")))
            if node.children is not None:
                for level, child in node.children.items():
                    stack.append((child, (*prefix, level)))

    def __len__(self) -> int:
        return self._count

    def __repr__(self) -> str:
        return f"RouteTrie({self._count} bindings, generation {self.generation})"


__all__ = ["DEFAULT_CACHE_SIZE", "RouteTrie"]
