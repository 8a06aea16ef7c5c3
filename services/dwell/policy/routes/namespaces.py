"""Namespaces, and a namespace's delayed-delivery policy."""

from __future__ import annotations

from functools import partial

from fastapi import APIRouter, Request
from fastapi.responses import Response

from dwell.auth.guard import requires
from dwell.core.authz import Operation as Op
from dwell.core.policy import pulsar_policies, resolve_policy
from dwell.core.topics import NON_PERSISTENT, PERSISTENT, TopicName
from dwell.http import ApiError, errors
from dwell.policy.requests import (
    POLICY_BODY,
    namespace_body,
    namespace_name,
    policy_body,
    tenant_name,
)
from dwell.policy.service import NO_CONTENT, Service, json_response, own_policy
from dwell.policy.store import NAMESPACE_NOT_EMPTY

router = APIRouter()
PATH = "/admin/v2/namespaces/{tenant}/{namespace}"
POLICY_PATH = PATH + "/delayedDelivery"


@router.get("/admin/v2/namespaces/{tenant}", tags=["namespaces"],
            dependencies=[requires(Op.LIST_NAMESPACES)], responses=errors(404, 412))
async def list_namespaces(tenant: str, svc: Service) -> list[str]:
    return await svc.store.list_namespaces(tenant_name(tenant))


@router.put(PATH, status_code=NO_CONTENT, tags=["namespaces"],
            dependencies=[requires(Op.CREATE_NAMESPACE)], responses=errors(404, 409, 412))
async def create_namespace(tenant: str, namespace: str, request: Request,
                           svc: Service) -> Response:
    ns = namespace_name(tenant, namespace)
    policy = await namespace_body(request, svc.settings.delayed_delivery_delay_limit_ms)
    store = svc.store
    if policy is None:
        return await svc.commit("namespace_create", lambda: store.create_namespace(ns))
    return await svc.commit("namespace_create", lambda: store.create_namespace(ns),
                            lambda: store.set_namespace_policy(ns, policy))


@router.get(PATH, tags=["namespaces"],
            dependencies=[requires(Op.GET_NAMESPACE_POLICIES)], responses=errors(404, 412))
async def get_namespace(tenant: str, namespace: str, svc: Service) -> Response:
    """Pulsar's Policies of the namespace (`pulsar-admin namespaces policies`)."""
    ns = namespace_name(tenant, namespace)
    record = await svc.store.namespace_fields(ns)
    ns_policy = await svc.store.namespace_policy(ns)
    return json_response(pulsar_policies(
        record, ns_policy.model_dump(exclude_none=True) if ns_policy is not None else None,
        svc.settings.cluster))


@router.delete(PATH, status_code=NO_CONTENT, tags=["namespaces"],
               dependencies=[requires(Op.DELETE_NAMESPACE)], responses=errors(404, 409, 412))
async def delete_namespace(tenant: str, namespace: str, svc: Service) -> Response:
    ns = namespace_name(tenant, namespace)
    for domain in (PERSISTENT, NON_PERSISTENT):
        if await svc.catalog.in_namespace(domain, ns):
            raise ApiError(409, NAMESPACE_NOT_EMPTY)
    # With no topic left, a topic record left is of a topic gone from Kafka by other
    # means, or a partitioned create cut short: it goes with the namespace.
    store = svc.store
    stale = [TopicName.parse(name) for name in await store.recorded_topics(ns)]
    return await svc.commit("namespace_delete",
                            *[partial(store.drop_topic_policies, t) for t in stale],
                            lambda: store.delete_namespace(ns))


@router.get(POLICY_PATH, tags=["delayed delivery"],
            dependencies=[requires(Op.GET_NAMESPACE_POLICIES)], responses=errors(404, 412))
async def get_namespace_policy(tenant: str, namespace: str, svc: Service,
                               applied: bool = False, isGlobal: bool = False) -> Response:
    ns_policy = await svc.store.namespace_policy(namespace_name(tenant, namespace))
    if applied:
        return json_response(resolve_policy(svc.broker, ns_policy, None).to_pulsar_json())
    return own_policy(ns_policy)


@router.post(POLICY_PATH, status_code=NO_CONTENT, tags=["delayed delivery"],
             openapi_extra=POLICY_BODY,
             dependencies=[requires(Op.SET_NAMESPACE_POLICIES)], responses=errors(404, 412))
async def set_namespace_policy(tenant: str, namespace: str, request: Request,
                               svc: Service) -> Response:
    ns = namespace_name(tenant, namespace)
    policy = await policy_body(request, svc.settings.delayed_delivery_delay_limit_ms)
    return await svc.commit("namespace_policy_set",
                            lambda: svc.store.set_namespace_policy(ns, policy))


@router.delete(POLICY_PATH, status_code=NO_CONTENT, tags=["delayed delivery"],
               dependencies=[requires(Op.SET_NAMESPACE_POLICIES)], responses=errors(404, 412))
async def remove_namespace_policy(tenant: str, namespace: str, svc: Service) -> Response:
    ns = namespace_name(tenant, namespace)
    return await svc.commit("namespace_policy_remove",
                            lambda: svc.store.remove_namespace_policy(ns))
