"""Namespace permissions, Pulsar's REST API: `GET .../namespaces/{t}/{ns}/permissions`
(role -> actions), `POST .../permissions/{role}` with the actions as a JSON list (the
role's set is replaced), `DELETE .../permissions/{role}`. They are kept in the namespace's
record as Pulsar keeps them in its policies (`auth_policies.namespace_auth`), so they are
on `dwell.policies` like every policy and admission checks `produce` from its replay."""

from __future__ import annotations

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response

from dwell.auth.guard import requires
from dwell.core.authz import AuthAction, Operation, parse_actions
from dwell.http import ApiError, errors
from dwell.policy.requests import namespace_name
from dwell.policy.service import Service, json_response

router = APIRouter(tags=["permissions"])
PATH = "/admin/v2/namespaces/{tenant}/{namespace}/permissions"

_ACTIONS_BODY = {"requestBody": {"required": True, "content": {"application/json": {
    "schema": {"type": "array", "uniqueItems": True,
               "items": {"type": "string", "enum": [a.value for a in AuthAction]}}}}}}


async def _actions(request: Request) -> frozenset[AuthAction]:
    try:
        body = orjson.loads(await request.body())
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, "body: is not valid JSON") from exc
    try:
        return parse_actions(body)
    except ValueError as exc:
        raise ApiError(400, str(exc)) from exc


@router.get(PATH, dependencies=[requires(Operation.GET_PERMISSION)],
            responses=errors(404, 412))
async def get_permissions(tenant: str, namespace: str, svc: Service) -> Response:
    return json_response(await svc.store.permissions(namespace_name(tenant, namespace)))


@router.post(PATH + "/{role}", status_code=204, openapi_extra=_ACTIONS_BODY,
             dependencies=[requires(Operation.GRANT_PERMISSION)], responses=errors(404, 412))
async def grant_permission(tenant: str, namespace: str, role: str, request: Request,
                           svc: Service) -> Response:
    ns = namespace_name(tenant, namespace)
    actions = await _actions(request)
    return await svc.commit("permission_grant",
                            lambda: svc.store.set_permission(ns, role, actions))


@router.delete(PATH + "/{role}", status_code=204,
               dependencies=[requires(Operation.REVOKE_PERMISSION)], responses=errors(404, 412))
async def revoke_permission(tenant: str, namespace: str, role: str, svc: Service) -> Response:
    ns = namespace_name(tenant, namespace)
    return await svc.commit("permission_revoke",
                            lambda: svc.store.set_permission(ns, role, None))
