import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowmq_core.errors import InvalidFilter, InvalidName, InvalidTopic, NameCollision
from flowmq_core.mapping import (
    NameRegistry,
    amqp_binding_filter,
    amqp_publish_topic,
    amqp_queue_filter,
    canonical_to_kafka,
    kafka_to_canonical,
    validate_kafka_topic_name,
)
from flowmq_core.topics import matches, validate_filter, validate_topic

# --- Kafka names --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["a", "a.b", "a_b", "a-b", "A.b-9_z", "...", "a..b", "x" * 249])
def test_validate_kafka_topic_name_accepts(name):
    validate_kafka_topic_name(name)


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("", "empty"),
        (".", "cannot be"),
        ("..", "cannot be"),
        ("x" * 250, "longer than"),
        ("a/b", "characters"),
        ("a b", "characters"),
        ("a+b", "characters"),
        ("é", "characters"),
        ("a\n", "characters"),
    ],
)
def test_validate_kafka_topic_name_rejects(name, fragment):
    with pytest.raises(InvalidName, match=fragment) as ei:
        validate_kafka_topic_name(name)
    assert ei.value.code == "invalid_name"


def test_kafka_to_canonical():
    assert kafka_to_canonical("orders") == "orders"
    assert kafka_to_canonical("a.b.c") == "a/b/c"
    assert kafka_to_canonical("a_b-c") == "a_b-c"
    assert kafka_to_canonical("a..b") == "a//b"
    assert kafka_to_canonical(".a") == "/a"
    with pytest.raises(InvalidName):
        kafka_to_canonical("a/b")
    with pytest.raises(InvalidName):
        kafka_to_canonical("..")


def test_canonical_to_kafka():
    assert canonical_to_kafka("a/b/c") == "a.b.c"
    assert canonical_to_kafka("a_b-c") == "a_b-c"
    assert canonical_to_kafka("/a/") == ".a."


@pytest.mark.parametrize(
    ("topic", "fragment"),
    [
        ("a.b", "contains '.'"),  # would come back as a/b
        ("a b", "no Kafka name"),
        ("a/+", "no Kafka name"),
        ("é", "no Kafka name"),
        ("", "no Kafka name"),
        ("/", "cannot be"),  # would be Kafka "."
        ("//", "cannot be"),
        ("x" * 250, "longer than"),
    ],
)
def test_canonical_to_kafka_rejects(topic, fragment):
    with pytest.raises(InvalidName, match=fragment):
        canonical_to_kafka(topic)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="ab._-Z9", min_size=1, max_size=20))
def test_kafka_round_trip(name):
    if name in (".", ".."):
        return
    canonical = kafka_to_canonical(name)
    validate_topic(canonical)
    assert "." not in canonical
    assert canonical_to_kafka(canonical) == name


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="ab/_-Z9", min_size=1, max_size=20))
def test_canonical_round_trip(topic):
    if topic in ("/", "//"):
        return
    assert kafka_to_canonical(canonical_to_kafka(topic)) == topic


# --- AMQP -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("exchange", "rk", "etype", "topic"),
    [
        ("", "orders.eu", "direct", "orders/eu"),
        ("amq.topic", "a.b.c", "topic", "a/b/c"),
        ("amq.direct", "a.b", "direct", "a/b"),
        ("logs", "app.error", "topic", "logs/app/error"),
        ("logs", "app.error", "direct", "logs/app/error"),
        ("logs", "", "topic", "logs/"),
        ("bcast", "ignored.key", "fanout", "bcast"),
        ("amq.fanout", "whatever", "fanout", "amq.fanout"),
        ("amq.fanout", "whatever", "topic", "amq.fanout"),  # amq.fanout is always fanout
        ("ex.v1", "a", "topic", "ex.v1/a"),  # exchange names are one level, not mapped
        ("", "$SYS.x", "direct", "$SYS/x"),
    ],
)
def test_amqp_publish_topic(exchange, rk, etype, topic):
    assert amqp_publish_topic(exchange, rk, etype) == topic


def test_amqp_publish_topic_default_type():
    assert amqp_publish_topic("ex", "a.b") == "ex/a/b"


def test_amqp_publish_topic_rejects():
    with pytest.raises(InvalidTopic, match="empty"):
        amqp_publish_topic("", "")
    with pytest.raises(InvalidTopic, match="wildcard"):
        amqp_publish_topic("amq.topic", "a.#")
    with pytest.raises(InvalidName, match="'/'"):
        amqp_publish_topic("a/b", "c")
    with pytest.raises(InvalidName, match="'#'"):
        amqp_publish_topic("a#", "c", "fanout")


@pytest.mark.parametrize(
    ("exchange", "key", "etype", "filt"),
    [
        ("amq.topic", "a.*.c", "topic", "a/+/c"),
        ("amq.topic", "a.#", "topic", "a/#"),
        ("amq.topic", "#", "topic", "#"),
        ("amq.topic", "*", "topic", "+"),
        ("amq.topic", "a*.b", "topic", "a*/b"),  # '*' is only a wildcard as a whole word
        ("amq.direct", "a.b", "direct", "a/b"),
        ("amq.direct", "a.*", "direct", "a/*"),  # direct keys are literal
        ("logs", "app.*", "topic", "logs/app/+"),
        ("logs", "#", "topic", "logs/#"),
        ("logs", "", "topic", "logs/"),
        ("logs", "app.error", "direct", "logs/app/error"),
        ("bcast", "ignored", "fanout", "bcast"),
        ("amq.fanout", "", "fanout", "amq.fanout"),
    ],
)
def test_amqp_binding_filter(exchange, key, etype, filt):
    result = amqp_binding_filter(exchange, key, etype)
    assert result == filt
    validate_filter(result)


