"""Sending a publish's records from the event loop and serving their delivery reports on
it: the HTTP path's link to the Kafka producer."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Sequence

from dwell.adapters import kafka

log = logging.getLogger("dwell.admission")


class Deliveries:
    """Sends batches from the event loop and serves their delivery reports on it too.

    A thread polling the producer contends with the loop for the GIL on every batch and
    hands each result over through `call_soon_threadsafe`; here the loop polls the
    producer itself, every `interval_s` while a batch is unsettled (not at all when
    idle), and settles asyncio futures directly.

    Each batch also gets a deadline, checked on the same tick (all batches share one
    timeout, so the oldest is always first): the producer's message.timeout.ms fails a
    send by itself, this only guards against a delivery report that never comes."""

    def __init__(self, producer: kafka.Producer, timeout_s: float,
                 interval_s: float = 0.001) -> None:
        if producer.polls_in_background:
            raise ValueError("Deliveries needs a producer made with poll_in_background=False")
        self.producer = producer
        self.timeout_s = timeout_s
        self.interval_s = interval_s
        # (deadline, future) of every batch sent and not yet dropped, oldest first.
        self._waiting: deque[tuple[float, asyncio.Future[list[tuple[int, int]]]]] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None

    def send(self, records: Sequence[kafka.OutRecord], partitions: Sequence[int] | None = None
             ) -> asyncio.Future[list[tuple[int, int]]]:
        """A future of every record's (partition, offset), or of the first failure
        (KafkaUnavailable, or TimeoutError after `timeout_s`). `partitions`: as for
        `kafka.Producer.send_many`."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[list[tuple[int, int]]] = loop.create_future()

        def settle(out: list[tuple[int, int]] | None, exc: Exception | None) -> None:
            # Timed out, or the request went away; or its loop did (tests run one loop
            # after another, while the producer lives on).
            if fut.done() or loop.is_closed():
                return
            if exc is not None:
                fut.set_exception(exc)
            else:
                fut.set_result(out)  # type: ignore[arg-type]

        self.producer.send_many_then(records, settle, partitions)
        if loop is not self._loop:
            self._waiting.clear()  # futures of a loop that is gone
            self._loop = None
        if not self._waiting:
            self._loop = loop
            loop.call_later(self.interval_s, self._tick, loop)
        self._waiting.append((loop.time() + self.timeout_s, fut))
        return fut

    def _tick(self, loop: asyncio.AbstractEventLoop) -> None:
        if loop is not self._loop:
            return  # a loop that is gone (tests run one loop after another)
        try:
            self.producer.poll(0)
        except Exception:  # keep ticking: the deadlines below still fail the waiting
            log.exception("serving delivery reports")
        waiting = self._waiting
        now = loop.time()
        while waiting:
            deadline, fut = waiting[0]
            if not fut.done():
                if deadline > now:
                    break
                fut.set_exception(TimeoutError(f"no delivery report in {self.timeout_s:g} s"))
            waiting.popleft()
        if waiting:
            loop.call_later(self.interval_s, self._tick, loop)
