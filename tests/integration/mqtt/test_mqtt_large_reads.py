"""A client that sends faster than the broker handles is read a large read at a time, the
other sockets served between two such reads (``YIELD_AFTER_READ_BYTES`` in
``flowmq_broker.mqtt.connection``): whatever it sent is still handled whole and in order,
and its reading goes on after each pause."""

from __future__ import annotations

import threading

from flowmq_broker.mqtt.connection import YIELD_AFTER_READ_BYTES
from flowmq_wire.mqtt.codec import encode
from flowmq_wire.mqtt.packets import Publish, SubscriptionOptions

PAYLOAD = 100


def test_two_publishers_bursts_of_many_large_reads_arrive_whole_and_each_in_order(raw, uid):
    topic_filter = f"large/{uid}/+"
    sub = raw(4)
    sub.connect(f"sub-{uid}")
    sub.subscribe((topic_filter, SubscriptionOptions(0)))
    pubs = [raw(4) for _ in range(2)]
    bursts = []
    for i, pub in enumerate(pubs):
        pub.connect(f"pub{i}-{uid}")
        topic = f"large/{uid}/p{i}"
        packets = [
            encode(Publish(topic, f"{i}:{n}:".encode().ljust(PAYLOAD, b".")), 4)
            for n in range(6 * YIELD_AFTER_READ_BYTES // (PAYLOAD + len(topic)))
        ]
        bursts.append((topic, len(packets), b"".join(packets)))
    # Both at once, each several times what one read may take before the broker yields.
    senders = [
        threading.Thread(target=pub.send_raw, args=(burst,))
        for pub, (_, _, burst) in zip(pubs, bursts, strict=True)
    ]
    for sender in senders:
        sender.start()
    got: dict[str, list[int]] = {topic: [] for topic, _, _ in bursts}
    for _ in range(sum(count for _, count, _ in bursts)):
        p = sub.expect(Publish)
        got[p.topic].append(int(p.payload.split(b":")[1]))
    for sender in senders:
        sender.join()
    for topic, count, _ in bursts:
        assert got[topic] == list(range(count))
    sub.expect_nothing()
