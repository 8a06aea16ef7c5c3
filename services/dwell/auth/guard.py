"""The one FastAPI dependency every protected route of policy, admission and tracker
declares: `Authorization: Bearer <token>` → role (401 when missing, expired or not
signed by the configured key), then `dwell.core.authz.allowed` on the route's tenant and
namespace (403). With authentication off it lets everything through, as before.

The role is checked before anything is looked up for the request, and the grants of a
tenant or namespace that does not exist are empty: a 403 never tells whether another
tenant's objects exist. `/healthz` and `/readyz` declare no guard; `/metrics` is guarded
by `check_metrics` when Pulsar's `authenticateMetricsEndpoint` is on."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Final

from fastapi import Depends, Request
from fastapi.params import Depends as DependsParam

from dwell.auth.keys import kafka_token_key, verification_key
from dwell.auth.tokens import (
    DelegatedTokenVerifier,
    InvalidToken,
    KafkaTokenVerifier,
    TokenVerifier,
)
from dwell.core.authz import NEEDS, NO_GRANTS, Grants, Need, Operation, allowed
from dwell.http import ApiError
from dwell.settings import CommonSettings

# (tenant, namespace or None) -> what the service knows of them; empty when unknown.
GrantsLookup = Callable[[str, str | None], Awaitable[Grants]]
# Waits until the grants reflect every change acknowledged so far; False if it could not.
CatchUp = Callable[[], Awaitable[bool]]
# The same, for callers outside the event loop (admission's Kafka ingress).
GrantsSync = Callable[[str, str | None], Grants]

CHALLENGE: Final = {"WWW-Authenticate": "Bearer"}
_BEARER: Final = "bearer "


async def _no_grants(_tenant: str, _namespace: str | None) -> Grants:
    return NO_GRANTS


def unauthenticated(reason: str) -> ApiError:
    return ApiError(401, f"Authentication required: {reason}", CHALLENGE)


def _bearer(authorization: str | None) -> str:
    """The token of an `Authorization: Bearer <token>` header; ApiError 401 otherwise."""
    if not authorization:
        raise unauthenticated("no Authorization header (Authorization: Bearer <token>)")
    if authorization[:len(_BEARER)].lower() != _BEARER:
        raise unauthenticated("the Authorization header is not a Bearer token")
    return authorization[len(_BEARER):].strip()


class Guard:
    """Authentication and authorization of one service, from its settings."""

    def __init__(self, settings: CommonSettings, grants: GrantsLookup = _no_grants,
                 catch_up: CatchUp | None = None) -> None:
        self.authentication = settings.authentication_enabled
        self.authorization = settings.authorization_enabled
        self.super_users = settings.super_users()
        self.metrics_authenticated = (settings.authenticate_metrics_endpoint
                                      and settings.authentication_enabled)
        self.metrics_roles = settings.metrics_role_set()
        self.grants = grants
        # Read your writes, for a service whose grants come from a replay of the feed: a
        # refusal first waits until the replay has caught up with the feed (the policy
        # service answers a grant once the feed has it), then asks once more.
        self.catch_up = catch_up
        self.verifier = (TokenVerifier(verification_key(
            settings.token_secret_key.get_secret_value(), settings.token_public_key))
            if self.authentication else None)
        # Read at start so that a service without a Kafka token key refuses to start.
        self.kafka_key = (kafka_token_key(settings.kafka_token_secret_key.get_secret_value(),
                                          settings.token_secret_key.get_secret_value(),
                                          settings.token_public_key)
                          if self.authentication else None)
        self.kafka_verifier = (KafkaTokenVerifier(self.kafka_key)
                               if self.kafka_key is not None else None)
        self.delegated_verifier = (DelegatedTokenVerifier(self.kafka_key)
                                   if self.kafka_key is not None else None)

    def role(self, authorization: str | None) -> str:
        """The role an `Authorization` header authenticates; ApiError 401 otherwise."""
        return self.identity(authorization)[0]

    def identity(self, authorization: str | None) -> tuple[str, float | None]:
        """(the role an `Authorization` header authenticates, its token's expiry in s or
        None); ApiError 401 otherwise."""
        assert self.verifier is not None
        try:
            return self.verifier.identity(_bearer(authorization))
        except InvalidToken as exc:
            raise unauthenticated(str(exc)) from None

    def delegated_role(self, authorization: str | None) -> str:
        """The role of a delegated token (dwell.auth.tokens) in an `Authorization`
        header; ApiError 401 otherwise."""
        assert self.delegated_verifier is not None
        try:
            return self.delegated_verifier.role(_bearer(authorization))
        except InvalidToken as exc:
            raise unauthenticated(str(exc)) from None

    async def check(self, authorization: str | None, operation: Operation,
                    tenant: str | None = None, namespace: str | None = None, *,
                    delegated: bool = False) -> str | None:
        """The caller's role (None with authentication off) when it may do `operation`
        on `tenant` / `namespace`; ApiError 401 or 403 otherwise. With ``delegated``, a
        delegated token admission signed authenticates too."""
        if not self.authentication:
            return None
        try:
            role = self.role(authorization)
        except ApiError as refused:
            if not delegated:
                raise
            try:
                role = self.delegated_role(authorization)
            except ApiError:
                raise refused from None
        if not self.authorization:
            return role
        need = NEEDS[operation]
        if role in self.super_users or need is Need.AUTHENTICATED:
            return role
        grants = NO_GRANTS
        if need is not Need.SUPER_USER and tenant is not None:
            grants = await self.grants(tenant, namespace)
        if allowed(role, operation, self.super_users, grants):
            return role
        if self.catch_up is not None and tenant is not None and await self.catch_up():
            grants = await self.grants(tenant, namespace)
            if allowed(role, operation, self.super_users, grants):
                return role
        raise forbidden(role, operation, tenant, namespace)

    def kafka_role(self, token: str | None, record_ms: int) -> str:
        """The role of ``token`` (from a record's `dwell-authorization` header), which must
        be a Kafka token valid at ``record_ms``, the record's broker-assigned timestamp;
        ApiError 401 otherwise. Only with authentication on."""
        assert self.kafka_verifier is not None
        if not token:
            raise unauthenticated("no dwell-authorization header (Bearer <Kafka token>, "
                                  "from POST /admin/v2/kafka-tokens)")
        try:
            return self.kafka_verifier.role_at(token, record_ms)
        except InvalidToken as exc:
            raise unauthenticated(str(exc)) from None

    def check_kafka_sync(self, token: str | None, record_ms: int, operation: Operation,
                         tenant: str, namespace: str | None,
                         grants: GrantsSync | None) -> str | None:
        """`check` for a record read from Kafka, in a thread outside the event loop with a
        synchronous grants lookup (`kafka_role`, then the role's grants)."""
        if not self.authentication:
            return None
        return self.authorize_sync(self.kafka_role(token, record_ms), operation, tenant,
                                   namespace, grants)

    def authorize_sync(self, role: str, operation: Operation, tenant: str,
                        namespace: str | None, grants: GrantsSync | None,
                        catch_up: Callable[[], bool] | None = None) -> str:
        """The role when it may do `operation`; ApiError 403 otherwise. A refusal first
        calls `catch_up` (whether the grants' replay caught up with the feed just now) and,
        when it did, asks once more: read your writes, as in `check`."""
        if not self.authorization:
            return role
        for last in (False, True):
            found = grants(tenant, namespace) if grants is not None else NO_GRANTS
            if allowed(role, operation, self.super_users, found):
                return role
            if last or catch_up is None or not catch_up():
                break
        raise forbidden(role, operation, tenant, namespace)

    def check_metrics(self, authorization: str | None) -> None:
        """Pulsar's `authenticateMetricsEndpoint`: when on (with authentication), /metrics
        needs a valid token (401), and with authorization on, one of a super-user or of
        `metricsRoles` (403), since the metrics name every tenant's topics."""
        if not self.metrics_authenticated:
            return
        role = self.role(authorization)
        if self.authorization and role not in self.super_users | self.metrics_roles:
            raise ApiError(403, f"Unauthorized: role {role!r} may not read the metrics "
                                "(a super-user or one of DWELL_METRICS_ROLES may)")

    def require(self, operation: Operation, *, delegated: bool = False) -> DependsParam:
        """The route dependency for `operation`; the tenant and namespace are the route's
        `tenant` / `namespace` path parameters. ``delegated``: see `check`."""

        async def guard(request: Request) -> None:
            params = request.path_params
            await self.check(request.headers.get("authorization"), operation,
                             params.get("tenant"), params.get("namespace"),
                             delegated=delegated)

        guard.operation = operation  # type: ignore[attr-defined]  # read by the authz matrix
        return Depends(guard)


def requires(operation: Operation) -> DependsParam:
    """`Guard.require` for routes declared on an `APIRouter`, before the app and its
    guard exist: the guard is the app's `state.guard`."""

    async def guard(request: Request) -> None:
        params = request.path_params
        await request.app.state.guard.check(request.headers.get("authorization"), operation,
                                            params.get("tenant"), params.get("namespace"))

    guard.operation = operation  # type: ignore[attr-defined]  # read by the authz matrix
    return Depends(guard)


def forbidden(role: str, operation: Operation, tenant: str | None,
              namespace: str | None) -> ApiError:
    where = (f" on {tenant}/{namespace}" if namespace else f" on tenant {tenant}"
             if tenant else "")
    return ApiError(403, f"Unauthorized: role {role!r} may not {operation.value}{where}")


def operation_of(dependency: object) -> Operation | None:
    """The operation a route's dependency guards (None for a dependency that is not a
    guard)."""
    call = getattr(dependency, "dependency", dependency)
    op = getattr(call, "operation", None)
    return op if isinstance(op, Operation) else None
