"""RouteTrie.match against the naive reference matcher, over a tiny level alphabet so that
filters and topics collide often (empty levels, '$' first levels, '+' and '#')."""

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule

from flowmq_core.topics import matches, validate_filter, validate_topic
from flowmq_core.trie import RouteTrie

TOPIC_LEVELS = ["a", "b", "", "$x"]
FILTER_LEVELS = [*TOPIC_LEVELS, "+", "#"]


def _cut_at_hash(levels: list[str]) -> str:
    if "#" in levels:
        levels = levels[: levels.index("#") + 1]
    return "/".join(levels)


# A single empty level gives "", which is neither a valid topic nor a valid filter.
topics = st.lists(st.sampled_from(TOPIC_LEVELS), min_size=1, max_size=5).map("/".join).filter(bool)
filters = (
    st.lists(st.sampled_from(FILTER_LEVELS), min_size=1, max_size=5).map(_cut_at_hash).filter(bool)
)
dests = st.integers(min_value=0, max_value=4)


def expected(bindings, topic):
    return {d for f, d in bindings if matches(f, topic)}


@settings(max_examples=300, deadline=None)
@given(filters, topics)
def test_generated_names_are_valid(f, t):
    validate_filter(f)
    validate_topic(t)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(filters, dests), max_size=25), st.lists(topics, min_size=1, max_size=15))
def test_match_equals_reference(bindings, probe_topics):
    trie = RouteTrie()
    for f, d in bindings:
        trie.add(f, d)
    assert len(trie) == len(set(bindings))
    assert set(trie.filters()) == set(bindings)
    for t in probe_topics:
        want = expected(bindings, t)
        assert trie.match(t) == want
        assert trie.match(t) == want  # second call served from the cache


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.booleans(), filters, dests, st.lists(topics, max_size=3)),
        min_size=1,
        max_size=40,
    )
)
def test_add_remove_sequences(ops):
    """Interleave mutations with matches so stale cache entries would be caught."""
    trie = RouteTrie(cache_size=8)
    model: set[tuple[str, int]] = set()
    for is_add, f, d, probes in ops:
        if is_add:
            assert trie.add(f, d) is ((f, d) not in model)
            model.add((f, d))
        else:
            assert trie.remove(f, d) is ((f, d) in model)
            model.discard((f, d))
        assert len(trie) == len(model)
        for t in probes:
            assert trie.match(t) == expected(model, t)
    for f, d in list(model):
        trie.remove(f, d)
    assert trie._root.is_empty() and not trie._exact


class TrieMachine(RuleBasedStateMachine):
    bound = Bundle("bound")

    def __init__(self):
        super().__init__()
        self.trie = RouteTrie(cache_size=16)
        self.model: set[tuple[str, int]] = set()

    @rule(target=bound, f=filters, d=dests)
    def add(self, f, d):
        assert self.trie.add(f, d) is ((f, d) not in self.model)
        self.model.add((f, d))
        return (f, d)

    @rule(binding=bound)
    def remove_bound(self, binding):
        assert self.trie.remove(*binding) is (binding in self.model)
        self.model.discard(binding)

    @rule(f=filters, d=dests)
    def remove_any(self, f, d):
        assert self.trie.remove(f, d) is ((f, d) in self.model)
        self.model.discard((f, d))

    @rule(t=topics)
    def match(self, t):
        generation = self.trie.generation
        assert self.trie.match(t) == expected(self.model, t)
        assert self.trie.generation == generation

    @invariant()
    def size(self):
        assert len(self.trie) == len(self.model)


TrieMachine.TestCase.settings = settings(max_examples=80, stateful_step_count=40, deadline=None)
test_trie_state_machine = TrieMachine.TestCase
