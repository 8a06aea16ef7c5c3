"""Pulsar's quotas on the policy service: the namespace policies `maxTopicsPerNamespace`
and `maxSubscriptionsPerTopic` (`GET|POST|DELETE /admin/v2/namespaces/{t}/{ns}/<name>`,
kept in the namespace's record under Pulsar's Policies names, so that they travel on
`dwell.policies` to admission and the tracker), and the checks made when a topic is
created: `maxNumPartitionsPerPartitionedTopic` (406) and the namespace's topic count
(412), with Pulsar's texts (dwell.core.policy)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Final

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response

from dwell.auth.guard import Guard
from dwell.core.authz import Operation
from dwell.core.policy import (
    MAX_SUBSCRIPTIONS_FIELD,
    MAX_TOPICS_FIELD,
    PARTITIONS_OVER_MAX,
    TOPICS_OVER_MAX,
    BrokerLimits,
    applied_limit,
    namespace_limit,
    over_limit,
)
from dwell.core.topics import TopicName
from dwell.http import ApiError, errors
from dwell.policy.store import Change, PolicyStore
from dwell.policy.topics import TopicCatalog

Commit = Callable[..., Awaitable[Response]]

# Pulsar's path names and the namespace record's fields they set.
NAMESPACE_LIMITS = {"maxTopicsPerNamespace": MAX_TOPICS_FIELD,
                    "maxSubscriptionsPerTopic": MAX_SUBSCRIPTIONS_FIELD}

_INT_BODY = {"requestBody": {"required": True, "content": {"application/json": {
    "schema": {"type": "integer", "minimum": 0}}}}}


class CreateLocks:
    """The locks under which a namespace's topics are counted and created, so that
    concurrent creates in this process cannot each see room for one more (a fixed set of
    stripes, whatever the number of namespaces)."""

    STRIPES: Final = 64

    def __init__(self) -> None:
        self._locks = [asyncio.Lock() for _ in range(self.STRIPES)]

    def __call__(self, namespace: str) -> asyncio.Lock:
        return self._locks[hash(namespace) % self.STRIPES]


async def check_create(store: PolicyStore, catalog: TopicCatalog, broker: BrokerLimits,
                       topic: TopicName, partitions: int) -> None:
    """Refuse creating `topic` with `partitions` partitions beyond the quotas. A
    partitioned topic's partitions each count as a topic, as in Pulsar."""
    if over_limit(broker.max_partitions_per_topic, 0, partitions):
        raise ApiError(406, PARTITIONS_OVER_MAX.format(max=broker.max_partitions_per_topic))
    own = (await store.namespace_fields(topic.namespace_name)).get(MAX_TOPICS_FIELD)
    limit = applied_limit(own, broker.max_topics_per_namespace)
    if limit and over_limit(limit, len(await catalog.listing(topic.domain,
                                                              topic.namespace_name)),
                            partitions):
        raise ApiError(412, TOPICS_OVER_MAX)


async def check_growth(store: PolicyStore, catalog: TopicCatalog, broker: BrokerLimits,
                       topic: TopicName, current: int, total: int) -> None:
    """Refuse growing the partitioned `topic` from `current` to `total` partitions beyond
    the quotas: Pulsar's 422 past `maxNumPartitionsPerPartitionedTopic`, and, as at
    creation, the namespace's topic count for the partitions added (412). Pulsar does not
    count them there; in dwell each one is a Kafka partition, which the quota bounds."""
    if over_limit(broker.max_partitions_per_topic, 0, total):
        raise ApiError(422, f"Desired partitions {total} can't be greater than the maximum "
                            f"partitions per topic {broker.max_partitions_per_topic}.")
    own = (await store.namespace_fields(topic.namespace_name)).get(MAX_TOPICS_FIELD)
    limit = applied_limit(own, broker.max_topics_per_namespace)
    if limit and over_limit(limit, len(await catalog.listing(topic.domain,
                                                              topic.namespace_name)),
                            total - current):
        raise ApiError(412, TOPICS_OVER_MAX)


def add_routes(app: FastAPI, store: PolicyStore, guard: Guard, commit: Commit,
               namespace_name: Callable[[str, str], str]) -> None:
    for path_name, field in NAMESPACE_LIMITS.items():
        _add_limit(app, store, guard, commit, namespace_name, path_name, field)


def _add_limit(app: FastAPI, store: PolicyStore, guard: Guard, commit: Commit,
               namespace_name: Callable[[str, str], str], path_name: str, field: str) -> None:
    path = "/admin/v2/namespaces/{tenant}/{namespace}/" + path_name

    async def get_limit(tenant: str, namespace: str) -> Response:
        value = (await store.namespace_fields(namespace_name(tenant, namespace))).get(field)
        return Response(orjson.dumps(value), media_type="application/json")

    async def set_limit(tenant: str, namespace: str, request: Request) -> Response:
        ns = namespace_name(tenant, namespace)
        try:
            value = namespace_limit(orjson.loads(await request.body()), path_name)
        except orjson.JSONDecodeError as exc:
            raise ApiError(400, "body: is not valid JSON") from exc
        except TypeError as exc:
            raise ApiError(400, str(exc)) from exc
        except ValueError as exc:
            raise ApiError(412, str(exc)) from exc

        async def write() -> list[Change]:
            return await store.set_namespace_field(ns, field, value)

        return await commit("namespace_limit_set", write)

    async def remove_limit(tenant: str, namespace: str) -> Response:
        ns = namespace_name(tenant, namespace)

        async def write() -> list[Change]:
            return await store.set_namespace_field(ns, field, None)

        return await commit("namespace_limit_remove", write)

    app.get(path, tags=["namespaces"], name=f"get_{field}",
            dependencies=[guard.require(Operation.GET_NAMESPACE_POLICIES)],
            responses=errors(404, 412))(get_limit)
    app.post(path, status_code=204, tags=["namespaces"], name=f"set_{field}",
             openapi_extra=_INT_BODY,
             dependencies=[guard.require(Operation.SET_NAMESPACE_POLICIES)],
             responses=errors(400, 404, 412))(set_limit)
    app.delete(path, status_code=204, tags=["namespaces"], name=f"remove_{field}",
               dependencies=[guard.require(Operation.SET_NAMESPACE_POLICIES)],
               responses=errors(404, 412))(remove_limit)
