import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from dwell.core import topics
from dwell.core.topics import (
    InvalidTopicName,
    TopicName,
    dlq_topic,
    escape_kafka_part,
    retry_topic,
    validate_namespace,
    validate_subscription,
    validate_tenant,
)

# --- parsing ---------------------------------------------------------------------------


def test_parse_persistent() -> None:
    t = TopicName.parse("persistent://acme/orders/created")
    assert t == TopicName("persistent", "acme", "orders", "created")
    assert t.persistent
    assert str(t) == "persistent://acme/orders/created"
    assert t.namespace_name == "acme/orders"


def test_parse_non_persistent() -> None:
    t = TopicName.parse("non-persistent://acme/orders/created")
    assert not t.persistent
    assert t.kafka_topic == "non-persistent.acme.orders.created"


def test_of_validates_like_parse() -> None:
    assert TopicName.of("persistent", "a", "b", "c") == TopicName.parse("persistent://a/b/c")
    with pytest.raises(InvalidTopicName, match="domain"):
        TopicName.of("durable", "a", "b", "c")


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("acme/orders/created", "must start with"),
        ("kafka://acme/orders/created", "domain"),
        ("persistent://acme/orders", "exactly three parts"),
        ("persistent://acme/orders/created/extra", "exactly three parts"),
        ("persistent://acme//created", "namespace name must not be empty"),
        ("persistent:///orders/created", "tenant name must not be empty"),
        ("persistent://acme/orders/", "topic name must not be empty"),
        ("persistent://acme/orders/has space", "whitespace"),
        ("persistent://acme/orders/tab\there", "whitespace"),
        ("persistent://acme/orders/a{b", "'{'"),
        ("persistent://acme/orders/a}b", "'}'"),
        ("persistent://acme/orders/bell\x07", "control character U\\+0007"),
        ("persistent://ac me/orders/x", "whitespace"),
        ("persistent://acme/ord*rs/x", "may only contain"),
        ("persistent://acm€/orders/x", "may only contain"),
        ("persistent://dwell/orders/x", "reserved"),
        ("persistent://acme/orders/" + "x" * 240, "Kafka allows at most 249"),
    ],
)
def test_parse_rejects(name: str, fragment: str) -> None:
    with pytest.raises(InvalidTopicName, match=fragment):
        TopicName.parse(name)


def test_invalid_topic_name_is_value_error() -> None:
    assert issubclass(InvalidTopicName, ValueError)


@pytest.mark.parametrize("tenant", ["acme", "a-b", "a_b", "a=b", "a:b", "a.b", "A9"])
def test_validate_tenant_accepts_pulsar_charset(tenant: str) -> None:
    assert validate_tenant(tenant) == tenant


@pytest.mark.parametrize("tenant", ["", "a b", "a/b", "a*b", "é", "dwell"])
def test_validate_tenant_rejects(tenant: str) -> None:
    with pytest.raises(InvalidTopicName):
        validate_tenant(tenant)


def test_validate_namespace() -> None:
    assert validate_namespace("acme", "orders") == "orders"
    with pytest.raises(InvalidTopicName, match="reserved"):
        validate_namespace("dwell", "orders")
    with pytest.raises(InvalidTopicName, match="namespace"):
        validate_namespace("acme", "a b")


# --- Kafka mapping ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pulsar", "kafka"),
    [
        ("persistent://acme/orders/created", "acme.orders.created"),
        ("persistent://a-b/c_d/E-9", "a-b.c_d.E-9"),
        ("persistent://a.b/c/d", "a..2eb.c.d"),
        ("persistent://a/.b/c", "a...2eb.c"),
        ("persistent://a:b/c=d/e%f", "a..3ab.c..3dd.e..25f"),
        ("persistent://a/b/é", "a.b...c3..a9"),
        ("non-persistent://a/b/c", "non-persistent.a.b.c"),
        ("persistent://non-persistent/b/c", "non-persistent.b.c"),
    ],
)
def test_kafka_mapping_table(pulsar: str, kafka: str) -> None:
    t = TopicName.parse(pulsar)
    assert t.kafka_topic == kafka
    assert TopicName.from_kafka(kafka) == t


@pytest.mark.parametrize(
    ("kafka", "fragment"),
    [
        ("a.b", "not a dwell ready topic"),
        ("a.b.c.d", "not a dwell ready topic"),
        ("a..b.c", "empty part"),
        ("a.b.c.", "empty part"),
        (".a.b.c", "empty part"),
        ("a.b.c..2E", "canonical"),
        ("a.b.c..61", "canonical"),
        ("a.b.c..ff", "not UTF-8"),
        ("a.b.c d", "never writes"),
        ("dwell.publish.results", "reserved"),
        (topics.ACKS, "not a dwell ready topic"),
    ],
)
def test_from_kafka_rejects(kafka: str, fragment: str) -> None:
    with pytest.raises(InvalidTopicName, match=fragment):
        TopicName.from_kafka(kafka)


def test_own_topics_are_not_ready_topics() -> None:
    for name in (topics.POLICIES, topics.PUBLISH, topics.PUBLISH_RESULTS, topics.DELAYED,
                 topics.REFILED):
        with pytest.raises(InvalidTopicName):
            TopicName.from_kafka(name)


_tenant_chars = st.sampled_from("abcXYZ019_-=:.")
_names = st.text(_tenant_chars, min_size=1, max_size=12).filter(lambda s: s != "dwell")
_local_chars = st.characters(
    blacklist_categories=("Cc", "Cf", "Cs", "Zs", "Zl", "Zp"),
    blacklist_characters="{}/\x1c\x1d\x1e\x1f\x85",
)
_locals = st.text(_local_chars, min_size=1, max_size=12).filter(
    lambda s: not any(c.isspace() for c in s)
)


