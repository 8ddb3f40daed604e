"""The Queue store end to end on a memory meta store: enqueue, claim, ack, nack, leases,
dead letters, TTL, size limit, Basic.Get, purge, delete and object reference counts."""

from __future__ import annotations

import asyncio

import pytest

from flowmq_commit import MaintenanceOptions, collect_garbage
from flowmq_commit.errors import StoreUnavailable
from flowmq_core.message import Message
from flowmq_meta.keys import OBJECT_REFS, QUEUE_INFLIGHT, QUEUE_READY
from flowmq_queue import QueueEngine, QueueFull, QueueOptions
from tests.fixtures.counting import CountingObjectStore, hold_puts
from tests.fixtures.waiting import wait_until_async

pytestmark = pytest.mark.timeout(30)


async def test_fifo_with_one_shard(env) -> None:
    env.queue("q", shards=1)
    for batch in range(5):
        await env.publish("q", *[f"{batch}-{i}".encode() for i in range(10)])
    inbox = env.consumer("q", prefetch=0)
    await inbox.wait(50)
    assert inbox.payloads() == [f"{b}-{i}".encode() for b in range(5) for i in range(10)]


async def test_shards_spread_entries_and_every_message_arrives_once(env) -> None:
    env.queue("q", shards=4)
    for batch in range(8):
        await env.publish("q", *[f"{batch}-{i}".encode() for i in range(5)])
    shards = await env.engine.parts.meta.transact(
        lambda tr: {QUEUE_READY.unpack(k)[2] for k, _ in tr.get_range(*QUEUE_READY.range())}
    )
    assert len(shards) > 1
    inbox = env.consumer("q", prefetch=100)
    await inbox.wait(40)
    assert sorted(inbox.payloads()) == sorted(
        f"{b}-{i}".encode() for b in range(8) for i in range(5)
    )


async def test_ack_deletes_and_releases_objects(env) -> None:
    env.queue("q")
    await env.publish("q", *[b"m%d" % i for i in range(30)])
    inbox = env.consumer("q", prefetch=7)
    acked = 0
    while acked < 30:
        await inbox.wait(acked + 1)
        for d in inbox.items[acked:]:
            env.engine.ack(d)
            acked += 1
    await env.settle()
    stats = await env.engine.stats("default", "q")
    assert stats["count"] == 0 and stats["inflight"] == 0 and stats["bytes"] == 0
    refs = await env.engine.parts.meta.transact(lambda tr: tr.get_range(*OBJECT_REFS.range()))
    assert refs == []  # every object's last reference went with the last ack
    clock = env.clock
    later = MaintenanceOptions(clock=lambda: clock() + 600_000)
    result = await collect_garbage(env.engine.parts.meta, env.engine.parts.objects, later)
    assert result.deleted >= 1
    assert await env.engine.parts.objects.list("segments/") == []


async def test_prefetch_limits_unacked(env) -> None:
    env.queue("q")
    await env.publish("q", *[b"x"] * 20)
    inbox = env.consumer("q", prefetch=5)
    await inbox.wait(5)
    await asyncio.sleep(0.1)
    assert len(inbox.items) == 5
    env.engine.ack(inbox.items[0])
    await inbox.wait(6)
    await asyncio.sleep(0.05)
    assert len(inbox.items) == 6


async def test_competing_consumers_share_without_overlap(env) -> None:
    env.queue("q")
    a, b, c = (env.consumer("q", prefetch=3) for _ in range(3))
    await env.publish("q", *[b"%d" % i for i in range(60)])
    seen: list[bytes] = []
    while len(seen) < 60:
        await asyncio.sleep(0.01)
        for inbox in (a, b, c):
            for d in inbox.items:
                seen.append(d.message.payload)
                env.engine.ack(d)
            inbox.items.clear()
    assert sorted(seen) == sorted(b"%d" % i for i in range(60))
    assert len(set(seen)) == 60


