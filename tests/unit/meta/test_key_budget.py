"""Every meta-store key an identifier a client sends ends up in stays within the key budget
when each identifier is at its limit (DESIGN.md §13): no accepted input can make a shared
flush fail with KeyTooLarge."""

import pytest

from flowmq_core.limits import MAX_CLIENT_ID_BYTES, MAX_NAME_BYTES, MAX_TOPIC_BYTES
from flowmq_core.topics import validate_subscription_filter, validate_topic
from flowmq_meta import keys
from flowmq_meta.api import MAX_KEY_BYTES

NS = "n" * MAX_NAME_BYTES
NODE = "h" * MAX_NAME_BYTES
NAME = "q" * MAX_NAME_BYTES
CLIENT = "c" * MAX_CLIENT_ID_BYTES
# The longest accepted topic and shared filter, in 4-byte characters where that is longest.
TOPIC = "\U0001f600" * (MAX_TOPIC_BYTES // 4)
SHARED = "$share/" + "g" * MAX_NAME_BYTES + "/" + "f" * (MAX_TOPIC_BYTES - 8 - MAX_NAME_BYTES)
SEQ = 2**63 - 1


def test_the_longest_identifiers_are_accepted():
    validate_topic(TOPIC)
    assert validate_subscription_filter(SHARED) is not None


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("route", lambda: keys.ROUTES.pack(NODE, NS, SHARED)),
        ("retained", lambda: keys.RETAINED.pack(NS, TOPIC)),
        ("session", lambda: keys.SESSIONS.pack(NS, CLIENT)),
        ("session queue", lambda: keys.QUEUE_READY.pack(NS, "$session/" + CLIENT, 0, SEQ)),
        ("queue lease", lambda: keys.QUEUE_INFLIGHT.pack(NS, NAME, SEQ, SEQ)),
        ("group offset", lambda: keys.GROUP_OFFSETS.pack(NS, NAME, NAME, 2**31 - 1)),
        ("stream index", lambda: keys.STREAM_INDEX.pack(NS, NAME, 2**31 - 1, SEQ)),
    ],
)
def test_key_at_the_limits_fits_half_the_budget(name, key):
    assert len(key()) <= MAX_KEY_BYTES // 2, name
