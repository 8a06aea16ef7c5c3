"""A round's hold on the buckets it claimed: while a drain or restage round writes them,
`LeaseKeeper` renews their leases in the background (renew-2.lua) so that a round running
longer than its lease keeps them, up to the round's maximum time; it tells the round which
claims it lost meanwhile, so that the round stops writing them."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any, Final, Protocol

import redis as redislib

from dwell.index.bucket_index import RENEWED, BucketIndex, ClaimedBucket

log = logging.getLogger("dwell.index.leases")

# Renewals per lease: one missed renewal (a slow Redis call, a pause) leaves two more
# before the lease runs out.
RENEWALS_PER_LEASE: Final = 3
# How long stop() waits for a renewal under way (a Redis call of its own, bounded by the
# client's socket timeout).
STOP_TIMEOUT_S: Final = 5.0


class RoundExpired(TimeoutError):
    """A round ran past its maximum time: its leases are no longer renewed, and its
    claims come back to the index once they expire."""


class _Counter(Protocol):
    def inc(self, amount: float = 1) -> None: ...


class LeaseKeeper:
    """Renews the leases of ``claims`` (claim *i* of a round is ``claims[i]``) every
    ``lease_ms / RENEWALS_PER_LEASE`` on a thread of its own, from `start` until `stop`
    or until ``max_round_ms`` after it was made, whichever comes first: a round never
    keeps buckets longer than ``max_round_ms + lease_ms``.

    `check` is what the round asks between its pieces of work: the claims it lost (a
    renewal found another lease, or no claim, on the bucket: the lease expired before a
    renewal came through and another drainer claimed the bucket), or RoundExpired once
    the maximum time has passed. ``renewed`` and ``lost`` count bucket leases renewed
    and claims found lost (a service's Prometheus counters)."""

    def __init__(self, claims: Sequence[tuple[BucketIndex, ClaimedBucket]], lease_ms: int,
                 max_round_ms: int, *, renewed: _Counter | None = None,
                 lost: _Counter | None = None) -> None:
        self.claims = list(claims)
        self.lease_ms = lease_ms
        self.interval_s = lease_ms / RENEWALS_PER_LEASE / 1000
        self.started = time.monotonic()
        self.deadline = self.started + max_round_ms / 1000
        self.renewals = 0
        self._renewed = renewed
        self._lost_counter = lost
        self._lost: set[int] = set()
        self._dropped: set[int] = set()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> LeaseKeeper:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def start(self) -> None:
        if self.claims and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="dwell-lease-keeper",
                                            daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(STOP_TIMEOUT_S)

    def drop(self, numbers: Iterable[int]) -> None:
        """Renew these claims no more: the round gave them up (their copy failed), so
        they come back to the index one lease after their last renewal."""
        with self._lock:
            self._dropped.update(numbers)

    @property
    def lost(self) -> frozenset[int]:
        """The claims (their numbers in ``claims``) whose lease a renewal found lost."""
        with self._lock:
            return frozenset(self._lost)

    def check(self) -> frozenset[int]:
        """`lost`, or RoundExpired once the round's maximum time has passed."""
        if time.monotonic() >= self.deadline:
            raise RoundExpired(
                f"round still running after its maximum time; its {len(self.claims)} "
                "claims come back to the index after their lease")
        return self.lost

    def _run(self) -> None:
        while not self._stopping.wait(self.interval_s):
            if time.monotonic() >= self.deadline:
                log.warning("a round of %d claims passed its maximum time: its leases are "
                            "no longer renewed", len(self.claims))
                return
            try:
                self.renew()
            except redislib.RedisError as exc:
                # The next renewal may still come in time; complete() checks the holder
                # whatever happens here.
                log.warning("lease renewal failed: %s", exc)

    def renew(self) -> None:
        """Renew every claim not lost or dropped yet, one pipeline per Redis client. A
        lease runs on the clock its claim was made with (the `now_ms` the claim was
        given): it is extended to that claim time plus the time since, plus the lease."""
        elapsed_ms = int((time.monotonic() - self.started) * 1000)
        with self._lock:
            held = [i for i in range(len(self.claims))
                    if i not in self._lost and i not in self._dropped]
        # One renew-2.lua call per (index, lease): a claim call hands all its buckets
        # one lease.
        calls: dict[tuple[int, str], list[int]] = {}
        for i in held:
            idx, bucket = self.claims[i]
            calls.setdefault((id(idx), bucket.lease_id), []).append(i)
        pipes: dict[int, tuple[Any, list[list[int]]]] = {}
        for (_, lease_id), nums in calls.items():
            idx, first = self.claims[nums[0]]
            expiry = first.lease_expires_at + elapsed_ms
            pipe, queued = pipes.setdefault(
                id(idx.redis), (idx.redis.pipeline(transaction=False), []))
            idx.renew([self.claims[i][1].bucket_start for i in nums], lease_id, expiry,
                      client=pipe)
            queued.append(nums)
        renewed, gone = 0, []
        for pipe, queued in pipes.values():
            for nums, codes in zip(queued, pipe.execute(), strict=True):
                for i, code in zip(nums, codes, strict=True):
                    if int(code) == RENEWED:
                        renewed += 1
                    else:
                        gone.append(i)
        with self._lock:
            self._lost.update(gone)
        self.renewals += renewed
        if self._renewed is not None and renewed:
            self._renewed.inc(renewed)
        if gone:
            if self._lost_counter is not None:
                self._lost_counter.inc(len(gone))
            log.warning("%d claimed buckets were lost before the round finished (another "
                        "drainer holds them now): their remaining records are not written",
                        len(gone))