async def test_nack_requeues_with_redelivered_flag(env) -> None:
    env.queue("q", max_retries=5)
    await env.publish("q", b"one")
    inbox = env.consumer("q", prefetch=1)
    first = (await inbox.wait(1))[0]
    assert not first.redelivered
    env.engine.reject(first, requeue=True)
    second = (await inbox.wait(2))[1]
    assert second.message.payload == b"one" and second.redelivered
    env.engine.ack(second)
    await env.settle()
    assert (await env.engine.stats("default", "q"))["count"] == 0


async def test_max_retries_moves_to_dead_letter_topic(env) -> None:
    env.queue("q", max_retries=2, dead_letter_topic="dlq/q")
    await env.publish("q", b"poison")
    inbox = env.consumer("q", prefetch=1)
    for attempt in range(3):
        d = (await inbox.wait(attempt + 1))[attempt]
        assert d.redelivered == (attempt > 0)
        env.engine.reject(d, requeue=True)
    for _ in range(100):
        if env.dead:
            break
        await asyncio.sleep(0.02)
    ns, message = env.dead[0]
    assert message.topic == "dlq/q" and message.payload == b"poison"
    assert ("x-death-queue", b"q") in message.headers
    await env.settle()
    assert (await env.engine.stats("default", "q"))["count"] == 0
    await asyncio.sleep(0.2)
    assert len(inbox.items) == 3


async def test_reject_without_requeue_and_no_dead_letter_topic_drops(env) -> None:
    env.queue("q")
    await env.publish("q", b"bad", b"good")
    inbox = env.consumer("q", prefetch=2)
    bad, good = await inbox.wait(2)
    env.engine.reject(bad, requeue=False)
    env.engine.ack(good)
    await env.settle()
    assert env.dead == []
    stats = await env.engine.stats("default", "q")
    assert stats["count"] == 0 and stats["inflight"] == 0


async def test_expired_lease_is_reaped_by_another_engine(env) -> None:
    env.queue("q", max_retries=5)
    await env.publish("q", b"a", b"b", b"c")
    inbox = env.consumer("q", prefetch=10)
    await inbox.wait(3)
    env.engine.ack(inbox.items[0])
    await env.settle()
    # The holder dies: no more renewals, its leases run out.
    await env.engine.close()
    clock_b = lambda: env.clock() + 5_000  # noqa: E731 - past the 2 s lease
    other = QueueEngine(
        env.engine.parts.meta,
        env.engine.parts.objects,
        env.batcher,
        options=lambda ns, q: env.options.get((ns, q)),
        clock=clock_b,
        lease_ms=2_000,
    )
    other.start()
    try:
        assert await other.reap_once([("default", "q")]) == 2
        got = []
        other.subscribe("default", "q", "b", got.extend, prefetch=10)
        for _ in range(200):
            if len(got) == 2:
                break
            await asyncio.sleep(0.01)
        assert sorted(d.message.payload for d in got) == [b"b", b"c"]
        assert all(d.redelivered for d in got)
    finally:
        await other.close()


async def test_ttl_expired_messages_are_not_delivered(env) -> None:
    env.queue("q", ttl_ms=1_000)
    await env.publish("q", b"old")
    env.clock.offset = 2_000
    env.options[("default", "q")] = QueueOptions(ttl_ms=None)
    await env.publish("q", b"fresh")
    inbox = env.consumer("q", prefetch=10)
    await inbox.wait(1)
    await asyncio.sleep(0.1)
    assert inbox.payloads() == [b"fresh"]
    env.engine.ack(inbox.items[0])
    await env.settle()
    assert (await env.engine.stats("default", "q"))["count"] == 0


async def test_per_message_expiry(env) -> None:
    env.queue("q")
    past = env.clock() - 1
    await env.publish("q", b"gone", expiry_ms=past)
    await env.publish("q", b"kept", expiry_ms=past + 60_000)
    inbox = env.consumer("q")
    await inbox.wait(1)
    await asyncio.sleep(0.05)
    assert inbox.payloads() == [b"kept"]


async def test_size_limit_refuses_publish(env) -> None:
    opts = env.queue("q")
    body_size = len(_encoded(b"x" * 200))
    env.options[("default", "q")] = opts = QueueOptions(max_bytes=body_size * 3)
    await env.publish("q", b"x" * 200, b"x" * 200, b"x" * 200)
    with pytest.raises(QueueFull, match="full"):
        await env.engine.enqueue("default", "q", Message("q", b"x" * 200), opts)
    inbox = env.consumer("q", prefetch=1)
    env.engine.ack((await inbox.wait(1))[0])
    await env.settle()
    await env.publish("q", b"x" * 200)


