"""`POST /admin/v2/kafka-tokens`: a Kafka token for the caller's own role, to put in the
`dwell-authorization` header of requests on `dwell.publish` and events on `dwell.acks`
instead of the long-lived token (dwell.auth.tokens says why). Answers
`{"token": "<jwt>", "expiresAtMs": <ms>}`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from dwell.auth.guard import Guard, requires
from dwell.auth.tokens import create_kafka_token
from dwell.core.authz import Operation
from dwell.http import ApiError, errors
from dwell.policy.service import Service

router = APIRouter(tags=["kafka tokens"])


@router.post("/admin/v2/kafka-tokens", dependencies=[requires(Operation.CREATE_KAFKA_TOKEN)],
             responses=errors(404))
async def create_kafka_token_route(request: Request, svc: Service) -> dict[str, Any]:
    """A token for the caller's role with audience `dwell-kafka`, valid for
    DWELL_KAFKA_TOKEN_TTL_MS, or until the caller's own token expires if that is
    sooner. It is refused over HTTP; on Kafka it is accepted on records the broker
    wrote before it expired."""
    guard: Guard = request.app.state.guard
    if guard.kafka_key is None:
        raise ApiError(404, "authentication is disabled: requests on Kafka need no token")
    role, not_after = guard.identity(request.headers.get("authorization"))
    token, expires_at_ms = create_kafka_token(guard.kafka_key, role,
                                              svc.settings.kafka_token_ttl_ms,
                                              not_after=not_after)
    return {"token": token, "expiresAtMs": expires_at_ms}
