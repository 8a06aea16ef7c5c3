"""What the policy service reads from a request before it acts: tenant, namespace and
topic names (Pulsar's 412 for an invalid one), and the bodies of policy, tenant,
namespace and partition writes, each checked as Pulsar's admin REST API checks it."""

from __future__ import annotations

import orjson
import pydantic
from fastapi import Request
from pydantic import ConfigDict

from dwell.core.admit import over_delay_limit
from dwell.core.policy import DelayedDeliveryPolicies
from dwell.core.topics import (
    PERSISTENT,
    InvalidTopicName,
    TopicName,
    validate_namespace,
    validate_new_tenant,
    validate_tenant,
)
from dwell.http import ApiError, validation_reason
from dwell.policy.store import TenantInfo

POLICY_BODY = {"requestBody": {"required": True, "content": {"application/json": {
    "schema": DelayedDeliveryPolicies.model_json_schema()}}}}
TENANT_BODY = {"requestBody": {"required": False, "content": {"application/json": {
    "schema": TenantInfo.model_json_schema()}}}}


# An invalid name is Pulsar's 412 with Pulsar's text, followed by what is wrong with it.
INVALID = 412


def tenant_name(name: str, *, new: bool = False) -> str:
    """``name`` as a tenant name; ``new``: for a tenant being created
    (dwell.core.topics.validate_new_tenant)."""
    try:
        return (validate_new_tenant if new else validate_tenant)(name)
    except InvalidTopicName as exc:
        raise ApiError(INVALID, f"Tenant name is not valid: {exc}") from exc


def namespace_name(tenant: str, namespace: str) -> str:
    try:
        validate_namespace(tenant, namespace)
    except InvalidTopicName as exc:
        raise ApiError(INVALID, f"Namespace name is not valid: {exc}") from exc
    return f"{tenant}/{namespace}"


def topic_name(tenant: str, namespace: str, topic: str) -> TopicName:
    try:
        return TopicName.of(PERSISTENT, tenant, namespace, topic)
    except InvalidTopicName as exc:
        raise ApiError(INVALID, f"Topic name is not valid: {exc}") from exc


def policy_topic(tenant: str, namespace: str, topic: str) -> TopicName:
    name = topic_name(tenant, namespace, topic)
    if name.partition_index >= 0:
        raise ApiError(412, "Not allowed to set/get topic policy for a partition")
    return name


def topic_not_found(topic: TopicName) -> str:
    return f"Topic {topic} not found"


async def partitions_body(request: Request, at_least: int | None = 1) -> int:
    """The number of partitions: a JSON number, or Pulsar's PartitionedTopicMetadata;
    406 below ``at_least`` (None: any integer)."""
    try:
        body = orjson.loads(await request.body())
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, "body: is not valid JSON") from exc
    if isinstance(body, dict):
        body = body.get("partitions")
    if not isinstance(body, int) or isinstance(body, bool):
        raise ApiError(400, "body: must be the number of partitions (an integer)")
    if at_least is not None and body < at_least:
        raise ApiError(406, "Number of partitions should be more than 0")
    return body


# Pulsar's "all clusters" name, which allowedClusters may always hold.
GLOBAL_CLUSTER = "global"


def check_tenant_info(info: TenantInfo, cluster: str) -> TenantInfo:
    """Pulsar's checks of a TenantInfo (TenantsBase.validateClustersAsync and
    validateAdminRoleAsync), except that an empty allowedClusters is accepted: dwell has
    one cluster, which every tenant may use."""
    if any(not c.strip() for c in info.allowedClusters):
        raise ApiError(412, "Clusters cannot be empty or blank")
    if any(c not in (cluster, GLOBAL_CLUSTER) for c in info.allowedClusters):
        raise ApiError(412, "Clusters do not exist")
    if any(role.strip() != role for role in info.adminRoles):
        raise ApiError(412, "AdminRoles contains whitespace in the beginning or end.")
    return info


class _PolicyBody(DelayedDeliveryPolicies):
    """A policy body as Pulsar's Jackson reads it: unknown fields are ignored, so that a
    newer client's extra fields do not break every set. The values stay strictly checked
    ("5000", 5.5, true, negatives, tickTime 0 and overflow are 400s, where Pulsar would
    coerce or store them)."""

    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)


def parse_policy(raw: str | bytes) -> DelayedDeliveryPolicies:
    return DelayedDeliveryPolicies.model_validate(
        _PolicyBody.model_validate_json(raw).model_dump(exclude_none=True))


async def policy_body(request: Request, delay_limit_ms: int) -> DelayedDeliveryPolicies:
    # Parsed here rather than by FastAPI so that strictness holds: "5000", 5.5 and true
    # are refused for the millisecond fields instead of being coerced.
    try:
        policy = parse_policy(await request.body())
    except pydantic.ValidationError as exc:
        raise ApiError(400, validation_reason(exc)) from exc
    reason = over_delay_limit(policy, delay_limit_ms)
    if reason is not None:
        raise ApiError(400, reason)
    return policy


async def tenant_body(request: Request) -> TenantInfo:
    raw = await request.body()
    if not raw.strip():
        return TenantInfo()
    try:
        return TenantInfo.model_validate_json(raw)
    except pydantic.ValidationError as exc:
        raise ApiError(400, validation_reason(exc)) from exc


async def namespace_body(request: Request,
                         delay_limit_ms: int) -> DelayedDeliveryPolicies | None:
    """Pulsar's Policies object, optional. Only `delayed_delivery_policies` means anything
    to dwell; Pulsar's other policy fields are accepted and ignored so that Pulsar's own
    admin clients can create namespaces."""
    raw = await request.body()
    if not raw.strip():
        return None
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, "body: is not valid JSON") from exc
    if not isinstance(body, dict):
        raise ApiError(400, "body: must be a JSON object")
    policy = body.get("delayed_delivery_policies")
    if policy is None:
        return None
    try:
        parsed = parse_policy(orjson.dumps(policy))
    except pydantic.ValidationError as exc:
        raise ApiError(400, "delayed_delivery_policies." + validation_reason(exc)) from exc
    reason = over_delay_limit(parsed, delay_limit_ms)
    if reason is not None:
        raise ApiError(400, "delayed_delivery_policies." + reason)
    return parsed
