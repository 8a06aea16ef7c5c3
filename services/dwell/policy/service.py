"""What every policy route works with, one per app (`app.state.policy`): the store, the
change feed and its guard, the topic catalog, the tracker, the settings; and `commit`,
the one way a route writes. A route takes it as the dependency `Service`."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Annotated, Any

import orjson
from fastapi import Depends, Request
from fastapi.responses import Response

from dwell.core.policy import BrokerDefaults, DelayedDeliveryPolicies
from dwell.core.topics import POLICIES
from dwell.http import ApiError
from dwell.policy.feed import FeedUnavailable, PolicyFeed
from dwell.policy.limits import CreateLocks
from dwell.policy.metrics import CHANGES, VERSION
from dwell.policy.rebuild import StoreGuard
from dwell.policy.settings import PolicySettings
from dwell.policy.store import Change, PolicyStore
from dwell.policy.topics import TopicCatalog
from dwell.policy.tracker import Tracker

log = logging.getLogger("dwell.policy.app")

NO_CONTENT = 204

Write = Callable[[], Awaitable[list[Change]]]


def json_response(value: Any) -> Response:
    return Response(orjson.dumps(value), media_type="application/json")


def own_policy(policy: DelayedDeliveryPolicies | None) -> Response:
    """A level's own policy as set (its unset fields left out), or `null`."""
    return json_response(policy.model_dump(exclude_none=True) if policy is not None else None)


@dataclass
class PolicyService:
    settings: PolicySettings
    store: PolicyStore
    feed: PolicyFeed
    guard: StoreGuard
    catalog: TopicCatalog
    tracker: Tracker
    # Topics of a namespace are counted and created under one of these (in this process).
    creating: CreateLocks = field(default_factory=CreateLocks)

    @cached_property
    def broker(self) -> BrokerDefaults:
        return self.settings.broker_defaults()

    async def commit(self, kind: str, *writes: Write) -> Response:
        """Run the call's store writes in order, each one's changes published before the
        next runs, so that Redis losing data between two of them loses none the call made;
        204."""
        changed = False
        for write in writes:
            changed |= bool(await self._publish(write))
        if changed:
            CHANGES.labels(kind).inc()
        return Response(status_code=NO_CONTENT)

    async def _publish(self, write: Write) -> list[Change]:
        """Make one write and put its changes on the feed. A change the feed does not carry
        afterwards was lost by Redis between the write and its publishing (publish sends
        what the store holds): the write is made again, once, on the rebuilt store."""
        for _ in range(2):
            changes = await self.guard.write(write)
            for scope, _ in changes:
                try:
                    await self.feed.publish(scope)
                except FeedUnavailable as exc:
                    raise ApiError(503, "the change is saved, but the change feed (Kafka) did "
                                        f"not acknowledge it: {exc}; it is published once "
                                        "Kafka is back") from exc
            if all(self.feed.carried(scope) >= version for scope, version in changes):
                if changes:
                    VERSION.set(max(version for _, version in changes))
                return changes
            log.warning("Redis lost a change before it reached %s: making it again",
                        POLICIES)
        raise ApiError(503, "Redis lost the change twice before it reached the change feed "
                            f"({POLICIES}); try again", {"Retry-After": "1"})


def policy_service(request: Request) -> PolicyService:
    service: PolicyService = request.app.state.policy
    return service


Service = Annotated[PolicyService, Depends(policy_service)]
