"""The chart's dashboards and alert rules (charts/dwell/files/) against a real Prometheus
that scrapes the e2e stack every second while a workload runs through it: publishes with
and without a delay, a max-delay rejection, a fixed-delay override, deliveries, an ack
timeout and a nack redelivered, a dead letter, a topic whose ready topic refuses its
records, and an admission replica that cannot reach Kafka (it answers 503).

Every panel query, with the dashboard's variables filled from Prometheus the way Grafana
fills them, must return series; every rule must load, and the part of each alert
expression before its threshold must return series. The conditions the workload creates
must show as alerts pending or firing. Prints a table of both."""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from dwell.adapters import kafka
from dwell.client import ExponentialRedeliveryBackoff, NotAllowedError, Producer
from dwell.core.topics import TopicName, dlq_topic
from dwell_dev import devstack, promserver
from dwell_dev.testkit import configure_topic

from .conftest import Dwell, consumer, free_port, make_topic, new_tenant

ROOT = Path(__file__).resolve().parents[2]
FILES = ROOT / "charts" / "dwell" / "files"
RULES = FILES / "rules" / "dwell.rules.yaml"
DASHBOARDS = sorted((FILES / "dashboards").glob("*.json"))
SCRAPE_S = 1.0
# Grafana's $__rate_interval is max($__interval + scrape interval, 4 x scrape interval);
# the workload's events lie within the last minute of the evaluation.
RATE_INTERVAL = "1m"
# A ready topic that refuses the drain's copies: its records are bigger than this.
SMALL_MAX_MESSAGE_BYTES = 2000
BACKOFF = ExponentialRedeliveryBackoff(min_delay_ms=500, max_delay_ms=1000, multiplier=2)
# Alerts whose condition the workload creates, and the state Prometheus must show for
# each (`pending` while their `for:` runs). The failing topic's due bucket stays in the
# index, so the drain lag passes 10 s some seconds after it came due.
DRIVEN = {"DwellDeadLetters": "firing", "DwellAdmissionUnavailable": "pending",
          "DwellDrainTopicFailing": "pending", "DwellPolicyVersionDivergent": "pending",
          "DwellDrainLagHigh": "pending"}
# Rules whose series only exist once their condition happened, and which the shared e2e
# stack cannot make happen: a loss needs records deleted from the delay log under other
# tests' pending messages. tests/integration/test_lost_records.py drives the counter and
# charts/dwell/files/rules/dwell.rules.test.yaml (promtool) the rule.
UNDRIVABLE = frozenset({"DwellMessagesLost"})
THRESHOLD = re.compile(r"^(?P<inner>.+?)\s*(?:>=|<=|==|!=|>|<)\s*[0-9.eE+-]+$", re.S)


def host(url: str) -> str:
    return url.removeprefix("http://")


@pytest.fixture(scope="module")
def unavailable_admission(services) -> Iterator[str]:
    """An admission replica whose Kafka is a closed port: it never loads the policies, so
    it answers every publish 503 and stays at policy version 0."""
    svc = services.start("admission", ready=False, env={
        "DWELL_KAFKA_BOOTSTRAP": f"127.0.0.1:{free_port()}", "DWELL_INGRESS_ENABLED": "false"})
    yield svc.url
    svc.stop()


@pytest.fixture(scope="module")
def prom(e2e: Dwell, unavailable_admission: str,
         stack: devstack.Stack) -> Iterator[promserver.Prometheus]:
    targets = {"policy": [host(e2e.policy)],
               "admission": [host(u) for u in (e2e.admission, e2e.strict_admission,
                                                unavailable_admission)],
               "tracker": [host(e2e.tracker)],
               "spark": [f"127.0.0.1:{e2e.spark.metrics_port}"]}
    state = stack.state / "prometheus"
    state.mkdir(parents=True, exist_ok=True)
    server = promserver.Prometheus(state, promserver.port("test"), targets, [RULES],
                                   interval_s=SCRAPE_S).start()
    try:
        server.wait_up()
        yield server
    finally:
        server.stop()


@dataclass
class Workload:
    namespace: str
    pending_topic: str
    big_ready: str


def scalar(prom: promserver.Prometheus, expr: str) -> float:
    got = prom.query(expr)
    return float(got[0]["value"][1]) if got else 0.0


def wait_prom(prom: promserver.Prometheus, expr: str, timeout: float) -> None:
    """Until ``expr`` returns a series (Prometheus has scraped what the workload did)."""
    deadline = time.monotonic() + timeout
    while not prom.query(expr):
        assert time.monotonic() < deadline, f"{expr} empty after {timeout}s"
        time.sleep(0.5)


def unavailable(admission: str, ns: str) -> None:
    """A publish to the replica without Kafka: 503."""
    r = httpx.post(f"{admission}/topics/persistent/{ns}/orders",
                   json={"producerName": "p", "messages": [{"payload": "x"}]}, timeout=10)
    assert r.status_code == 503, r.text


