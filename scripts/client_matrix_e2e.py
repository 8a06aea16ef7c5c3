"""One delayed message through a running dwell, with nothing but dwell-client installed:
the part of dwell_dev.client_matrix that runs inside each Python version's virtualenv.
Standard library and dwell-client only, and Python 3.9 syntax.

It subscribes to ``--topic`` with dwell.client.Consumer, publishes one message with
dwell.client.Producer to be delivered ``--delay-ms`` later, and checks that it is received
no earlier than its deliverAt less the namespace's tickTime (the tracker's buckets are
that wide) and no later than deliverAt + tickTime + ``--late-ms``. It then nacks it and
checks that the redelivery comes back with the same id and a redelivery count of 1, no
earlier than ``--nack-delay-ms`` after the nack and at most ``--redelivery-late-ms`` after
that, and acks it. The Producer and Consumer find the services through the DWELL_*_URL
and DWELL_KAFKA_BOOTSTRAP variables (dwell.endpoints).

Prints one JSON line: ``{"ok": true, "late_ms": ..., "redelivery_late_ms": ...}``, exit 0;
or ``{"ok": false, "error": "..."}``, exit 1.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import NamedTuple

from dwell.client import (
    Consumer,
    ExponentialRedeliveryBackoff,
    Message,
    Producer,
    PublishError,
    SubscribeError,
)

SUBSCRIPTION = "matrix"
PAYLOAD = b"dwell-client matrix"


class Received(NamedTuple):
    """A message and when the receive call that returned it started and ended (ms)."""

    before: int
    after: int
    msg: Message


class Failed(Exception):
    """A check did not hold; its text says which and by how much."""


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def publish(producer: Producer, delay_ms: int, deadline: float) -> str:
    """Send the message, again while its namespace has not reached admission through the
    policy feed (a refusal naming it as missing)."""
    while True:
        try:
            return producer.send(PAYLOAD, deliver_after=delay_ms)
        except PublishError as exc:
            if "does not exist" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def receive(consumer: Consumer, deadline: float, what: str) -> Received:
    while time.monotonic() < deadline:
        before = now_ms()
        msg = consumer.receive(0.05)
        if msg is not None:
            return Received(before, now_ms(), msg)
    raise Failed(f"no {what} before the timeout")


def run(args: argparse.Namespace) -> dict[str, object]:
    deadline = time.monotonic() + args.timeout_s
    nack = ExponentialRedeliveryBackoff(args.nack_delay_ms, args.nack_delay_ms, 2.0)
    with Consumer(args.topic, SUBSCRIPTION, initial_position="earliest",
                  negative_ack_redelivery_backoff=nack) as consumer, \
            Producer(args.topic) as producer:
        message_id = publish(producer, args.delay_ms, deadline)
        first = receive(consumer, deadline, "delivery")
        msg = first.msg
        if (msg.message_id, msg.redelivery_count, msg.value) != (message_id, 0, PAYLOAD):
            raise Failed(f"received {msg.message_id} (redelivery {msg.redelivery_count}), "
                         f"not {message_id}")
        if msg.deliver_at is None:
            raise Failed(f"{message_id} carries no deliverAt")
        if first.after < msg.deliver_at - args.tick_ms:
            raise Failed(f"delivered {msg.deliver_at - first.after} ms before deliverAt, more "
                         f"than the tickTime ({args.tick_ms} ms)")
        latest = msg.deliver_at + args.tick_ms + args.late_ms
        if first.before > latest:
            raise Failed(f"delivered {first.before - msg.deliver_at} ms after deliverAt, more "
                         f"than tickTime + {args.late_ms} ms")
        nacked = now_ms()
        consumer.negative_acknowledge(msg)
        again = receive(consumer, deadline, "redelivery after the nack")
        redelivered = again.msg
        if (redelivered.message_id, redelivered.redelivery_count) != (message_id, 1):
            raise Failed(f"after the nack received {redelivered.message_id} (redelivery "
                         f"{redelivered.redelivery_count}), not {message_id} (redelivery 1)")
        due = nacked + args.nack_delay_ms
        if again.after < due:
            raise Failed(f"redelivered {again.after - nacked} ms after the nack, before its "
                         f"{args.nack_delay_ms} ms delay")
        if again.before > due + args.redelivery_late_ms:
            raise Failed(f"redelivered {again.before - due} ms after it was due, more than "
                         f"{args.redelivery_late_ms} ms")
        consumer.acknowledge(redelivered)
        return {"ok": True, "message_id": message_id, "late_ms": first.after - msg.deliver_at,
                "redelivery_late_ms": again.after - due}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--topic", required=True, help="persistent://tenant/namespace/topic")
    ap.add_argument("--tick-ms", type=int, required=True, help="the namespace's tickTime")
    ap.add_argument("--delay-ms", type=int, default=2000)
    ap.add_argument("--late-ms", type=int, required=True,
                    help="how much later than deliverAt + tickTime the delivery may come")
    ap.add_argument("--nack-delay-ms", type=int, default=1000)
    ap.add_argument("--redelivery-late-ms", type=int, required=True,
                    help="how much later than the nack + its delay the redelivery may come")
    ap.add_argument("--timeout-s", type=float, default=60.0)
    args = ap.parse_args()
    try:
        result = run(args)
    except Failed as exc:
        print(json.dumps({"ok": False, "error": str(exc)}), flush=True)
        return 1
    except (PublishError, SubscribeError) as exc:
        print(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"}), flush=True)
        return 1
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
