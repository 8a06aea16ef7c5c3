"""The policy store's pure helpers: scopes, their Redis keys, and TenantInfo."""

from __future__ import annotations

import orjson
import pydantic
import pytest

from dwell import keys
from dwell.core.policy import DelayedDeliveryPolicies
from dwell.core.topics import TopicName
from dwell.policy.store import (
    TenantInfo,
    TopicPolicies,
    _tail,
    _topic_record,
    namespace_policy_scope,
    namespace_scope,
    scope_key,
    tenant_scope,
    topic_scope,
)


def test_scopes_match_internals_doc_and_map_to_their_keys() -> None:
    topic = TopicName.parse("persistent://t/ns/x")
    assert tenant_scope("t") == "tenant:t"
    assert namespace_scope("t/ns") == "namespace:t/ns"
    assert namespace_policy_scope("t/ns") == "ns:t/ns"
    assert topic_scope(topic) == "topic:persistent://t/ns/x"
    assert scope_key("tenant:t") == keys.tenant("t")
    assert scope_key("namespace:t/ns") == keys.namespace("t/ns")
    assert scope_key("ns:t/ns") == keys.namespace_policy("t/ns")
    assert scope_key("topic:persistent://t/ns/x") == keys.topic_policy("persistent://t/ns/x")
    for bad in ("x:y", "tenant:", "nothing"):
        with pytest.raises(ValueError):
            scope_key(bad)


def test_tail_completes_the_record_json() -> None:
    # Lua writes '{"version":N' and then the tail.
    record = '{"version":7' + _tail("ns:t/ns", policy={"maxDeliveryDelayInMillis": 2**63 - 1})
    assert orjson.loads(record) == {"version": 7, "scope": "ns:t/ns",
                                    "policy": {"maxDeliveryDelayInMillis": 2**63 - 1}}
    assert orjson.loads('{"version":1' + _tail("namespace:t/ns")) == {
        "version": 1, "scope": "namespace:t/ns"}


def test_tenant_info_is_strict() -> None:
    assert TenantInfo.model_validate_json("{}") == TenantInfo(adminRoles=[], allowedClusters=[])
    for bad in ('{"adminRoles": "a"}', '{"other": []}', '{"allowedClusters": [1]}'):
        with pytest.raises(pydantic.ValidationError):
            TenantInfo.model_validate_json(bad)


def test_a_topic_record_keeps_its_levels_and_its_partitioned_mark_apart() -> None:
    local = DelayedDeliveryPolicies(tickTime=5)
    marked = TopicPolicies(partitioned=True)
    assert not marked.empty and TopicPolicies().empty
    both = marked.with_level(False, local)
    assert both.partitioned and both.local == local
    fields = both.record_fields()
    assert fields["partitioned"] is True and fields["local"] == {"tickTime": 5}
    record = orjson.dumps({"version": 3, "scope": "topic:persistent://t/ns/x", **fields})
    assert _topic_record(record) == (3, both)
    # Removing the last policy keeps the record while the mark is there.
    assert not both.with_level(False, None).empty
    assert both.model_copy(update={"partitioned": False}).with_level(False, None).empty
    assert "partitioned" not in TopicPolicies(local=local).record_fields()
