"""A topic's delayed-delivery policy: a local one and a global one (`isGlobal`), kept apart
as Pulsar keeps them; the topic runs with local over global, field by field."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from dwell.auth.guard import requires
from dwell.core.authz import Operation as Op
from dwell.core.policy import resolve_policy
from dwell.core.topics import TopicName
from dwell.http import ApiError, errors
from dwell.policy.requests import POLICY_BODY, policy_body, policy_topic, topic_not_found
from dwell.policy.service import NO_CONTENT, PolicyService, Service, json_response, own_policy

router = APIRouter(tags=["delayed delivery"])
PATH = "/admin/v2/persistent/{tenant}/{namespace}/{topic}/delayedDelivery"


async def _existing(svc: PolicyService, tenant: str, namespace: str, topic: str) -> TopicName:
    """The topic a policy names; as in Pulsar, it must exist (`topics create`, or a first
    publish that auto-created it) and must not be a partition."""
    name = policy_topic(tenant, namespace, topic)
    if await svc.catalog.partitions(name) == 0:
        raise ApiError(404, topic_not_found(name))
    return name


@router.get(PATH, dependencies=[requires(Op.GET_TOPIC_POLICIES)], responses=errors(404, 412))
async def get_topic_policy(tenant: str, namespace: str, topic: str, svc: Service,
                           applied: bool = False, isGlobal: bool = False) -> Response:
    name = await _existing(svc, tenant, namespace, topic)
    ns_policy, levels = await svc.store.topic_policies(name)
    if applied:
        # What the topic runs with, whichever level was asked for: Pulsar would answer
        # the asked level's own policy when it has one.
        return json_response(
            resolve_policy(svc.broker, ns_policy, levels.merged()).to_pulsar_json())
    return own_policy(levels.level(isGlobal))


@router.post(PATH, status_code=NO_CONTENT, openapi_extra=POLICY_BODY,
             dependencies=[requires(Op.SET_TOPIC_POLICIES)], responses=errors(404, 412))
async def set_topic_policy(tenant: str, namespace: str, topic: str, request: Request,
                           svc: Service, isGlobal: bool = False) -> Response:
    name = await _existing(svc, tenant, namespace, topic)
    policy = await policy_body(request, svc.settings.delayed_delivery_delay_limit_ms)
    return await svc.commit("topic_policy_set",
                            lambda: svc.store.set_topic_policy(name, policy, isGlobal))


@router.delete(PATH, status_code=NO_CONTENT, dependencies=[requires(Op.SET_TOPIC_POLICIES)],
               responses=errors(404, 412))
async def remove_topic_policy(tenant: str, namespace: str, topic: str, svc: Service,
                              isGlobal: bool = False) -> Response:
    name = await _existing(svc, tenant, namespace, topic)
    return await svc.commit("topic_policy_remove",
                            lambda: svc.store.remove_topic_policy(name, isGlobal))
