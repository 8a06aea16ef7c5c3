"""Tenants: Pulsar's TenantInfo (`adminRoles`, `allowedClusters`)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from dwell.auth.guard import requires
from dwell.core.authz import Operation as Op
from dwell.http import errors
from dwell.policy.requests import TENANT_BODY, check_tenant_info, tenant_body, tenant_name
from dwell.policy.service import NO_CONTENT, Service, json_response

router = APIRouter(tags=["tenants"])
PATH = "/admin/v2/tenants/{tenant}"


@router.get("/admin/v2/tenants", dependencies=[requires(Op.LIST_TENANTS)])
async def list_tenants(svc: Service) -> list[str]:
    return await svc.store.list_tenants()


@router.put(PATH, status_code=NO_CONTENT, openapi_extra=TENANT_BODY,
            dependencies=[requires(Op.CREATE_TENANT)], responses=errors(409, 412))
async def create_tenant(tenant: str, request: Request, svc: Service) -> Response:
    name = tenant_name(tenant, new=True)
    info = check_tenant_info(await tenant_body(request), svc.settings.cluster)
    return await svc.commit("tenant_create", lambda: svc.store.create_tenant(name, info))


@router.post(PATH, status_code=NO_CONTENT, openapi_extra=TENANT_BODY,
             dependencies=[requires(Op.UPDATE_TENANT)], responses=errors(404, 412))
async def update_tenant(tenant: str, request: Request, svc: Service) -> Response:
    name = tenant_name(tenant)
    info = check_tenant_info(await tenant_body(request), svc.settings.cluster)
    return await svc.commit("tenant_update", lambda: svc.store.update_tenant(name, info))


@router.get(PATH, dependencies=[requires(Op.GET_TENANT)], responses=errors(404, 412))
async def get_tenant(tenant: str, svc: Service) -> Response:
    return json_response((await svc.store.get_tenant(tenant_name(tenant))).model_dump())


@router.delete(PATH, status_code=NO_CONTENT, dependencies=[requires(Op.DELETE_TENANT)],
               responses=errors(404, 409, 412))
async def delete_tenant(tenant: str, svc: Service) -> Response:
    name = tenant_name(tenant)
    return await svc.commit("tenant_delete", lambda: svc.store.delete_tenant(name))
