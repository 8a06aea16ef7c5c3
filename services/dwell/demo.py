"""The `make run` demo: sets a max-delay policy, publishes messages with several
delays (and one the policy refuses), prints each arrival with its requested and
actual time, then shows one message redelivered on a negative-ack backoff.

It uses only public surfaces: the policy API, the SDK Producer (admission) and
the SDK Consumer (the ready topic, the tracker, dwell.acks)."""

from __future__ import annotations

import sys
import time
import uuid
from dataclasses import dataclass

import httpx
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from dwell import endpoints
from dwell.client import Consumer, ExponentialRedeliveryBackoff, NotAllowedError, Producer
from dwell.client.auth import token_from_env
from dwell.security import http_verify

console = Console()
MAX_DELAY_MS = 30_000
DELAYS_MS = (0, 2_000, 5_000, 8_000)
REFUSED_DELAY_MS = 60_000


@dataclass
class Sent:
    label: str
    message_id: str
    sent_at: int
    deliver_at: int


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def setup_policy(policy_url: str, token: str | None) -> None:
    headers = {"Authorization": f"Bearer {token}"} if token else None
    with httpx.Client(base_url=policy_url, timeout=10, verify=http_verify(),
                      headers=headers) as http:
        for path in ("/admin/v2/tenants/demo", "/admin/v2/namespaces/demo/shop"):
            r = http.put(path)
            if r.status_code not in (204, 409):
                sys.exit(f"demo: {path} answered {r.status_code} {r.text}")
        r = http.post("/admin/v2/namespaces/demo/shop/delayedDelivery",
                      json={"active": True, "tickTime": 1000,
                            "maxDeliveryDelayInMillis": MAX_DELAY_MS})
        if r.status_code != 204:
            sys.exit(f"demo: setting the policy answered {r.status_code} {r.text}")
    console.print(f"[bold]policy[/] demo/shop: delayed delivery on, tick 1 s, "
                  f"max delay {MAX_DELAY_MS // 1000} s")


def publish(producer: Producer) -> list[Sent]:
    sent = []
    for delay in DELAYS_MS:
        t = now_ms()
        label = "immediate" if delay == 0 else f"+{delay // 1000}s"
        mid = producer.send(f"order {label}", deliver_after=delay or None, key=label)
        sent.append(Sent(label, mid, t, t + delay))
        console.print(f"[green]published[/] {label:<9} -> {mid}")
    try:
        producer.send("too far", deliver_after=REFUSED_DELAY_MS)
        console.print("[red]the +60s message was accepted; the max-delay policy did not apply")
    except NotAllowedError as exc:
        console.print(f"[yellow]refused[/]   +60s      -> {exc}")
    return sent


def await_arrivals(consumer: Consumer, sent: list[Sent]) -> bool:
    by_id = {s.message_id: s for s in sent}
    arrived: dict[str, int] = {}
    deadline = max(s.deliver_at for s in sent) + 15_000
    total_ms = max(s.deliver_at for s in sent) - min(s.sent_at for s in sent)
    with Progress(TextColumn("waiting for delayed messages"), BarColumn(),
                  TextColumn("{task.completed}/{task.total} arrived"), TimeElapsedColumn(),
                  console=console, transient=True) as bar:
        task = bar.add_task("wait", total=len(sent))
        while len(arrived) < len(sent) and now_ms() < deadline:
            msg = consumer.receive(timeout=0.2)
            if msg is None:
                continue
            consumer.acknowledge(msg)
            if msg.message_id in by_id and msg.message_id not in arrived:
                arrived[msg.message_id] = now_ms()
                bar.update(task, completed=len(arrived))
    table = Table(title=f"arrivals (delays over {total_ms / 1000:.0f} s)")
    for col in ("message", "requested at", "arrived at", "lateness"):
        table.add_column(col, justify="right")
    t0 = min(s.sent_at for s in sent)
    for s in sent:
        got = arrived.get(s.message_id)
        table.add_row(s.label, f"{(s.deliver_at - t0) / 1000:6.2f} s",
                      f"{(got - t0) / 1000:6.2f} s" if got else "[red]not yet",
                      f"{(got - s.deliver_at):+d} ms" if got else "")
    console.print(table)
    return len(arrived) == len(sent)


def redelivery(consumer: Consumer, producer: Producer) -> bool:
    backoff = consumer.nack_backoff
    assert backoff is not None
    mid = producer.send("please retry me", key="retry")
    console.print(f"\n[bold]redelivery[/]: negative-acknowledging {mid} twice "
                  f"(backoff min {backoff.min_delay_ms} ms, x{backoff.multiplier:g})")
    last = None
    deadline = now_ms() + 30_000
    while now_ms() < deadline:
        msg = consumer.receive(timeout=0.2)
        if msg is None or msg.message_id != mid:
            if msg is not None:
                consumer.acknowledge(msg)
            continue
        t = now_ms()
        gap = f"{(t - last) / 1000:.2f} s after the nack" if last else "first delivery"
        expected = (f" (backoff.next({msg.redelivery_count - 1}) = "
                    f"{backoff.next(msg.redelivery_count - 1) / 1000:.1f} s)"
                    if msg.redelivery_count else "")
        console.print(f"  received, redelivery count {msg.redelivery_count}: {gap}{expected}")
        if msg.redelivery_count >= 2:
            consumer.acknowledge(msg)
            console.print("  acknowledged")
            return True
        consumer.negative_acknowledge(msg)
        last = now_ms()
    console.print("[red]  the redelivery did not come back within 30 s")
    return False


def main() -> int:
    policy_url = endpoints.policy_url()
    topic = f"persistent://demo/shop/orders-{uuid.uuid4().hex[:6]}"
    console.rule("dwell demo")
    # A stack with authentication on (devstack --secure) gives its super-user's token as
    # dwell-admin's DWELL_AUTH_PARAMS.
    token = token_from_env()
    setup_policy(policy_url, token)
    console.print(f"[bold]topic[/]  {topic}")
    backoff = ExponentialRedeliveryBackoff.builder().min_delay_ms(1000).max_delay_ms(
        4000).multiplier(2).build()
    with Consumer(topic, "demo-app", negative_ack_redelivery_backoff=backoff,
                  initial_position="earliest", token=token,
                  policy_url=policy_url) as consumer, \
            Producer(topic, token=token) as producer:
        sent = publish(producer)
        ok = await_arrivals(consumer, sent)
        ok = redelivery(consumer, producer) and ok
    console.rule("demo done" if ok else "[red]demo incomplete: see .dwell/dev/logs")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
