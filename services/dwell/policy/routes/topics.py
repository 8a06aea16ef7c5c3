"""Topics: Kafka ready topics (dwell.policy.topics). Listing, creating (a topic, or a
partitioned one), growing a partitioned topic, its partitioned metadata, and deleting."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from dwell.auth.guard import requires
from dwell.core.authz import Operation as Op
from dwell.core.topics import NON_PERSISTENT, PARTITION_SUFFIX, PERSISTENT, TopicName
from dwell.http import ApiError, errors
from dwell.index.subscriptions import names_of as subscription_names
from dwell.policy import limits
from dwell.policy.requests import namespace_name, partitions_body, topic_name, topic_not_found
from dwell.policy.service import NO_CONTENT, PolicyService, Service, json_response

router = APIRouter(tags=["topics"])
PATH = "/admin/v2/persistent/{tenant}/{namespace}/{topic}"
PARTITIONS = PATH + "/partitions"
PARTITION_IN_NAME = "Partitioned Topic Name should not contain '-partition-'"


def _add_listings(domain: str) -> None:
    """A domain's two lists of a namespace's topics: `topics list` (non-partitioned topics
    and the partitions of the others) and `topics list-partitioned-topics`; 404 when the
    namespace does not exist."""
    base = f"/admin/v2/{domain}/{{tenant}}/{{namespace}}"
    prefix = "" if domain == PERSISTENT else "non_persistent_"

    async def listing(tenant: str, namespace: str, svc: Service) -> list[str]:
        ns = namespace_name(tenant, namespace)
        await svc.store.namespace_policy(ns)
        return await svc.catalog.listing(domain, ns)

    async def partitioned(tenant: str, namespace: str, svc: Service) -> list[str]:
        ns = namespace_name(tenant, namespace)
        await svc.store.namespace_policy(ns)
        return await svc.catalog.partitioned(domain, ns)

    for path, route, name in ((base, listing, f"list_{prefix}topics"),
                              (base + "/partitioned", partitioned,
                               f"list_{prefix}partitioned_topics")):
        router.get(path, name=name, dependencies=[requires(Op.GET_TOPICS)],
                   responses=errors(404, 412))(route)


for _domain in (PERSISTENT, NON_PERSISTENT):
    _add_listings(_domain)


@router.put(PATH, status_code=NO_CONTENT, dependencies=[requires(Op.CREATE_TOPIC)],
            responses=errors(404, 409, 412))
async def create_topic(tenant: str, namespace: str, topic: str, svc: Service) -> Response:
    name = topic_name(tenant, namespace, topic)
    await svc.store.namespace_policy(name.namespace_name)
    index = name.partition_index
    if index >= 0:
        # Pulsar creates a partition only of a partitioned topic that has it; here
        # every partition of an existing partitioned topic exists with it.
        parent = name.partitioned_topic
        count, partitioned = await svc.catalog.layout(parent)
        suffix = f"Can't create topic {name} with \"{PARTITION_SUFFIX}\" followed by"
        if not partitioned:
            raise ApiError(412, f"{suffix} numeric value if there isn't a partitioned "
                                f"topic {parent.local} created.")
        if index >= count:
            raise ApiError(412, f"{suffix} a number smaller than number of partition of "
                                f"partitioned topic {parent.local}")
        raise ApiError(409, "This topic already exists")
    return await _create(svc, name, 1)


@router.put(PARTITIONS, status_code=NO_CONTENT, dependencies=[requires(Op.CREATE_TOPIC)],
            responses=errors(404, 406, 409, 412))
async def create_partitioned_topic(tenant: str, namespace: str, topic: str, request: Request,
                                   svc: Service) -> Response:
    name = topic_name(tenant, namespace, topic)
    partitions = await partitions_body(request)
    if PARTITION_SUFFIX in name.local:
        raise ApiError(412, PARTITION_IN_NAME)
    await svc.store.namespace_policy(name.namespace_name)
    return await _create(svc, name, partitions, partitioned=True)


@router.post(PARTITIONS, status_code=NO_CONTENT, dependencies=[requires(Op.SET_TOPIC_POLICIES)],
             responses=errors(409, 412, 422))
async def update_partitioned_topic(tenant: str, namespace: str, topic: str, request: Request,
                                   svc: Service, force: bool = False,
                                   updateLocalTopicOnly: bool = False) -> Response:
    """Pulsar's `topics update-partitioned-topic`: grow a partitioned topic's ready topic
    to N Kafka partitions (PersistentTopicsBase.internalUpdatePartitionedTopic). `force`
    and `updateLocalTopicOnly` change nothing here: a partition is a Kafka partition, so
    no stray partition topic can exist, and there is one cluster."""
    name = topic_name(tenant, namespace, topic)
    if name.partition_index >= 0:
        raise ApiError(412, PARTITION_IN_NAME)
    total = await partitions_body(request, at_least=None)
    async with svc.creating(name.namespace_name):
        count, partitioned = await svc.catalog.layout(name)
        if not partitioned:
            raise ApiError(409, f"Topic {name} is not the partitioned topic.")
        if total < count:
            raise ApiError(422, f"Desired partitions {total} can't be less than the "
                                f"current partitions {count}.")
        await limits.check_growth(svc.store, svc.catalog, svc.settings.broker_limits(), name,
                                  count, total)
        if total > count:
            await svc.catalog.grow(name, count, total)
    return Response(status_code=NO_CONTENT)


async def _create(svc: PolicyService, name: TopicName, partitions: int,
                  partitioned: bool = False) -> Response:
    """Create the topic's ready topic. Whether one Kafka partition is a partitioned
    topic's is in the topic's record, written first: a create cut short leaves a mark
    on no topic, which the next create of the name sets right."""
    store, catalog = svc.store, svc.catalog
    if await catalog.partitions(name):
        raise ApiError(409, "This topic already exists")
    async with svc.creating(name.namespace_name):
        await limits.check_create(store, catalog, svc.settings.broker_limits(), name,
                                  partitions)
        one = partitioned and partitions == 1
        if (await store.topic_policies(name))[1].partitioned != one:
            await svc.commit("topic_partitioned", lambda: store.mark_partitioned(name, one))
        if not await catalog.create(name, partitions):
            raise ApiError(409, "This topic already exists")
    return Response(status_code=NO_CONTENT)


@router.get(PARTITIONS, dependencies=[requires(Op.LOOKUP)], responses=errors(412))
async def get_partitioned_metadata(tenant: str, namespace: str, topic: str,
                                   svc: Service) -> Response:
    count, partitioned = await svc.catalog.layout(topic_name(tenant, namespace, topic))
    return json_response({"partitions": count if partitioned else 0})


async def _delete(svc: PolicyService, name: TopicName, partitioned: bool, force: bool,
                  request: Request) -> Response:
    """Pulsar's two deletes, each refusing the other's kind of topic with 409
    (PersistentTopics.deleteTopic and deletePartitionedTopic), and, unless `force`, a
    topic that has subscriptions with 412: those in the tracker's subscription
    registry (on the topic or, partitioned, on a partition) and the Kafka consumer
    groups reading its ready topic. A forced delete removes the registered ones first,
    through the tracker (its registry's log keeps them otherwise)."""
    store, catalog = svc.store, svc.catalog
    count, is_partitioned = await catalog.layout(name)
    if count and is_partitioned != partitioned:
        raise ApiError(409, f"{name} is a partitioned topic, instead of calling delete "
                            "topic, please call delete-partitioned-topic." if is_partitioned
                       else f"{name} is a non-partitioned topic. Instead of calling "
                            "delete-partitioned-topic please call delete.")
    not_found = ApiError(404, f"{topic_not_found(name)}." if partitioned
                         else topic_not_found(name))
    if count == 0:
        raise not_found
    authorization = request.headers.get("authorization")
    topics = [name, *(name.partition(i) for i in range(count))] if partitioned else [name]
    registered = {t: found for t in topics
                  if (found := await subscription_names(store.redis, str(t)))}
    if not force:
        subs = sorted({s for found in registered.values() for s in found}
                      | await catalog.consumer_groups(name))
        if subs:
            raise ApiError(412, "Topic has active producers/subscriptions" if partitioned
                           else f"Topic has subscriptions: [{', '.join(subs)}]")
    for t, found in registered.items():
        for sub in found:
            await svc.tracker.unsubscribe(t, sub, authorization)
    if not await catalog.delete(name):
        raise not_found
    return await svc.commit("topic_policy_remove", lambda: store.drop_topic_policies(name))


@router.delete(PATH, status_code=NO_CONTENT, dependencies=[requires(Op.DELETE_TOPIC)],
               responses=errors(404, 409, 412))
async def delete_topic(tenant: str, namespace: str, topic: str, request: Request,
                       svc: Service, force: bool = False) -> Response:
    """`force`: delete it with its subscriptions (Pulsar's `topics delete -f`)."""
    return await _delete(svc, topic_name(tenant, namespace, topic), False, force, request)


@router.delete(PARTITIONS, status_code=NO_CONTENT, dependencies=[requires(Op.DELETE_TOPIC)],
               responses=errors(404, 409, 412))
async def delete_partitioned_topic(tenant: str, namespace: str, topic: str, request: Request,
                                   svc: Service, force: bool = False) -> Response:
    """`force`: delete it with its subscriptions (`delete-partitioned-topic -f`)."""
    name = topic_name(tenant, namespace, topic)
    if name.partition_index >= 0:
        raise ApiError(412, PARTITION_IN_NAME)
    return await _delete(svc, name, True, force, request)