def _encoded(payload: bytes) -> bytes:
    from flowmq_queue.codec import encode_message

    return encode_message(Message("q", payload))


async def test_get_returns_one_and_counts_the_rest(env) -> None:
    env.queue("q")
    delivery, left = await env.engine.get("default", "q")
    assert delivery is None
    await env.publish("q", b"1", b"2", b"3")
    delivery, left = await env.engine.get("default", "q")
    assert delivery is not None and delivery.message.payload == b"1" and left == 2
    env.engine.ack(delivery)
    delivery, left = await env.engine.get("default", "q", no_ack=True)
    assert delivery is not None and delivery.message.payload == b"2" and left == 1


async def test_purge_and_delete(env) -> None:
    env.queue("q")
    await env.publish("q", *[b"p"] * 12)
    inbox = env.consumer("q", prefetch=2)
    await inbox.wait(2)
    await env.settle()
    leased = (await env.engine.stats("default", "q"))["inflight"]
    assert leased >= 2  # delivered, and maybe claimed ahead of the prefetch window
    assert await env.engine.purge("default", "q") == 12 - leased
    stats = await env.engine.stats("default", "q")
    assert stats["count"] == leased and stats["inflight"] == leased
    await env.engine.delete("default", "q")
    assert await env.engine.stats("default", "q") == {
        "seq": 0,
        "count": 0,
        "bytes": 0,
        "inflight": 0,
    }
    left = await env.engine.parts.meta.transact(lambda tr: tr.get_range(*QUEUE_INFLIGHT.range()))
    assert left == []


async def test_purge_seqs_drops_only_the_messages_named(env) -> None:
    # A connected MQTT session's copies are dropped this way once its client acknowledged
    # them: what another broker enqueued for it meanwhile must stay.
    env.queue("q", shards=1)
    first = [r.seq for r in await env.publish("q", *[f"a{i}".encode() for i in range(6)])]
    assert await env.engine.purge_seqs("default", "q", {first[0], first[2]}) == 2
    later = [r.seq for r in await env.publish("q", b"b0", b"b1")]
    named = {first[1], first[3], first[4], first[5], later[0]}
    assert await env.engine.purge_seqs("default", "q", named | {10_000}) == 5
    left = await env.engine.peek("default", "q", 10)
    assert [(seq, m.payload) for seq, _, m in left] == [(later[1], b"b1")]
    assert (await env.engine.stats("default", "q"))["count"] == 1


