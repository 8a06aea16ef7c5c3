"""The namespace policies `maxTopicsPerNamespace` and `maxSubscriptionsPerTopic`
(`GET|POST|DELETE /admin/v2/namespaces/{t}/{ns}/<name>`), kept in the namespace's record
under Pulsar's Policies names, so that they travel on `dwell.policies` to admission and
the tracker. The checks they feed are dwell.policy.limits'."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response

from dwell.auth.guard import requires
from dwell.core.authz import Operation
from dwell.core.policy import MAX_SUBSCRIPTIONS_FIELD, MAX_TOPICS_FIELD, namespace_limit
from dwell.http import ApiError, errors
from dwell.policy.requests import namespace_name
from dwell.policy.service import Service, json_response

router = APIRouter(tags=["namespaces"])

# Pulsar's path names and the namespace record's fields they set.
NAMESPACE_LIMITS = {"maxTopicsPerNamespace": MAX_TOPICS_FIELD,
                    "maxSubscriptionsPerTopic": MAX_SUBSCRIPTIONS_FIELD}

_INT_BODY = {"requestBody": {"required": True, "content": {"application/json": {
    "schema": {"type": "integer", "minimum": 0}}}}}


def _add_limit(path_name: str, field: str) -> None:
    path = "/admin/v2/namespaces/{tenant}/{namespace}/" + path_name

    async def get_limit(tenant: str, namespace: str, svc: Service) -> Response:
        fields = await svc.store.namespace_fields(namespace_name(tenant, namespace))
        return json_response(fields.get(field))

    async def set_limit(tenant: str, namespace: str, request: Request,
                        svc: Service) -> Response:
        ns = namespace_name(tenant, namespace)
        value: Any
        try:
            value = namespace_limit(orjson.loads(await request.body()), path_name)
        except orjson.JSONDecodeError as exc:
            raise ApiError(400, "body: is not valid JSON") from exc
        except TypeError as exc:
            raise ApiError(400, str(exc)) from exc
        except ValueError as exc:
            raise ApiError(412, str(exc)) from exc
        return await svc.commit("namespace_limit_set",
                                lambda: svc.store.set_namespace_field(ns, field, value))

    async def remove_limit(tenant: str, namespace: str, svc: Service) -> Response:
        ns = namespace_name(tenant, namespace)
        return await svc.commit("namespace_limit_remove",
                                lambda: svc.store.set_namespace_field(ns, field, None))

    router.get(path, name=f"get_{field}",
               dependencies=[requires(Operation.GET_NAMESPACE_POLICIES)],
               responses=errors(404, 412))(get_limit)
    router.post(path, status_code=204, name=f"set_{field}", openapi_extra=_INT_BODY,
                dependencies=[requires(Operation.SET_NAMESPACE_POLICIES)],
                responses=errors(400, 404, 412))(set_limit)
    router.delete(path, status_code=204, name=f"remove_{field}",
                  dependencies=[requires(Operation.SET_NAMESPACE_POLICIES)],
                  responses=errors(404, 412))(remove_limit)


for _path_name, _field in NAMESPACE_LIMITS.items():
    _add_limit(_path_name, _field)