def drive(e2e: Dwell, prom: promserver.Prometheus, unavailable_admission: str) -> Workload:
    tenant = new_tenant()
    main = make_topic(e2e, tenant)  # its probe is a max-delay rejection
    ns = f"{tenant}/ns"
    fixed, pending, big = (f"persistent://{ns}/{x}" for x in ("fixed", "pending", "big"))
    with Producer(main, admission_url=e2e.admission) as p, pytest.raises(NotAllowedError):
        p.send(b"too-late", deliver_after=120_000)
    # A fixed delay on one topic (PIP-437): a producer's delay is overridden; until the
    # policy reaches admission, the same delay is refused as above max.
    created = httpx.put(f"{e2e.policy}/admin/v2/persistent/{ns}/fixed", timeout=10)
    assert created.status_code < 300, created.text
    r = httpx.post(f"{e2e.policy}/admin/v2/persistent/{ns}/fixed/delayedDelivery",
                   json={"active": True, "tickTime": 1000, "fixedDeliveryDelayInMillis": 1000},
                   timeout=10)
    assert r.status_code < 300, r.text
    deadline = time.monotonic() + 15
    with Producer(fixed, admission_url=e2e.admission) as p:
        while True:
            try:
                p.send(b"fixed", deliver_after=120_000)
                break
            except NotAllowedError:
                assert time.monotonic() < deadline, "the fixed delay never reached admission"
                time.sleep(0.2)
    # A delayed message that is still indexed when the panels are evaluated.
    with Producer(pending, admission_url=e2e.admission) as p:
        p.send(b"later", deliver_after=40_000)
    # A cancelled message: the tracker answers, and the drain passes it over when due.
    with Producer(pending, admission_url=e2e.admission) as p:
        mid = p.send(b"cancelled", deliver_after=5000)
    r = httpx.delete(f"{e2e.tracker}/v1/topics/persistent/{ns}/pending/messages/{mid}",
                     timeout=30)
    assert (r.status_code, r.json()["result"]) == (200, "cancelled"), r.text
    # A message replaced by a newer one with its schedule key.
    with Producer(pending, admission_url=e2e.admission) as p:
        p.send(b"replaced", deliver_after=40_000, schedule_key="k")
        p.send(b"replacement", deliver_after=40_000, schedule_key="k")
    # A ready topic too small for its record: the drain's copy fails, alone and counted.
    big_ready = TopicName.parse(big).kafka_topic
    kafka.ensure_topic(e2e.bootstrap, big_ready, 1,
                       config={"max.message.bytes": str(SMALL_MAX_MESSAGE_BYTES)})
    with Producer(big, admission_url=e2e.admission) as p:
        p.send(b"x" * (2 * SMALL_MAX_MESSAGE_BYTES), deliver_after=3000)
    unavailable(unavailable_admission, ns)

    # Deliveries, a nack and an ack timeout: "nack" is nacked once and acked when it comes
    # back; "dead" is never acked: one redelivery (maxRedeliverCount 1), then the DLQ.
    kafka.ensure_topic(e2e.bootstrap, dlq_topic(TopicName.parse(main), "work"), 4)
    # Earlier modules' dead letters count in the same app: this one's must add to them.
    wait_prom(prom, "dwell_dlq_messages_total", 15)
    dead_before = scalar(prom, "sum(dwell_dlq_messages_total)")
    c = consumer(e2e, main, "work", ack_timeout_ms=1000, ack_timeout_redelivery_backoff=BACKOFF,
                 negative_ack_redelivery_backoff=BACKOFF, max_redeliver_count=1)
    try:
        with Producer(main, admission_url=e2e.admission) as p:
            p.send(b"now")
            p.send(b"later", deliver_after=2000)
            p.send(b"nack")
            p.send(b"dead")
        seen: dict[bytes, int] = {}
        deadline = time.monotonic() + 90
        while not (seen.get(b"nack", 0) >= 2 and seen.get(b"later")
                   and scalar(prom, "sum(dwell_dlq_messages_total)") > dead_before
                   and scalar(prom, "max(dwell_drain_failing_topics)") > 0):
            assert time.monotonic() < deadline, f"workload incomplete: received {seen}"
            m = c.receive(0.2)
            if m is None:
                continue
            body = m.value or b""
            seen[body] = seen.get(body, 0) + 1
            if body == b"nack" and seen[body] == 1:
                c.negative_acknowledge(m)
            elif body != b"dead":
                c.acknowledge(m)
    finally:
        c.close()
    # A rate needs the counter to grow between two scrapes: a second 503.
    unavailable(unavailable_admission, ns)
    # A counter first scraped in the last second has one sample; increase() needs two.
    for expr in ('sum(rate(dwell_admission_requests_total{status="503"}[5m])) > 0',
                 "count_over_time(dwell_drain_topic_failures_total[1m]) >= 2",
                 "count_over_time(dwell_drain_cancelled_messages_total[1m]) >= 2",
                 "count_over_time(dwell_tracker_cancel_requests_total[1m]) >= 2",
                 "count_over_time(dwell_tracker_replaced_messages_total[1m]) >= 2",
                 "dwell_redeliveries_total", "dwell_delivery_lateness_ms_count > 0",
                 "dwell_delivered_marks_total{job='spark'} > 0",
                 f"pulsar_broker_topic_messages_fixed_delay_overridden_total{{topic='{fixed}'}}",
                 f"dwell_tracker_delayed_messages{{topic='{pending}'}}"):
        wait_prom(prom, expr, 15)
    return Workload(ns, pending, big_ready)