async def test_purge_seqs_reads_each_shard_only_up_to_the_highest_seq_named(env) -> None:
    # An MQTT session drops what its client acknowledged of a long backlog a page at a time,
    # from the head: the purge stops in each shard past the highest seq it names (and goes
    # on with the next shard), rather than reading the whole queue each time.
    env.queue("q", shards=3)
    seqs = [r.seq for batch in range(20) for r in await env.publish("q", b"x%d" % batch, b"y")]
    head = set(sorted(seqs)[:5])
    reads: list[int] = []
    meta = env.engine.parts.meta
    transact = meta.transact

    async def counting(fn):  # noqa: ANN001, ANN202
        def wrapped(tr):  # noqa: ANN001, ANN202
            get_range = tr.get_range

            def counted(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
                rows = get_range(*args, **kwargs)
                reads.append(len(rows))
                return rows

            tr.get_range = counted
            return fn(tr)

        return await transact(wrapped)

    meta.transact = counting
    try:
        assert await env.engine.purge_seqs("default", "q", head) == 5
    finally:
        meta.transact = transact
    left = await env.engine.peek("default", "q", 100)
    assert sorted(seq for seq, _, _ in left) == sorted(set(seqs) - head)
    # The three entries holding them, and a look at where each shard starts (the old purge
    # read all twenty).
    assert sum(reads) <= 3 + 4


async def test_peek_skips_what_the_reader_has_and_reads_at_most_max_objects(env) -> None:
    # An MQTT session's stored backlog is read a page at a time (offline.py): a page reads
    # a bounded number of objects, and the next leaves out what the earlier ones read.
    env.queue("q", shards=1)
    seqs = [(await env.publish("q", f"m{i}".encode()))[0].seq for i in range(5)]  # an object each
    page = await env.engine.peek("default", "q", 10, max_objects=2)
    assert [(seq, m.payload) for seq, _, m in page] == [(seqs[0], b"m0"), (seqs[1], b"m1")]
    page = await env.engine.peek("default", "q", 10, skip={seqs[0], seqs[2]}, max_objects=2)
    assert [seq for seq, _, _ in page] == [seqs[1], seqs[3]]
    assert [seq for seq, _, _ in await env.engine.peek("default", "q", 10, skip=set(seqs))] == []


async def test_closed_consumer_messages_go_to_another(env) -> None:
    env.queue("q")
    await env.publish("q", b"a", b"b")
    first = env.consumer("q", prefetch=5)
    await first.wait(2)
    env.engine.cancel(first.consumer)
    for d in first.items:  # what a closing channel does with its unacked deliveries
        env.engine.reject(d, requeue=True)
    second = env.consumer("q", prefetch=5)
    got = await second.wait(2)
    assert sorted(d.message.payload for d in got) == [b"a", b"b"]
    assert all(d.redelivered for d in got)


async def test_batched_rounds_keep_transactions_per_message_low(env) -> None:
    env.queue("q")
    inbox = env.consumer("q", prefetch=256)
    n = 3000
    futures = [
        env.engine.enqueue("default", "q", Message("q", b"x" * 100), env.options[("default", "q")])
        for _ in range(n)
    ]
    acked = 0
    while acked < n:
        await inbox.wait(acked + 1)
        for d in inbox.items[acked:]:
            env.engine.ack(d)
            acked += 1
    await asyncio.gather(*futures)
    await env.settle()
    transactions = env.batcher.stats.flushes + env.engine.claims.rounds
    assert transactions / n <= 0.05


async def test_cancelled_consumers_are_not_kept(env) -> None:
    """A consumer per subscription (an MQTT session's reconnect takes its stored messages
    through one): once cancelled, the engine must not keep it, nor what its callback holds."""
    env.queue("q")
    await env.publish("q", b"a", b"b")
    first = env.consumer("q", no_ack=True)
    await first.wait(2)
    env.engine.cancel(first.consumer)
    idle = env.consumer("q")
    env.engine.cancel(idle.consumer)  # cancelled with nothing claimed for it
    await env.settle()
    await env.publish("q", b"c")
    later = env.consumer("q", no_ack=True)
    assert (await later.wait(1))[0].message.payload == b"c"
    env.engine.cancel(later.consumer)
    await env.settle()
    assert env.engine.claims._consumers == {}


async def test_publish_to_delivery_is_one_flush_for_a_waiting_consumer(env) -> None:
    """The claim round a local enqueue wakes rides the flush that stores the message: the
    flush's own transaction claims it, no claim transaction follows."""
    env.queue("q")
    inbox = env.consumer("q", prefetch=10)
    await env.settle()
    with env.counted_transactions() as count:
        for i in range(3):
            future = env.engine.enqueue(
                "default", "q", Message("q", f"m{i}".encode()), env.options[("default", "q")]
            )
            await inbox.wait(i + 1)
            assert future.done()
            await env.settle()
            env.engine.ack(inbox.items[i])
            await env.settle()
        # per message: the flush (enqueue + claim) and the ack's round
        assert count[0] == 6


async def test_an_enqueue_submitted_during_a_round_is_claimed_by_the_flush_storing_it(
    env,
) -> None:
    """A round that claimed less than it asked for, while another enqueue waited for a later
    flush, keeps the queue ready: the next round rides that flush and claims the message in
    its transaction, not in a claim transaction of its own once it has committed."""
    env.queue("q")
    inbox = env.consumer("q", prefetch=10)
    await env.settle()
    opts = env.options[("default", "q")]
    gate = asyncio.Event()
    held = asyncio.Event()

    async def hold_the_first(n: int) -> None:
        if n == 1:  # the first flush's commit waits until the others are queued
            held.set()
            await gate.wait()

    with env.counted_transactions(hold_the_first) as count:
        first = env.engine.enqueue("default", "q", Message("q", b"m0"), opts)
        await held.wait()  # the first flush (its round riding with it) is committing
        second = env.engine.enqueue("default", "q", Message("q", b"m1"), opts)
        # the second flush takes m1 and waits its turn
        await wait_until_async(lambda: not env.batcher.pending_bytes, step=0, what="m1 taken")
        third = env.engine.enqueue("default", "q", Message("q", b"m2"), opts)
        gate.set()
        await asyncio.gather(first, second, third)
        await inbox.wait(3)
        assert sorted(inbox.payloads()) == [b"m0", b"m1", b"m2"]
        # three flushes, the later messages claimed by the third one's riding round
        assert count[0] == 3


async def test_enqueues_after_the_riding_round_in_the_same_flush_need_no_claim_of_their_own(
    env,
) -> None:
    """The round riding a flush claims after all of the flush's enqueues, even those
    submitted after the round: their commit does not start a claim transaction."""
    env.queue("q")
    env.queue("other")
    inbox = env.consumer("q", prefetch=10)
    await env.settle()
    objects = CountingObjectStore(env.batcher.objects)
    env.batcher.objects = objects
    gate = asyncio.Event()
    objects.put_gate = gate
    with env.counted_transactions() as count:
        blocker = env.engine.enqueue("default", "other", Message("other", b"x"), QueueOptions())
        await objects.put_waiting.wait()  # a flush is writing: the next ones accumulate
        opts = env.options[("default", "q")]
        first = env.engine.enqueue("default", "q", Message("q", b"m0"), opts)
        # the round it woke joins the next flush
        await wait_until_async(
            lambda: env.engine.claims._riding is not None, step=0, what="a riding round"
        )
        second = env.engine.enqueue("default", "q", Message("q", b"m1"), opts)
        objects.put_gate = None
        gate.set()
        await asyncio.gather(blocker, first, second)
        await inbox.wait(2)
        await env.settle()
        assert inbox.payloads() == [b"m0", b"m1"]
        assert count[0] == 2  # the two flushes; the second one's round claimed both


async def test_claim_ahead_delivers_before_the_commit_without_a_claim_round(env) -> None:
    """A consumer that takes claims ahead gets a message published on this broker while its
    flush is still writing; the flush stores it leased to that consumer: one in-flight
    entry, nothing ready, and no claim transaction."""
    env.queue("q")
    inbox = env.consumer("q", prefetch=10, claim_ahead=True)
    await env.settle()  # the first round finds the queue empty
    gated = hold_puts(env.batcher)
    opts = env.options[("default", "q")]
    with env.counted_transactions() as count:
        futures = [
            env.engine.enqueue("default", "q", Message("q", b"m%d" % i), opts) for i in range(3)
        ]
        await inbox.wait(3)
        assert not any(f.done() for f in futures)  # delivered, not yet stored
        assert inbox.payloads() == [b"m0", b"m1", b"m2"]
        gated.put_gate.set()
        await asyncio.gather(*futures)
        assert count[0] == 1  # the flush alone
    ready, leased = await env.engine.parts.meta.transact(
        lambda tr: (tr.get_range(*QUEUE_READY.range()), tr.get_range(*QUEUE_INFLIGHT.range()))
    )
    assert ready == [] and len(leased) == 1
    for d in inbox.items:
        env.engine.ack(d)
    await env.settle()
    stats = await env.engine.stats("default", "q")
    assert stats["count"] == 0 and stats["inflight"] == 0 and stats["bytes"] == 0


async def test_claim_ahead_is_handed_out_at_the_end_of_the_publishers_run(env) -> None:
    """``hand_out_ahead`` delivers what was claimed ahead at once, in the same loop
    iteration as the enqueues (the AMQP channel calls it after a run of publishes)."""
    env.queue("q")
    inbox = env.consumer("q", prefetch=10, claim_ahead=True)
    await env.settle()
    opts = env.options[("default", "q")]
    futures = [env.engine.enqueue("default", "q", Message("q", b"m%d" % i), opts) for i in range(2)]
    assert inbox.items == []
    env.engine.hand_out_ahead()
    assert inbox.payloads() == [b"m0", b"m1"]
    await asyncio.gather(*futures)


async def test_claim_ahead_settles_given_before_the_commit_apply_after_it(env) -> None:
    """An ack and a requeue of messages claimed ahead, given before their flush committed,
    take effect once it has: the acked one is gone, the requeued one comes back with the
    redelivered flag."""
    env.queue("q")
    inbox = env.consumer("q", prefetch=10, claim_ahead=True)
    await env.settle()
    gated = hold_puts(env.batcher)
    opts = env.options[("default", "q")]
    futures = [env.engine.enqueue("default", "q", Message("q", b"m%d" % i), opts) for i in range(3)]
    await inbox.wait(3)
    env.engine.ack(inbox.items[0])
    env.engine.reject(inbox.items[1], requeue=True)
    gated.put_gate.set()
    await asyncio.gather(*futures)
    redelivered = (await inbox.wait(4))[3]
    assert redelivered.message.payload == b"m1" and redelivered.redelivered
    assert len(inbox.items) == 4
    env.engine.ack(inbox.items[2])
    env.engine.ack(redelivered)
    await env.settle()
    stats = await env.engine.stats("default", "q")
    assert stats["count"] == 0 and stats["inflight"] == 0 and stats["bytes"] == 0


async def test_claim_ahead_waits_for_older_ready_messages(env) -> None:
    """Messages stored before the consumer came are delivered first: nothing is claimed
    ahead while the queue may have a backlog, so a new message never overtakes it."""
    env.queue("q", shards=1)
    await env.publish("q", *[b"old%d" % i for i in range(5)])
    inbox = env.consumer("q", prefetch=100, claim_ahead=True)
    await env.publish("q", b"new")
    await inbox.wait(6)
    assert inbox.payloads() == [*(b"old%d" % i for i in range(5)), b"new"]


async def test_claim_ahead_settles_are_dropped_when_the_flush_fails(env) -> None:
    """A message claimed ahead whose flush fails was never stored: the publisher's future
    fails, and the consumer's ack of it changes nothing."""
    env.queue("q")
    inbox = env.consumer("q", prefetch=10, claim_ahead=True)
    await env.settle()
    gated = hold_puts(env.batcher)
    gated.fail_puts = 1
    future = env.engine.enqueue(
        "default", "q", Message("q", b"lost"), env.options[("default", "q")]
    )
    await inbox.wait(1)
    env.engine.ack(inbox.items[0])
    gated.put_gate.set()
    with pytest.raises(StoreUnavailable):
        await future
    await env.settle()
    assert not env.engine.claims.pending()
    stats = await env.engine.stats("default", "q")
    assert stats["count"] == 0 and stats["inflight"] == 0


async def test_claim_ahead_holds_new_messages_behind_a_backlog(env) -> None:
    """Published while older messages still wait in the queue, new messages are claimed
    ahead but held: the consumer gets every old one first, then the new ones, in order,
    and the new ones never became ready entries (their leases were written at enqueue)."""
    env.queue("q", shards=2)
    await env.publish("q", *[b"old%d" % i for i in range(10)])
    inbox = env.consumer("q", prefetch=2, claim_ahead=True)
    await inbox.wait(2)
    await env.publish("q", *[b"new%d" % i for i in range(6)])
    expected = [*(b"old%d" % i for i in range(10)), *(b"new%d" % i for i in range(6))]
    acked = 0
    while acked < len(expected):
        await inbox.wait(acked + 1)
        for d in inbox.items[acked:]:
            env.engine.ack(d)
            acked += 1
    assert inbox.payloads() == expected
    assert all(d.lease is not None for d in inbox.items[10:])
    assert all(d.lease.run.claim_id.startswith("a") for d in inbox.items[10:])
    await env.settle()
    stats = await env.engine.stats("default", "q")
    assert stats["count"] == 0 and stats["inflight"] == 0
