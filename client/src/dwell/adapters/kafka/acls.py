"""Kafka ACLs and SCRAM users as dwell applies them, over the admin API: rows of
(principal, resource, name, pattern, operation), each an ALLOW from any host.
dwell_dev.kafka_acls owns which rows a secured dwell needs and applies them to the
local secured stack through these functions; the chart's in-chart Kafka runs this module
beside the broker (`python -m dwell.adapters.kafka.acls`) on the rows of
charts/dwell/files/kafka-acls.txt, a file that script writes."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from dwell.security import KafkaSecurity, librdkafka_config

log = logging.getLogger("dwell.adapters.kafka.acls")

# principal ("User:dwell-admission"), resource (topic | group | transactional-id |
# cluster), name, pattern (literal | prefixed), operation (Kafka's name: READ, WRITE ...)
Row = tuple[str, str, str, str, str]

RESOURCES = {"topic": ResourceType.TOPIC, "group": ResourceType.GROUP,
             "transactional-id": ResourceType.TRANSACTIONAL_ID,
             "cluster": ResourceType.BROKER}
PATTERNS = {"literal": ResourcePatternType.LITERAL, "prefixed": ResourcePatternType.PREFIXED}
# dwell's principals log in with SCRAM-SHA-512, as on devstack's secured stack.
SCRAM = ScramMechanism.SCRAM_SHA_512
SCRAM_ITERATIONS = 8192


def binding(row: Row) -> AclBinding:
    principal, resource, name, pattern, operation = row
    return AclBinding(RESOURCES[resource], name, PATTERNS[pattern], principal, "*",
                      AclOperation[operation], AclPermissionType.ALLOW)


def upsert_scram_users(admin: AdminClient, passwords: Mapping[str, str],
                       timeout: float = 30.0) -> None:
    """Create or update SCRAM-SHA-512 users (name -> password)."""
    if not passwords:
        return
    info = ScramCredentialInfo(SCRAM, SCRAM_ITERATIONS)
    futures = admin.alter_user_scram_credentials(
        [UserScramCredentialUpsertion(u, info, p.encode()) for u, p in passwords.items()],
        request_timeout=timeout)
    for f in futures.values():
        f.result(timeout)


def create(admin: AdminClient, rows: Iterable[Row], timeout: float = 30.0) -> int:
    """Create the rows the broker does not hold yet (creating one it holds is a no-op for
    Kafka); returns how many were asked for."""
    bindings = [binding(r) for r in rows]
    if not bindings:
        return 0
    for f in admin.create_acls(bindings, request_timeout=timeout).values():
        f.result(timeout)
    return len(bindings)


def held(admin: AdminClient, timeout: float = 30.0) -> list[Row]:
    """The rules the broker holds (describe_acls); a DENY shows as `OP (DENY)`."""
    anything = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None,
                                AclOperation.ANY, AclPermissionType.ANY)
    kinds = {v: k for k, v in RESOURCES.items()}
    patterns = {v: k for k, v in PATTERNS.items()}
    out = []
    for b in admin.describe_acls(anything, request_timeout=timeout).result(timeout):
        out.append((b.principal, kinds.get(b.restype, b.restype.name.lower()), b.name,
                    patterns.get(b.resource_pattern_type,
                                 b.resource_pattern_type.name.lower()),
                    b.operation.name if b.permission_type == AclPermissionType.ALLOW
                    else f"{b.operation.name} ({b.permission_type.name})"))
    return sorted(out)


def prune(admin: AdminClient, keep: Iterable[Row], principals: Iterable[str],
          timeout: float = 30.0) -> int:
    """Delete the ALLOW rules the broker holds for ``principals`` (`User:<name>`) that
    ``keep`` does not name, so that a rule taken out of the table leaves the broker too;
    returns how many."""
    kept, who = set(keep), set(principals)
    stale = [r for r in held(admin, timeout) if r[0] in who and r not in kept
             and r[1] in RESOURCES and r[4] in AclOperation.__members__]
    if stale:
        filters = [AclBindingFilter(RESOURCES[res], name, PATTERNS[pat], p, "*",
                                    AclOperation[op], AclPermissionType.ALLOW)
                   for p, res, name, pat, op in stale]
        for f in admin.delete_acls(filters, request_timeout=timeout).values():
            f.result(timeout)
    return len(stale)


def parse(text: str) -> list[Row]:
    """The rows of a rules file: one per line, its five fields separated by blanks;
    `#` starts a comment."""
    rows: list[Row] = []
    for n, line in enumerate(text.splitlines(), 1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        if len(fields) != 5 or fields[1] not in RESOURCES or fields[3] not in PATTERNS \
                or fields[4] not in AclOperation.__members__:
            raise ValueError(f"line {n}: not `principal resource name pattern operation`")
        rows.append((fields[0], fields[1], fields[2], fields[3], fields[4]))
    return rows


def format_rows(rows: Iterable[Row]) -> str:
    """The rows as a rules file (parse's input), one per line in the order given."""
    return "".join(" ".join(r) + "\n" for r in rows)


def users_of(rows: Iterable[Row]) -> list[str]:
    """The SCRAM user names the rows' principals name."""
    return sorted({r[0].removeprefix("User:") for r in rows})


def apply_rules(admin: AdminClient, rows: list[Row], passwords: Mapping[str, str],
                timeout: float = 30.0) -> str:
    """The users with their passwords, the rows, and no other rule for their principals;
    what was done, in one line."""
    upsert_scram_users(admin, passwords, timeout)
    n = create(admin, rows, timeout)
    gone = prune(admin, rows, [f"User:{u}" for u in users_of(rows)], timeout)
    return (f"kafka acls: {len(passwords)} users, {n} rules applied, "
            f"{gone} stale ones deleted")


def main(argv: list[str] | None = None) -> int:
    """Apply a rules file to the broker DWELL_KAFKA_* names (logged in as a super-user),
    with each user's password read from `<secrets>/<user>`; then touch --ready-file and
    apply again every --interval-s, which puts back a rule deleted by hand. A round that
    fails is retried; the process exits non-zero when none succeeded within --deadline-s
    of its start, so that Kubernetes restarts it and shows why."""
    ap = argparse.ArgumentParser(prog="python -m dwell.adapters.kafka.acls",
                                 description=main.__doc__)
    ap.add_argument("--rules", type=Path, required=True)
    ap.add_argument("--secrets", type=Path, required=True)
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--ready-file", type=Path)
    ap.add_argument("--deadline-s", type=float, default=300.0)
    ap.add_argument("--interval-s", type=float, default=300.0)
    ap.add_argument("--once", action="store_true", help="exit after the first success")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    rows = parse(args.rules.read_text())
    passwords = {u: (args.secrets / u).read_text().rstrip("\n") for u in users_of(rows)}
    admin = AdminClient({"bootstrap.servers": args.bootstrap,
                         **librdkafka_config(KafkaSecurity())})
    start, done = time.monotonic(), False
    while True:
        try:
            log.info(apply_rules(admin, rows, passwords))
            done = True
            if args.ready_file:
                args.ready_file.touch()
            if args.once:
                return 0
            time.sleep(args.interval_s)
        except KafkaException as exc:
            if not done and time.monotonic() - start > args.deadline_s:
                log.error("kafka acls: not applied within %.0f s: %s", args.deadline_s, exc)
                return 1
            log.warning("kafka acls: %s; retrying in 2 s", exc)
            time.sleep(2.0)


if __name__ == "__main__":
    sys.exit(main())
