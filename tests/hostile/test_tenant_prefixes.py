"""Kafka ACL prefixes and tenant names: the prefixes a tenant's users are granted
(dwell_dev.kafka_acls) start none of another tenant's Kafka names and none of dwell's
own topics and groups, for every tenant the policy service lets be created; and the names
that would break this are refused by the policy service, with Pulsar's 412."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dwell.core.topics import (
    DOMAINS,
    InvalidTopicName,
    TopicName,
    dlq_topic,
    group_id,
    retry_topic,
    validate_new_tenant,
    validate_tenant,
)
from dwell.tracker.recovery import lowmark_group
from dwell_dev import kafka_acls
from dwell_dev.testkit import Service

# Pulsar's tenant alphabet, weighted towards the characters Kafka names escape.
TENANT = st.text(st.sampled_from("ab-_.:=0Z"), min_size=1, max_size=8)


def kafka_names(tenant: str) -> list[str]:
    """A tenant's Kafka names: ready, retry and DLQ topics of both domains, and their
    consumer groups."""
    out = []
    for domain in DOMAINS:
        t = TopicName.of(domain, tenant, "ns", "x")
        out += [t.kafka_topic, retry_topic(t, "s"), dlq_topic(t, "s"), group_id(t, "s")]
    return out


def dwell_names() -> list[str]:
    """dwell's own topics and groups, as the ACL table names them."""
    return ([*kafka_acls.DWELL_TOPICS, lowmark_group("dwell-tracker")]
            + [rule.name for rule in kafka_acls.component_rules() if rule.name != "*"])


def accepted(name: str) -> bool:
    try:
        validate_new_tenant(name)
    except InvalidTopicName:
        return False
    return True


@settings(max_examples=2000, deadline=None)
@given(TENANT, TENANT)
def test_no_new_tenants_prefix_starts_another_tenants_names(a: str, b: str) -> None:
    if a == b or not (accepted(a) and accepted(b)):
        return
    for prefix in kafka_acls.tenant_prefixes(a):
        assert not [n for n in kafka_names(b) if n.startswith(prefix)], (a, b, prefix)
        assert not [n for n in dwell_names() if n.startswith(prefix)], (a, prefix)
    # Its own names are all covered: the prefixes are what its users need.
    for name in kafka_names(a):
        assert any(name.startswith(p) for p in kafka_acls.tenant_prefixes(a)), name


@pytest.mark.parametrize(("tenant", "victim", "refused"), [
    ("a", "a.b", "a.b"), ("a", "a:b", "a:b"), ("a", "a=b", "a=b"),
    ("non-persistent", "a", "non-persistent"), ("dwell-tracker", None, "dwell-tracker")])
def test_the_names_refused_are_those_whose_prefixes_overlap(
        tenant: str, victim: str | None, refused: str) -> None:
    """Pulsar's tenant rule lets each pair through, and the first one's prefixes start
    the second's names (None: dwell's own); the new-tenant rule refuses one of them."""
    validate_tenant(tenant)
    theirs = dwell_names() if victim is None else kafka_names(validate_tenant(victim))
    assert [n for p in kafka_acls.tenant_prefixes(tenant) for n in theirs if n.startswith(p)]
    assert not accepted(refused)


@pytest.fixture(scope="module")
def policy_svc(services: Any, stack: Any) -> Iterator[Service]:
    svc = services.start("policy")
    yield svc
    svc.stop()


@pytest.mark.parametrize(("name", "words"), [
    ("a.b", "may only contain letters, digits, '_' and '-'"),
    ("a:b", "may only contain letters, digits, '_' and '-'"),
    ("non-persistent", "starts every tenant's non-persistent topics"),
    ("dwell-tracker", "dwell's own Kafka consumer groups"),
    ("dwell", "reserved")])
def test_the_policy_service_refuses_a_tenant_whose_prefix_overlaps(
        policy_svc: Service, unique: str, name: str, words: str) -> None:
    tenant = name.replace("a", unique, 1) if name.startswith("a") else name
    resp = httpx.put(f"{policy_svc.url}/admin/v2/tenants/{tenant}", timeout=10)
    assert resp.status_code == 412, resp.text
    assert resp.json()["reason"].startswith("Tenant name is not valid: "), resp.text
    assert words in resp.json()["reason"], resp.text
    # Nothing stored (`dwell` is no tenant name on any route: 412 there too).
    assert httpx.get(f"{policy_svc.url}/admin/v2/tenants/{tenant}",
                     timeout=10).status_code in (404, 412)
    ok = httpx.put(f"{policy_svc.url}/admin/v2/tenants/{unique}-b_c", timeout=10)
    assert ok.status_code == 204, ok.text
