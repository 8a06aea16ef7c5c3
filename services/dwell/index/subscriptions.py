"""The subscription registry: each subscription's redelivery settings
(dwell.core.subscriptions.SubscriptionSettings), stored as their JSON in
`dwell:subs:{topic}`. Deleting a subscription deletes its redelivery index too."""

from __future__ import annotations

import json

import redis as redislib
from redis.asyncio import Redis as AsyncRedis

from dwell import keys
from dwell.core.subscriptions import SubscriptionSettings
from dwell.index.redelivery import SubscriptionIndex


def put(r: redislib.Redis, topic: str, sub: str, settings: SubscriptionSettings) -> None:
    r.hset(keys.subscriptions(topic), sub, json.dumps(settings.to_json(), sort_keys=True))


def get(r: redislib.Redis, topic: str, sub: str) -> SubscriptionSettings | None:
    raw = r.hget(keys.subscriptions(topic), sub)
    return SubscriptionSettings.from_json(json.loads(raw)) if raw is not None else None


def names(r: redislib.Redis, topic: str) -> list[str]:
    """The topic's registered subscriptions."""
    return [k.decode() for k in r.hkeys(keys.subscriptions(topic))]


async def names_of(r: AsyncRedis, topic: str) -> list[str]:
    """`names`, on an asyncio client (the policy service's)."""
    return sorted(k.decode() for k in await r.hkeys(keys.subscriptions(topic)))


def delete(r: redislib.Redis, topic: str, sub: str) -> bool:
    """Remove the subscription and its redelivery index; False when it did not exist."""
    existed = bool(r.hdel(keys.subscriptions(topic), sub))
    SubscriptionIndex(r, topic, sub).drop()
    return existed
