"""The Kafka ACLs of a secured dwell: one table of (principal, resource, pattern,
operation) rules for dwell's components and for users' principals, applied idempotently
with confluent-kafka's AdminClient (`devstack.py up --secure`) and read back from the
broker as an operator would read them (`make acls`, `devstack.py acls`); `chart` writes
the in-chart Kafka's rules file (charts/dwell/files/kafka-acls.txt).

Every rule ALLOWs from any host; the broker runs KRaft's StandardAuthorizer with no rule
for anyone else, so whatever the table does not name is refused. docs/kubernetes.md
gives the same table for an operator's own Kafka.

Needs the venv (confluent-kafka): devstack.py runs it with the venv's Python.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Mapping
from dataclasses import astuple, dataclass

from confluent_kafka.admin import AclBinding, AdminClient

from dwell.adapters.kafka import acls
from dwell.core.topics import (
    ACKS,
    DELAYED,
    DELIVERED,
    INVALID,
    POLICIES,
    PUBLISH,
    PUBLISH_RESULTS,
    REFILED,
    SUBSCRIPTIONS,
    escape_kafka_part,
)
from dwell.smoke import TENANT as SMOKE_TENANT
from dwell_dev import ROOT

# The principal of each dwell process (SCRAM user names); `User:` is Kafka's type.
COMPONENTS = ("dwell-policy", "dwell-admission", "dwell-tracker", "dwell-spark")
# The in-chart Kafka's rules (`dwell_dev.kafka_acls chart` writes them): the components' and the
# user principal of the chart's `helm test` hook (python -m dwell.smoke, its own tenant).
CHART_FILE = ROOT / "charts" / "dwell" / "files" / \
    "kafka-acls.txt"
CHART_USERS = {"app-dwell-smoke": SMOKE_TENANT}
DWELL_TOPICS = (POLICIES, PUBLISH, PUBLISH_RESULTS, DELAYED, REFILED, ACKS, DELIVERED,
                INVALID, SUBSCRIPTIONS)
# What every component that ensures dwell's topics may have to set on them: the logs'
# retention and the broker timestamps of dwell.publish and dwell.acks
# (adapters.kafka.ensure_dwell_topics).
KEPT = (DELAYED, REFILED, DELIVERED)
ENFORCED_CONFIGS = (*KEPT, PUBLISH, ACKS)
# Ready, retry and DLQ topics of every tenant have no common prefix: the components that
# make and fill them hold these rights on every topic name.
ANY = "*"


@dataclass(frozen=True, order=True)
class Rule:
    principal: str  # "User:dwell-admission"
    resource: str  # topic | group | transactional-id | cluster
    name: str
    pattern: str  # literal | prefixed
    operation: str  # Kafka's operation name: READ, WRITE, CREATE, ...

    def binding(self) -> AclBinding:
        return acls.binding(astuple(self))


def _rules(principal: str, resource: str, names: Iterable[str], ops: Iterable[str],
           pattern: str = "literal") -> list[Rule]:
    return [Rule(f"User:{principal}", resource, n, pattern, op)
            for n in names for op in ops]


def component_rules() -> list[Rule]:
    """What each dwell component needs, read from the code: the topics it creates, reads
    and writes, the consumer groups it joins or whose offsets it reads, its transactional
    ids. Creating a topic that exists is part of every component's start (idempotent
    ensure), so CREATE is granted on the topics each one ensures."""
    r: list[Rule] = []
    # policy: the change feed (writes, reads it back for catch-up and rebuild, and audits
    # it under its own group), and
    # Pulsar's admin API on partitioned topics (create, add partitions, delete).
    r += _rules("dwell-policy", "topic", [POLICIES],
                ["CREATE", "DESCRIBE", "DESCRIBE_CONFIGS", "WRITE", "READ"])
    r += _rules("dwell-policy", "topic", [ANY], ["CREATE", "DESCRIBE", "ALTER", "DELETE"])
    r += _rules("dwell-policy", "group", ["dwell-policy"], ["READ", "DESCRIBE"], "prefixed")
    # The feed's records no reader can apply, set aside (policy.audit, policy.rebuild).
    r += _rules("dwell-policy", "topic", [INVALID], ["WRITE"])
    # admission: reads publish requests and the policy feed, writes results, the delay
    # log and set-aside records, and every tenant's ready topics, in transactions.
    r += _rules("dwell-admission", "topic", DWELL_TOPICS, ["CREATE", "DESCRIBE",
                                                           "DESCRIBE_CONFIGS"])
    r += _rules("dwell-admission", "topic", ENFORCED_CONFIGS, ["ALTER_CONFIGS"])
    r += _rules("dwell-admission", "topic", [PUBLISH, POLICIES], ["READ"])
    r += _rules("dwell-admission", "topic", [PUBLISH_RESULTS, DELAYED, INVALID], ["WRITE"])
    r += _rules("dwell-admission", "topic", [ANY], ["CREATE", "DESCRIBE", "WRITE"])
    r += _rules("dwell-admission", "group", ["dwell-admission"], ["READ", "DESCRIBE"],
                "prefixed")
    r += _rules("dwell-admission", "transactional-id", ["dwell-admission"],
                ["WRITE", "DESCRIBE"], "prefixed")
    # tracker: indexes the delay log and its re-filed copies, keeps the subscription
    # registry, follows the policy feed, re-files long delays.
    r += _rules("dwell-tracker", "topic", [DELAYED, REFILED, SUBSCRIPTIONS, POLICIES],
                ["CREATE", "DESCRIBE", "DESCRIBE_CONFIGS", "READ"])
    r += _rules("dwell-tracker", "topic", [REFILED, SUBSCRIPTIONS], ["WRITE"])
    # The delivered marks (read to rebuild, written by re-files), and what keeps the logs:
    # their retention set (adapters.kafka.ensure_retention) and the trim's DeleteRecords.
    r += _rules("dwell-tracker", "topic", [DELIVERED],
                ["CREATE", "DESCRIBE", "DESCRIBE_CONFIGS", "READ", "WRITE"])
    r += _rules("dwell-tracker", "topic", KEPT, ["ALTER_CONFIGS", "DELETE"])
    # A subscription's registration makes its ready and retry topics.
    r += _rules("dwell-tracker", "topic", [ANY], ["CREATE", "DESCRIBE"])
    r += _rules("dwell-tracker", "group", ["dwell-tracker", "dwell-restage-",
                                           "dwell-admission-policies-"],
                ["READ", "DESCRIBE"], "prefixed")
    # the Spark app: drains the delay logs onto ready topics, reads ack events, copies
    # records of ready and retry topics to retry and DLQ topics; its Kafka source makes
    # group ids `spark-kafka-source-*`.
    r += _rules("dwell-spark", "topic", DWELL_TOPICS, ["CREATE", "DESCRIBE",
                                                       "DESCRIBE_CONFIGS"])
    r += _rules("dwell-spark", "topic", ENFORCED_CONFIGS, ["ALTER_CONFIGS"])
    r += _rules("dwell-spark", "topic", [DELAYED, REFILED, ACKS], ["READ"])
    r += _rules("dwell-spark", "topic", [DELIVERED, INVALID], ["WRITE"])
    r += _rules("dwell-spark", "topic", [ANY], ["CREATE", "DESCRIBE", "READ", "WRITE"])
    r += _rules("dwell-spark", "group", ["spark-kafka-source-", "dwell-drain-"],
                ["READ", "DESCRIBE"], "prefixed")
    # dwell.adapters.kafka's scans read by offset in this group, committing nothing.
    for component in COMPONENTS:
        r += _rules(component, "group", ["dwell-reader"], ["READ", "DESCRIBE"])
    return sorted(set(r))


def tenant_prefixes(tenant: str) -> list[str]:
    """The Kafka name prefixes of a tenant's topics: persistent and non-persistent ready
    topics and, after them, their retry and DLQ topics."""
    t = escape_kafka_part(tenant)
    return [f"{t}.", f"non-persistent.{t}."]


def user_rules(principal: str, tenant: str) -> list[Rule]:
    """A user's principal: sends publish requests and ack events, reads its own tenant's
    publish results, ready, retry and DLQ topics in its own tenant's consumer groups (all
    named by the tenant's prefix). Nothing else: above all not READ on dwell.publish,
    dwell.acks or dwell.publish.results, whose records are other clients'."""
    r = _rules(principal, "topic", [PUBLISH, ACKS], ["WRITE", "DESCRIBE"])
    r += _rules(principal, "topic", tenant_prefixes(tenant), ["READ", "DESCRIBE"], "prefixed")
    r += _rules(principal, "group", tenant_prefixes(tenant), ["READ", "DESCRIBE"], "prefixed")
    return sorted(set(r))


