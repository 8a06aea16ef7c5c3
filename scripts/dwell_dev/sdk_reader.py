"""An application on dwell's SDK, for the fault suite and the soak bench:
``python -m dwell_dev.sdk_reader TOPIC SUB LOG`` receives every message of TOPIC's
subscription SUB and acknowledges it, logging ``recv <payload>`` before and ``ack
<payload>`` after the acknowledgement (line by line, so a kill -9 loses nothing written
before it), with the token DWELL_AUTH_PARAMS gives, if any. Runs until SIGTERM."""

from __future__ import annotations

import signal
import sys

from dwell.client import Consumer
from dwell.client.auth import token_from_env


def main() -> None:
    topic, sub, log_path = sys.argv[1:4]
    stopping = False

    def _stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, _stop)
    with open(log_path, "a", buffering=1) as log, \
            Consumer(topic, sub, initial_position="earliest", token=token_from_env()) as c:
        while not stopping:
            msg = c.receive(0.2)
            if msg is None:
                continue
            payload = (msg.value or b"").decode()
            log.write(f"recv {payload}\n")
            c.acknowledge(msg)
            log.write(f"ack {payload}\n")


if __name__ == "__main__":
    main()
