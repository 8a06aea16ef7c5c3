"""Namespace permissions, Pulsar's REST API: `GET .../namespaces/{t}/{ns}/permissions`
(role -> actions), `POST .../permissions/{role}` with the actions as a JSON list (the
role's set is replaced), `DELETE .../permissions/{role}`. They are kept in the namespace's
record as Pulsar keeps them in its policies (`auth_policies.namespace_auth`), so they are
on `dwell.policies` like every policy and admission checks `produce` from its replay."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response

from dwell.auth.guard import Guard
from dwell.core.authz import AuthAction, Operation, parse_actions
from dwell.http import ApiError, errors
from dwell.policy.store import Change, PolicyStore

Commit = Callable[..., Awaitable[Response]]

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


def add_routes(app: FastAPI, store: PolicyStore, guard: Guard, commit: Commit,
               namespace_name: Callable[[str, str], str]) -> None:
    base = "/admin/v2/namespaces/{tenant}/{namespace}/permissions"

    @app.get(base, tags=["permissions"],
             dependencies=[guard.require(Operation.GET_PERMISSION)],
             responses=errors(404, 412))
    async def get_permissions(tenant: str, namespace: str) -> Response:
        perms = await store.permissions(namespace_name(tenant, namespace))
        return Response(orjson.dumps(perms), media_type="application/json")

    @app.post(base + "/{role}", status_code=204, tags=["permissions"],
              openapi_extra=_ACTIONS_BODY,
              dependencies=[guard.require(Operation.GRANT_PERMISSION)],
              responses=errors(404, 412))
    async def grant_permission(tenant: str, namespace: str, role: str,
                               request: Request) -> Response:
        ns = namespace_name(tenant, namespace)
        actions = await _actions(request)

        async def write() -> list[Change]:
            return await store.set_permission(ns, role, actions)

        return await commit("permission_grant", write)

    @app.delete(base + "/{role}", status_code=204, tags=["permissions"],
                dependencies=[guard.require(Operation.REVOKE_PERMISSION)],
                responses=errors(404, 412))
    async def revoke_permission(tenant: str, namespace: str, role: str) -> Response:
        ns = namespace_name(tenant, namespace)

        async def write() -> list[Change]:
            return await store.set_permission(ns, role, None)

        return await commit("permission_revoke", write)
