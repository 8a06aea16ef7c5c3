"""A synchronous offset commit ends within its timeout when the broker stops answering
(nothing waits forever): the adapter's `Consumer.commit`, which the SDK's consumer and
the index recovery use."""

from __future__ import annotations

import os
import signal
import time
import uuid

import pytest

from dwell.adapters import kafka
from dwell_dev.testkit import private_stack

pytestmark = pytest.mark.integration

TOPIC = "commit-bound"


def test_a_commit_to_a_broker_that_does_not_answer_ends_within_its_timeout() -> None:
    with private_stack("commit") as stack:
        stack.start("kafka")
        bootstrap = stack.kafka_bootstrap
        kafka.ensure_topic(bootstrap, TOPIC, partitions=1)
        group = f"commit-{uuid.uuid4().hex[:8]}"
        c = kafka.Consumer(bootstrap, group)
        c.commit({(TOPIC, 0): 1}, timeout=10)
        pid = stack.pid("kafka")
        assert pid is not None
        # A stopped broker keeps its connections open: the commit is sent and never
        # answered (librdkafka's own request timeout is a minute).
        os.killpg(pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(kafka.KafkaUnavailable) as caught:
                c.commit({(TOPIC, 0): 2}, timeout=3)
            took = time.monotonic() - started
            print(f"commit to a stopped broker: {caught.value} after {took:.1f} s")
            assert took < 6
        finally:
            os.killpg(pid, signal.SIGCONT)
        # Answering again, the broker takes the next commit, and the group has it.
        c.commit({(TOPIC, 0): 3}, timeout=30)
        assert c.committed([(TOPIC, 0)]) == {(TOPIC, 0): 3}
        c.close()
