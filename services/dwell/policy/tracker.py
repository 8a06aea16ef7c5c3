"""The policy service's calls to the tracker (`DWELL_TRACKER_URL`), which holds the delay
index and the subscription registry: a topic's stats (Pulsar's delayed-delivery fields and
its registered subscriptions), and removing a registered subscription, as a forced
`topics delete` does. Each call carries the caller's `Authorization` header: the tracker
checks the token as well."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import httpx
import orjson

from dwell.core.topics import TopicName
from dwell.http import ApiError


def _path(name: TopicName) -> str:
    return "/".join(quote(part, safe="") for part in (name.tenant, name.namespace, name.local))


def _unavailable(what: str, answer: httpx.Response) -> ApiError:
    return ApiError(503, f"tracker answered {answer.status_code} to {what}: "
                         f"{answer.text[:200]}")


class Tracker:
    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    async def _call(self, method: str, path: str, authorization: str | None) -> httpx.Response:
        try:
            return await self.client.request(
                method, path, headers={"authorization": authorization} if authorization else None)
        except httpx.HTTPError as exc:
            raise ApiError(503, f"tracker unavailable: {exc}") from exc

    async def stats(self, name: TopicName, authorization: str | None) -> dict[str, Any]:
        """The tracker's delayed-delivery fields of Pulsar's TopicStats for `name`."""
        answer = await self._call("GET", f"/admin/v2/persistent/{_path(name)}/stats",
                                  authorization)
        if answer.status_code == 404:
            # The topic exists but nothing of it is indexed and no subscription is known.
            return {"delayedMessageIndexSizeInBytes": 0, "subscriptions": {}}
        if answer.status_code != 200:
            raise _unavailable(f"the stats of {name}", answer)
        stats: dict[str, Any] = orjson.loads(answer.content)
        return stats

    async def unsubscribe(self, name: TopicName, sub: str, authorization: str | None) -> None:
        """Remove a registered subscription (and its pending redeliveries); one already gone
        is fine."""
        answer = await self._call(
            "DELETE", f"/v1/topics/{name.domain}/{_path(name)}/subscriptions/"
                      f"{quote(sub, safe='')}", authorization)
        if answer.status_code not in (204, 404):
            raise _unavailable(f"removing subscription {sub} of {name}", answer)