def make(domain: str, tenant: str, ns: str, local: str) -> TopicName:
    """Build a topic, discarding examples whose Kafka form is over Kafka's length limit."""
    try:
        return TopicName.of(domain, tenant, ns, local)
    except InvalidTopicName as exc:
        assert "Kafka allows at most 249" in str(exc)
        assume(False)
        raise


@given(st.sampled_from(["persistent", "non-persistent"]), _names, _names, _locals)
def test_kafka_mapping_round_trips(domain: str, tenant: str, ns: str, local: str) -> None:
    t = make(domain, tenant, ns, local)
    kafka = t.kafka_topic
    assert len(kafka) <= 249
    assert set(kafka) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
    assert TopicName.from_kafka(kafka) == t
    assert TopicName.parse(str(t)) == t


@given(_names, _names, _locals, _names, _names, _locals)
def test_kafka_mapping_is_injective(t1: str, n1: str, l1: str, t2: str, n2: str, l2: str) -> None:
    a = make("persistent", t1, n1, l1)
    b = make("persistent", t2, n2, l2)
    assert (a.kafka_topic == b.kafka_topic) == (a == b)


@given(st.text(min_size=1, max_size=30))
def test_escape_is_kafka_safe(part: str) -> None:
    try:
        escaped = escape_kafka_part(part)
    except UnicodeEncodeError:  # lone surrogates; names containing them are refused earlier
        return
    assert set(escaped) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


# --- subscriptions, retry and DLQ topics -----------------------------------------------


def test_retry_and_dlq_names() -> None:
    t = TopicName.parse("persistent://acme/orders/created")
    assert retry_topic(t, "billing") == "acme.orders.created-billing-RETRY"
    assert dlq_topic(t, "billing") == "acme.orders.created-billing-DLQ"
    assert retry_topic(t, "a.b:c") == "acme.orders.created-a..2eb..3ac-RETRY"


@pytest.mark.parametrize(
    ("sub", "fragment"),
    [
        ("", "empty"),
        ("a b", "whitespace"),
        ("a\nb", "whitespace"),
        ("a\x00b", "control"),
        ("x" * 201, "limit is 200"),
    ],
)
def test_validate_subscription_rejects(sub: str, fragment: str) -> None:
    with pytest.raises(InvalidTopicName, match=fragment):
        validate_subscription(sub)


def test_validate_subscription_accepts() -> None:
    assert validate_subscription("x" * 200) == "x" * 200
    assert validate_subscription("my-sub.v2:é") == "my-sub.v2:é"


def test_retry_topic_too_long_for_kafka() -> None:
    t = TopicName.parse("persistent://acme/orders/" + "x" * 200)
    with pytest.raises(InvalidTopicName, match="249"):
        retry_topic(t, "s" * 60)


def test_dwell_topic_constants() -> None:
    assert (
        topics.POLICIES,
        topics.PUBLISH,
        topics.PUBLISH_RESULTS,
        topics.DELAYED,
        topics.ACKS,
    ) == (
        "dwell.policies",
        "dwell.publish",
        "dwell.publish.results",
        "dwell.delayed",
        "dwell.acks",
    )


@pytest.mark.parametrize(("local", "index", "parent"), [
    ("x-partition-0", 0, "x"), ("x-partition-12", 12, "x"), ("a-partition-b-partition-3", 3,
                                                              "a-partition-b"),
    ("x", -1, "x"), ("x-partition-", -1, "x-partition-"), ("-partition-1", -1, "-partition-1"),
    ("x-partition-1a", -1, "x-partition-1a"), ("x-partition-٣", -1, "x-partition-٣"),
])
def test_partition_names(local: str, index: int, parent: str) -> None:
    topic = TopicName.of("persistent", "t", "ns", local)
    assert topic.partition_index == index
    assert topic.partitioned_topic == TopicName.of("persistent", "t", "ns", parent)
    if index >= 0:
        assert topic.partitioned_topic.partition(index) == topic


def test_group_ids_are_unique_per_topic_and_start_with_the_ready_topic() -> None:
    """Two tenants' same-named subscriptions shared the group named after the subscription."""
    from dwell.core.topics import GROUP_SEPARATOR, group_id

    a = TopicName.parse("persistent://a/b_c/d")
    b = TopicName.parse("persistent://a_b/c/d")
    assert group_id(a, "billing") == "a.b_c.d/billing"
    assert group_id(b, "billing") == "a_b.c.d/billing"
    assert group_id(a, "x/y").partition(GROUP_SEPARATOR) == ("a.b_c.d", "/", "x/y")
    for topic in (a, b, TopicName.parse("persistent://t/ns/with.dot")):
        assert GROUP_SEPARATOR not in topic.kafka_topic


def test_a_group_stands_for_its_subscription() -> None:
    """An SDK consumer's group is named for its subscription; a plain consumer's group is
    its subscription; another topic's SDK group is a group like any other."""
    from dwell.core.topics import group_id, subscription_of_group

    a = TopicName.parse("persistent://t/ns/x")
    other = TopicName.parse("persistent://t/ns/xy")
    assert subscription_of_group(a, group_id(a, "billing")) == "billing"
    assert subscription_of_group(a, group_id(a, "x/y")) == "x/y"
    assert subscription_of_group(a, "plain-group") == "plain-group"
    assert subscription_of_group(a, group_id(other, "s")) == "t.ns.xy/s"
