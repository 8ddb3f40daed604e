"""Match rate of flowmq_core.trie.RouteTrie with realistic filter sets.

    python benchmarks/trie_match.py --filters 10000 100000 --topics 200000 --seconds 2

Modes per filter count:
  uncached  cache disabled (cache_size=0): every call walks the trie
  cold      default cache, memo emptied, every topic distinct (miss + insert into the memo)
  hot       default cache, a small set of topics repeated (the memo answers)
"""

from __future__ import annotations

import argparse
import random
import resource
import sys
import time
from collections.abc import Callable

from flowmq_core.trie import RouteTrie


def make_filters(n: int, rng: random.Random) -> list[str]:
    """A mix like an IoT/telemetry deployment: per-device wildcards, site trees, exact topics."""
    tenants = max(10, n // 200)
    devices = 50
    out: set[str] = set()
    while len(out) < n:
        r = rng.random()
        i = rng.randrange(tenants)
        j = rng.randrange(devices)
        if r < 0.35:
            f = f"tenant{i}/device{j}/+/telemetry"
        elif r < 0.45:
            f = f"tenant{i}/device{j}/#"
        elif r < 0.55:
            f = f"site/{rng.randrange(n // 10 + 1)}/#"
        elif r < 0.80:
            f = f"tenant{i}/device{j}/sensor{rng.randrange(20)}/telemetry"
        elif r < 0.88:
            f = f"tenant{i}/+/status"
        elif r < 0.95:
            f = f"fleet/{rng.randrange(n // 50 + 1)}/+/+/gps/+"
        else:
            depth = rng.randrange(3, 7)
            f = "/".join(f"l{rng.randrange(30)}" for _ in range(depth))
        out.add(f)
    return sorted(out)


def make_topics(count: int, n_filters: int, rng: random.Random) -> list[str]:
    tenants = max(10, n_filters // 200)
    out = []
    for _ in range(count):
        r = rng.random()
        if r < 0.5:
            t = (
                f"tenant{rng.randrange(tenants)}/device{rng.randrange(60)}/"
                f"sensor{rng.randrange(25)}/telemetry"
            )
        elif r < 0.6:
            t = f"tenant{rng.randrange(tenants)}/device{rng.randrange(60)}/status"
        elif r < 0.75:
            t = f"site/{rng.randrange(n_filters // 10 + 1)}/floor{rng.randrange(5)}/room{rng.randrange(40)}"
        elif r < 0.85:
            t = f"fleet/{rng.randrange(n_filters // 50 + 1)}/truck{rng.randrange(100)}/x/gps/lat"
        elif r < 0.95:
            t = "/".join(f"l{rng.randrange(30)}" for _ in range(rng.randrange(3, 7)))
        else:
            t = f"unrelated/{rng.randrange(10**6)}/data"
        out.append(t)
    return out


def run(
    match: Callable[[str], frozenset],
    topics: list[str],
    seconds: float,
    between_passes: Callable[[], None] | None = None,
) -> tuple[float, float]:
    """Matches per second and mean destinations per match, looping over ``topics``."""
    done = 0
    found = 0
    clock = time.perf_counter
    start = clock()
    deadline = start + seconds
    chunk = 10_000
    while True:
        for k in range(0, len(topics), chunk):
            for t in topics[k : k + chunk]:
                found += len(match(t))
            done += min(chunk, len(topics) - k)
            if clock() >= deadline:
                elapsed = clock() - start
                return done / elapsed, found / done
        if between_passes is not None:
            between_passes()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--filters", type=int, nargs="+", default=[10_000, 100_000])
    p.add_argument("--topics", type=int, default=200_000, help="distinct topics (uncached/cold)")
    p.add_argument("--hot-topics", type=int, default=1_000, help="repeated topics (hot)")
    p.add_argument("--dests-per-filter", type=int, default=1)
    p.add_argument("--seconds", type=float, default=2.0, help="per measurement")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)

    rows = []
    for n in args.filters:
        rng = random.Random(args.seed)
        filters = make_filters(n, rng)
        topics = make_topics(args.topics, n, rng)
        hot = topics[: args.hot_topics]

        t0 = time.perf_counter()
        cached = RouteTrie()
        uncached = RouteTrie(cache_size=0)
        for idx, f in enumerate(filters):
            for k in range(args.dests_per_filter):
                cached.add(f, (idx, k))
        build_s = time.perf_counter() - t0
        for f, d in cached.filters():
            uncached.add(f, d)
        wildcard = sum(1 for f in filters if "+" in f or "#" in f)
        print(
            f"# {n} filters ({wildcard} wildcard), {len(cached)} bindings, "
            f"built in {build_s:.2f}s ({len(cached) / build_s:,.0f} adds/s)",
            flush=True,
        )

        # Warm-up pass: builds each binding site's frozen snapshot once, as a running broker
        # would have; "cold" below means an empty per-topic memo, not a fresh process.
        for t in topics:
            uncached.match(t)
            cached.match(t)
        rate, avg = run(uncached.match, topics, args.seconds)
        rows.append((n, "uncached", rate, avg))
        cached.clear_cache()
        rate, avg = run(cached.match, topics, args.seconds, cached.clear_cache)
        rows.append((n, "cold", rate, avg))
        for t in hot:
            cached.match(t)
        rate, avg = run(cached.match, hot, args.seconds)
        rows.append((n, "hot", rate, avg))

    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{'filters':>9} {'mode':<9} {'matches/s':>12} {'ns/match':>9} {'dests/match':>12}")
    for n, mode, rate, avg in rows:
        print(f"{n:>9} {mode:<9} {rate:>12,.0f} {1e9 / rate:>9.0f} {avg:>12.2f}")
    print(f"python {sys.version.split()[0]}, peak RSS {rss_mb:.0f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