def table(users: Mapping[str, str] | None = None) -> list[Rule]:
    """Every rule: the components' and, for each user principal, its tenant's."""
    rules = component_rules()
    for principal, tenant in sorted((users or {}).items()):
        rules += user_rules(principal, tenant)
    return rules


def chart_file() -> str:
    """charts/dwell/files/kafka-acls.txt: the rules of table(CHART_USERS), one a line, as
    dwell.adapters.kafka.acls reads them."""
    return ("# The in-chart Kafka's ACLs (templates/kafka-statefulset.yaml applies them).\n"
            "# Written by `python -m dwell_dev.kafka_acls chart` from its table: do not edit.\n"
            "# principal resource name pattern operation\n"
            + acls.format_rows(astuple(r) for r in table(CHART_USERS)))


def upsert_users(admin: AdminClient, passwords: Mapping[str, str],
                 timeout: float = 30.0) -> None:
    """Create or update SCRAM-SHA-512 users (name -> password)."""
    acls.upsert_scram_users(admin, passwords, timeout)


def apply(admin: AdminClient, rules: Iterable[Rule], timeout: float = 30.0) -> int:
    """Create the rules the broker does not hold yet (creating one it holds is a no-op
    for Kafka); returns how many were asked for."""
    return acls.create(admin, [astuple(r) for r in rules], timeout)


