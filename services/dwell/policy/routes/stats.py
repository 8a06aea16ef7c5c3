"""Pulsar's topic stats on the policy service's port, where `pulsar-admin topics stats` and
`topics partitioned-stats` look for them: the delayed-delivery fields, answered from the
tracker (`DWELL_TRACKER_URL`), which holds the index."""

from __future__ import annotations

from typing import Any, Final

from fastapi import APIRouter, Request
from fastapi.responses import Response

from dwell.auth.guard import requires
from dwell.core.authz import Operation
from dwell.core.topics import TopicName
from dwell.http import ApiError, errors
from dwell.policy.requests import topic_name
from dwell.policy.service import PolicyService, Service, json_response

router = APIRouter(tags=["topics"])
PATH = "/admin/v2/persistent/{tenant}/{namespace}/{topic}"


# What Pulsar 4.0's PersistentTopic.asyncGetStats answers for these fields on a broker
# with no backlog quota (backlogQuotaDefaultLimitBytes and backlogQuotaDefaultLimitSecond
# -1), deduplication off and no backlog age known; `ownerBroker`, the broker's id
# (host:port), is the address the request came to.
NO_QUOTA: Final = -1
NO_BACKLOG_AGE: Final = -1
DEDUPLICATION_STATUS: Final = "Disabled"


def broker_fields(request: Request) -> dict[str, Any]:
    return {"backlogQuotaLimitSize": NO_QUOTA, "backlogQuotaLimitTime": NO_QUOTA,
            "oldestBacklogMessageAgeSeconds": NO_BACKLOG_AGE,
            "deduplicationStatus": DEDUPLICATION_STATUS, "ownerBroker": request.url.netloc}


async def _stats(svc: PolicyService, name: TopicName, request: Request) -> dict[str, Any]:
    """The topic's stats: the delayed-delivery fields from the tracker, and the broker's
    (`broker_fields`)."""
    return {**broker_fields(request),
            **await svc.tracker.stats(name, request.headers.get("authorization"))}


@router.get(PATH + "/stats", dependencies=[requires(Operation.GET_STATS)],
            responses=errors(404, 412))
async def get_topic_stats(tenant: str, namespace: str, topic: str, request: Request,
                          svc: Service) -> Response:
    """The delayed-delivery fields of Pulsar's TopicStats, from the tracker."""
    name = topic_name(tenant, namespace, topic)
    parent, index = name.partitioned_topic, name.partition_index
    count, partitioned = await svc.catalog.layout(parent)
    if not (count and not partitioned and index < 0 or partitioned and 0 <= index < count):
        raise ApiError(404, f"Topic {name} not found")
    return json_response(await _stats(svc, name, request))


@router.get(PATH + "/partitioned-stats", dependencies=[requires(Operation.GET_STATS)],
            responses=errors(404, 412))
async def get_partitioned_stats(tenant: str, namespace: str, topic: str, request: Request,
                                svc: Service, perPartition: bool = True) -> Response:
    """Pulsar's PartitionedTopicStats: the topic's figures with its partition count, and
    with `perPartition` each partition's own. dwell indexes a partitioned topic's
    delayed messages under the topic, not per partition, so the figures are the
    topic's and each partition reports none of its own."""
    name = topic_name(tenant, namespace, topic)
    count, partitioned = await svc.catalog.layout(name)
    if name.partition_index >= 0 or not partitioned:
        raise ApiError(404, f"Partitioned Topic {name} not found")
    # Pulsar sums the partitions' stats into a fresh object (TopicStatsImpl.add), which
    # takes their quota limits, keeps the larger backlog age (its own 0 against the
    # partitions' -1) and no broker or deduplication status.
    own = await svc.tracker.stats(name, request.headers.get("authorization"))
    stats = {**own, "backlogQuotaLimitSize": NO_QUOTA, "backlogQuotaLimitTime": NO_QUOTA,
             "oldestBacklogMessageAgeSeconds": max(0, NO_BACKLOG_AGE),
             "metadata": {"partitions": count, "deleted": False}, "partitions": {}}
    if perPartition:
        stats["partitions"] = {str(part): await _stats(svc, part, request) for part in
                               (name.partition(i) for i in range(count))}
    return json_response(stats)