@pytest.mark.parametrize(
    ("exchange", "key", "etype", "exc", "fragment"),
    [
        ("", "q", "direct", InvalidName, "default exchange"),
        ("amq.topic", "#.error", "topic", InvalidFilter, "last word"),
        ("amq.topic", "a.#.b", "topic", InvalidFilter, "last word"),
        ("amq.topic", "a+b", "topic", InvalidFilter, "'\\+' or '#'"),
        ("amq.topic", "a#", "topic", InvalidFilter, "'\\+' or '#'"),
        ("amq.direct", "a.#", "direct", InvalidFilter, "'\\+' or '#'"),
        ("amq.topic", "", "topic", InvalidFilter, "empty"),
        ("x", "a", "headers", InvalidFilter, "not supported"),
        ("a/b", "a", "topic", InvalidName, "'/'"),
        ("a+", "", "fanout", InvalidName, "'\\+'"),
    ],
)
def test_amqp_binding_filter_rejects(exchange, key, etype, exc, fragment):
    with pytest.raises(exc, match=fragment):
        amqp_binding_filter(exchange, key, etype)


@pytest.mark.parametrize(
    ("exchange", "etype", "binding", "rk", "routed"),
    [
        ("amq.topic", "topic", "a.*", "a.b", True),
        ("amq.topic", "topic", "a.*", "a.b.c", False),
        ("amq.topic", "topic", "a.#", "a", True),
        ("amq.topic", "topic", "a.#", "a.b.c", True),
        ("logs", "topic", "*.error", "app.error", True),
        ("logs", "topic", "#", "", True),
        ("logs", "direct", "app.error", "app.error", True),
        ("logs", "direct", "app.error", "app.warn", False),
        ("bcast", "fanout", "", "anything.at.all", True),
    ],
)
def test_amqp_publish_and_binding_agree(exchange, etype, binding, rk, routed):
    filt = amqp_binding_filter(exchange, binding, etype)
    topic = amqp_publish_topic(exchange, rk, etype)
    assert matches(filt, topic) is routed


def test_amqp_queue_filter():
    assert amqp_queue_filter("orders.eu") == "orders/eu"
    assert amqp_queue_filter("amq.gen-Xy12") == "amq/gen-Xy12"
    # a default-exchange publish with the queue name reaches the queue's implicit binding
    assert matches(amqp_queue_filter("q.1"), amqp_publish_topic("", "q.1"))
    for bad in ("", "a#", "a.+", "a\x00"):
        with pytest.raises(InvalidName):
            amqp_queue_filter(bad)


# --- NameRegistry -------------------------------------------------------------------------------


def test_registry_register_and_idempotence():
    reg = NameRegistry()
    assert reg.register("a.b", "a/b") is True
    assert reg.register("a.b", "a/b") is False  # same original, same canonical: no-op
    assert "a/b" in reg
    assert "a.b" not in reg  # __contains__ is about canonical names
    assert reg.original_of("a/b") == "a.b"
    assert reg.canonical_of("a.b") == "a/b"
    assert len(reg) == 1


def test_registry_same_canonical_collides():
    reg = NameRegistry()
    reg.register("a.b", kafka_to_canonical("a.b"))
    with pytest.raises(NameCollision, match="'a/b' collides with existing name 'a.b'") as ei:
        reg.register("a/b", "a/b")  # e.g. an admin-created name with a different spelling
    assert ei.value.code == "name_collision"
    assert ei.value.details["existing"] == "a.b"
    assert reg.original_of("a/b") == "a.b"  # the failed register changed nothing
    assert len(reg) == 1


def test_registry_dot_underscore_collide_like_kafka():
    reg = NameRegistry()
    reg.register("a_b", kafka_to_canonical("a_b"))
    with pytest.raises(NameCollision, match="'.' versus '_'"):
        reg.register("a.b", kafka_to_canonical("a.b"))
    reg2 = NameRegistry()
    reg2.register("x.y_z", kafka_to_canonical("x.y_z"))
    with pytest.raises(NameCollision):
        reg2.check("x_y.z", kafka_to_canonical("x_y.z"))
    reg2.check("x.y-z", kafka_to_canonical("x.y-z"))  # '-' is not folded


def test_registry_kafka_collisions_can_be_disabled():
    reg = NameRegistry(kafka_collisions=False)
    reg.register("a_b", "a_b")
    reg.register("a.b", "a/b")
    assert len(reg) == 2
    with pytest.raises(NameCollision):
        reg.register("a/b", "a/b")


def test_registry_check_does_not_register():
    reg = NameRegistry()
    reg.check("a.b", "a/b")
    assert "a/b" not in reg and len(reg) == 0
    reg.register("a.b", "a/b")
    reg.check("a.b", "a/b")  # re-registering the same pair is fine
    with pytest.raises(NameCollision):
        reg.check("a_b", "a_b")


def test_registry_one_original_one_canonical():
    reg = NameRegistry()
    reg.register("n", "x")
    with pytest.raises(NameCollision, match="already registered"):
        reg.register("n", "y")


def test_registry_unregister_frees_name():
    reg = NameRegistry()
    reg.register("a.b", "a/b")
    assert reg.unregister("a.b") is True
    assert reg.unregister("a.b") is False
    assert "a/b" not in reg and len(reg) == 0
    reg.register("a_b", "a_b")  # no longer collides
    assert reg.original_of("a_b") == "a_b"
    assert reg.original_of("a/b") is None  # same collision key, different canonical