def prune(admin: AdminClient, keep: Iterable[Rule], principals: Iterable[str],
          timeout: float = 30.0) -> int:
    """Delete the ALLOW rules the broker holds for ``principals`` (`User:<name>`) that
    ``keep`` does not name, so that a rule taken out of the table leaves the broker too;
    returns how many."""
    return acls.prune(admin, [astuple(r) for r in keep], principals, timeout)


def grant_user(admin: AdminClient, principal: str, tenant: str,
               password: str | None = None) -> None:
    """Make ``principal`` a user of ``tenant``: its rules and, given a password, its SCRAM
    login (a principal an OIDC provider vouches for has none)."""
    if password is not None:
        upsert_users(admin, {principal: password})
    apply(admin, user_rules(principal, tenant))


def held(admin: AdminClient, timeout: float = 30.0) -> list[Rule]:
    """The rules the broker holds (describe_acls), as table rows."""
    return [Rule(*row) for row in acls.held(admin, timeout)]


def render(rules: Iterable[Rule]) -> str:
    """The rules as an operator reads them: one line per principal and resource, its
    operations together."""
    grouped: dict[tuple[str, str, str, str], list[str]] = {}
    for r in rules:
        grouped.setdefault((r.principal, r.resource, r.pattern, r.name), []).append(
            r.operation)
    rows = [("principal", "resource", "pattern", "name", "operations")]
    rows += [(p, res, pat, name, ",".join(sorted(ops)))
             for (p, res, pat, name), ops in sorted(grouped.items())]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row[:4], widths, strict=True))
                     + "  " + row[4] for row in rows)


def main(argv: list[str] | None = None) -> int:
    """Reads {"admin": <librdkafka config>, "users": {principal: tenant}, "passwords":
    {user: password}} as JSON on stdin (passwords stay off the command line); `apply`
    creates the users and the table's rules, `show` prints the rules the broker holds;
    `chart` writes the chart's rules file (CHART_FILE) and reads nothing."""
    ap = argparse.ArgumentParser(prog="kafka_acls", description=__doc__)
    ap.add_argument("cmd", choices=["apply", "show", "chart"])
    args = ap.parse_args(argv)
    if args.cmd == "chart":
        CHART_FILE.write_text(chart_file())
        print(f"kafka acls: wrote {CHART_FILE.name}")
        return 0
    spec = json.loads(sys.stdin.read())
    admin = AdminClient(spec["admin"])
    if args.cmd == "apply":
        users = spec.get("users", {})
        upsert_users(admin, spec.get("passwords", {}))
        rules = table(users)
        n = apply(admin, rules)
        gone = prune(admin, rules, [f"User:{p}" for p in (*COMPONENTS, *users)])
        print(f"kafka acls: {n} rules applied for {len(COMPONENTS)} components and "
              f"{len(users)} user principals, {gone} stale ones deleted")
    else:
        print(render(held(admin)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