@pytest.fixture(scope="module")
def workload(e2e: Dwell, prom: promserver.Prometheus,
             unavailable_admission: str) -> Iterator[Workload]:
    w = drive(e2e, prom, unavailable_admission)
    yield w
    # The operator raises the limit: the topic is delivered and failing no more, so that
    # the next e2e modules see a healthy drain. Its next try comes after a wait that has
    # doubled from the drain lease (5 s) with each failure: 40 s after four.
    configure_topic(e2e.bootstrap, w.big_ready, {"max.message.bytes": str(1 << 20)})
    deadline = time.monotonic() + 90
    while scalar(prom, "max(dwell_drain_failing_topics)") > 0:
        assert time.monotonic() < deadline, "the drain still fails after the limit was raised"
        time.sleep(0.5)


def fill(expr: str, variables: dict[str, str]) -> str:
    for name, value in variables.items():
        expr = expr.replace(f"${name}", value)
    return expr


def table(header: tuple[str, ...], rows: list[tuple[Any, ...]]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    return "\n".join("  ".join(str(v).ljust(w) for v, w in zip(r, widths, strict=True))
                     for r in [header, *rows])


def test_every_dashboard_panel_returns_data(prom: promserver.Prometheus,
                                            workload: Workload) -> None:
    assert DASHBOARDS
    rows, empty = [], []
    for path in DASHBOARDS:
        doc = json.loads(path.read_text())
        variables = {"__rate_interval": RATE_INTERVAL}
        for var in doc["templating"]["list"]:
            if var["type"] != "query":
                continue
            metric, label = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", var["query"]).groups()
            values = prom.label_values(label, metric)
            want = workload.namespace if label == "namespace" else workload.pending_topic
            assert want in values, (var["name"], values)
            variables[var["name"]] = want
        for panel in doc["panels"]:
            for target in panel.get("targets", []):
                series = len(prom.query(fill(target["expr"], variables)))
                rows.append((path.name, panel["title"], target.get("refId", ""), series))
                if not series:
                    empty.append((panel["title"], target["expr"]))
    print("\n" + table(("dashboard", "panel", "query", "series"), rows))
    assert not empty, f"panel queries without data: {empty}"


def test_every_rule_loads_and_every_alert_can_fire(prom: promserver.Prometheus,
                                                   workload: Workload) -> None:
    rules = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    loaded = {r["name"]: r for g in prom.api("rules")["groups"] for r in g["rules"]}
    assert set(loaded) == {r.get("alert") or r["record"] for r in rules}
    assert all(r["health"] == "ok" for r in loaded.values()), loaded
    # Alert states come from rule evaluation (every second here): wait for the driven ones.
    deadline = time.monotonic() + 30
    while True:
        states = {a["labels"]["alertname"]: a["state"] for a in prom.api("alerts")["alerts"]}
        if all(states.get(name) == want for name, want in DRIVEN.items()):
            break
        assert time.monotonic() < deadline, f"alert states {states}, want {DRIVEN}"
        time.sleep(0.5)
    rows, empty = [], []
    for rule in rules:
        name = rule.get("alert") or rule["record"]
        m = THRESHOLD.match(rule["expr"].strip())
        inner = m["inner"] if m else rule["expr"]
        full, part = len(prom.query(rule["expr"])), len(prom.query(inner))
        rows.append((name, full, part, states.get(name, "inactive")))
        if not part and name not in UNDRIVABLE:
            empty.append((name, inner))
    print("\n" + table(("rule", "expr series", "before threshold", "state"), rows))
    assert not empty, f"rule expressions without data: {empty}"
    firing_now = {r[0]: r[1] for r in rows}
    for name in DRIVEN:
        assert firing_now[name] > 0, name


def test_an_empty_query_is_reported(prom: promserver.Prometheus) -> None:
    """The check can fail: a metric nothing exports has no series, and bad PromQL is an
    error from Prometheus, not an empty answer."""
    assert prom.query(f"dwell_no_such_metric_{uuid.uuid4().hex}") == []
    with pytest.raises(RuntimeError, match="bad_data"):
        prom.query("sum(")
