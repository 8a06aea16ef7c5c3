"""Clusters: dwell is one cluster, named by the `cluster` setting."""

from __future__ import annotations

from fastapi import APIRouter

from dwell.auth.guard import requires
from dwell.core.authz import Operation as Op
from dwell.policy.service import Service

router = APIRouter(tags=["clusters"])


@router.get("/admin/v2/clusters", dependencies=[requires(Op.LIST_CLUSTERS)])
async def list_clusters(svc: Service) -> list[str]:
    return [svc.settings.cluster]


@router.get("/admin/v2/brokers/configuration/runtime",
            dependencies=[requires(Op.GET_RUNTIME_CONFIGURATION)])
async def runtime_configuration(svc: Service) -> dict[str, str]:
    """`pulsar-admin clusters list` reads clusterName here to mark the current cluster.
    Values are strings, as Pulsar sends them; only the settings dwell has are listed."""
    broker = svc.broker
    return {
        "clusterName": svc.settings.cluster,
        "delayedDeliveryEnabled": str(broker.enabled).lower(),
        "delayedDeliveryTickTimeMillis": str(broker.tick_time_ms),
        "delayedDeliveryMaxDelayInMillis": str(broker.max_delay_ms),
        "isDelayedDeliveryDeliverAtTimeStrict": str(broker.strict).lower(),
        "delayedDeliveryFixedDelayDetectionLookahead":
            str(broker.fixed_delay_detection_lookahead),
    }
