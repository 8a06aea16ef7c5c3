"""The policy store's pure helpers: scopes, their Redis keys, and TenantInfo."""

from __future__ import annotations

import orjson
import pydantic
import pytest

from dwell import keys
from dwell.core.topics import TopicName
from dwell.policy.store import (
    TenantInfo,
    _tail,
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
