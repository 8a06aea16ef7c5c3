"""The backoff's writes outlast a Redis that stops answering: the pass tries a partition's
batch again while Redis is down (here a redis-server of the test's own, killed with
SIGKILL and started again on its port from its dump, with the applied marker in it),
and gives up once backoff_write_timeout_ms has passed, so that the query fails and the
app's restart replays the batch."""

from __future__ import annotations

import threading
import time
from typing import Any

import orjson
import pytest
import redis as redislib

from dwell import keys
from dwell.adapters import redis as redis_adapter
from dwell.index.redelivery import SubscriptionIndex
from dwell_dev.testkit import OwnRedis
from dwell_spark.backoff import Pass
from dwell_spark.settings import SparkSettings

TICK_MS = 100


def work(port: int, timeout_s: float) -> Pass:
    return Pass.of(SparkSettings(redis_url=f"redis://127.0.0.1:{port}/0",
                                 kafka_bootstrap="127.0.0.1:1", redelivery_tick_ms=TICK_MS,
                                 backoff_write_timeout_ms=int(timeout_s * 1000)))


def delivered(due_in_ms: int) -> tuple[dict[str, list[Any]], int]:
    """One partition's batch of one `delivered` event with an ack timeout, and its due
    time."""
    now = int(time.time() * 1000)
    ev = {"event": "delivered", "topic": "persistent://t/ns/x", "subscription": "s",
          "messageId": "dwell.delayed:0:7", "ts": now, "ackTimeoutMs": due_in_ms}
    return {"partition": [0], "offset": [0], "ts": [now], "tsType": [1], "key": [None],
            "value": [orjson.dumps(ev)], "auths": [[]]}, now + due_in_ms


def test_a_batch_is_written_once_redis_answers_again(own_redis: OwnRedis) -> None:
    r = redis_adapter.connect(f"redis://127.0.0.1:{own_redis.port}/0")
    r.hset(keys.BACKOFF_APPLIED, "0", 0)
    idx = SubscriptionIndex(r, "persistent://t/ns/x", "s")
    cols, due = delivered(60_000)
    # The server comes back with the marker (from its dump): a marker written after the
    # restart would race the pass's next try, which finds the marker gone and reports lost.
    r.save()
    own_redis.kill()
    restart = threading.Timer(2.0, own_redis.start)
    restart.start()
    started = time.monotonic()
    summary = work(own_redis.port, 30).run(cols)
    restart.join()
    assert summary["retries"] > 0 and summary["decisions"] == 1 and not summary["lost"]
    assert 2.0 <= time.monotonic() - started < 15
    bucket = due - due % TICK_MS
    assert idx.remove_many(bucket, [("dwell.delayed", 0, 7)]) == 1  # the entry is there
    assert r.hget(keys.BACKOFF_APPLIED, "0") == b"1"


def test_a_batch_gives_up_after_its_timeout(own_redis: OwnRedis) -> None:
    own_redis.kill()
    started = time.monotonic()
    with pytest.raises(redislib.ConnectionError):
        work(own_redis.port, 1.5).run(delivered(10_000)[0])
    assert time.monotonic() - started < 10


def test_a_batch_says_how_far_it_read_only_by_the_brokers_clock(own_redis: OwnRedis) -> None:
    """last_ts (how far the drain may redeliver while this partition lags) is the last
    event's timestamp when the broker set it (LogAppendTime), and 0 when its producer
    did: a producer's clock could open the gate while the backoff is behind."""
    r = redis_adapter.connect(f"redis://127.0.0.1:{own_redis.port}/0")
    r.hset(keys.BACKOFF_APPLIED, "0", 0)
    cols, _ = delivered(60_000)
    assert work(own_redis.port, 5).run(cols)["last_ts"] == cols["ts"][-1]
    r.hset(keys.BACKOFF_APPLIED, "0", 0)
    cols["tsType"] = [0]
    cols["ts"] = [cols["ts"][0] + 86_400_000]  # a producer's claim, a day ahead
    assert work(own_redis.port, 5).run(cols)["last_ts"] == 0
