"""Writes the configuration tables, between `<!-- settings:begin -->` and
`<!-- settings:end -->`, from the settings classes' fields and their descriptions:
docs/configuration.md holds every setting (one set of tables for what every process
shares, one table per process of what it adds), README.md the few a deployment sets
first. tests/unit/test_settings_table.py checks both are what this script writes.

    .venv/bin/python -m dwell_dev.settings_table          # rewrite both (make docs-settings)
    .venv/bin/python -m dwell_dev.settings_table --check  # exit 1 if either is stale
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from pydantic import SecretStr
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

from dwell.admission.settings import AdmissionSettings
from dwell.policy.settings import PolicySettings
from dwell.security import KafkaSecurity, RedisSecurity, TlsSettings
from dwell.settings import CommonSettings
from dwell.tracker.settings import TrackerSettings
from dwell_dev import ROOT
from dwell_spark.settings import SparkSettings

README = ROOT / "README.md"
CONFIG_DOC = ROOT / "docs" / "configuration.md"
BEGIN = "<!-- settings:begin -->"
END = "<!-- settings:end -->"

# CommonSettings's fields by topic; every field must be in one group (a new one fails
# the check until it is placed here).
COMMON_GROUPS: list[tuple[str, tuple[str, ...]]] = [
    ("Process", ("env", "allow_insecure", "http_host", "http_port", "max_header_bytes",
                 "cluster", "log_level")),
    ("Broker defaults and quotas (Pulsar's `broker.conf` names)", (
        "delayed_delivery_enabled", "delayed_delivery_tick_time_ms",
        "delayed_delivery_max_delay_ms", "delayed_delivery_fixed_delay_ms",
        "delayed_delivery_deliver_at_time_strict",
        "delayed_delivery_fixed_delay_detection_lookahead",
        "delayed_delivery_delay_limit_ms", "max_num_partitions_per_partitioned_topic",
        "max_topics_per_namespace", "max_subscriptions_per_topic")),
    ("Kafka and Redis", ("kafka_bootstrap", "kafka_replication_factor",
                         "kafka_compression_type", "delayed_topic_partitions",
                         "refiled_topic_partitions", "acks_topic_partitions",
                         "delivered_topic_partitions", "publish_topic_partitions",
                         "redis_url")),
    ("Encryption and secured Kafka and Redis (`dwell/security.py`)", (
        *TlsSettings.model_fields, *KafkaSecurity.model_fields,
        *RedisSecurity.model_fields)),
    ("Authentication and authorization", (
        "authentication_enabled", "authorization_enabled", "super_user_roles",
        "token_secret_key", "token_public_key", "kafka_token_secret_key",
        "kafka_token_ttl_ms", "authenticate_metrics_endpoint", "metrics_roles")),
]
# What README.md shows: the settings a deployment sets first.
FIRST: tuple[str, ...] = (
    "kafka_bootstrap", "redis_url", "env", "authentication_enabled", "authorization_enabled",
    "tls_enabled", "kafka_replication_factor", "delayed_delivery_tick_time_ms",
    "delayed_delivery_max_delay_ms", "delayed_delivery_delay_limit_ms")
PROCESSES: list[tuple[str, type[CommonSettings]]] = [
    ("Policy service", PolicySettings), ("Admission service", AdmissionSettings),
    ("Tracker", TrackerSettings), ("Spark app", SparkSettings),
]
ALL_CLASSES: list[type[BaseSettings]] = [CommonSettings, *(c for _, c in PROCESSES)]


def declared_twice() -> dict[str, list[str]]:
    """Settings two process classes each introduce: field -> the classes. A field a
    process redeclares from one of its bases (its own default port) is not counted; a
    setting two processes share belongs in a base both take."""
    where: dict[str, list[str]] = {}
    for _, cls in PROCESSES:
        inherited = {name for base in cls.__mro__[1:]
                     for name in getattr(base, "model_fields", {})}
        for name in cls.__dict__.get("__annotations__", {}):
            if name not in inherited:
                where.setdefault(name, []).append(cls.__name__)
    return {name: classes for name, classes in where.items() if len(classes) > 1}


def undocumented() -> list[str]:
    """`Class.field` of every settings field without a description."""
    return [f"{cls.__name__}.{name}" for cls in ALL_CLASSES
            for name, field in cls.model_fields.items() if not field.description]


def render_default(field: FieldInfo) -> str:
    """A field's default as a user would write it in the variable; a secret's never."""
    value: Any = field.default
    if isinstance(value, SecretStr):
        return "" if not value.get_secret_value() else "(hidden)"
    if value is None or value == "":
        return ""
    if not field.repr and isinstance(value, str) and urlparse(value).password:
        return "(hidden)"
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, float):
        text = format(value, "g")
    elif isinstance(value, (list, tuple, dict, set, frozenset)):
        text = json.dumps(sorted(value) if isinstance(value, (set, frozenset)) else value,
                          separators=(",", ":"))
    else:
        text = str(value)
    return f"`{text}`"


def table(fields: list[tuple[str, FieldInfo]]) -> list[str]:
    lines = ["| variable | default | |", "|---|---|---|"]
    for name, field in fields:
        desc = " ".join((field.description or "").split()).replace("|", "\\|")
        lines.append(f"| `DWELL_{name.upper()}` | {render_default(field)} | {desc} |")
    return lines


def own_fields(cls: type[CommonSettings]) -> list[tuple[str, FieldInfo]]:
    """The fields a process adds to CommonSettings, or redeclares with its own default."""
    common = CommonSettings.model_fields
    return [(name, field) for name, field in cls.model_fields.items()
            if name not in common or field.default != common[name].default]


def render_first() -> str:
    """README.md's text between the markers."""
    return "\n".join(["", *table([(n, CommonSettings.model_fields[n]) for n in FIRST]),
                      "", "Every setting of every process: `docs/configuration.md`.",
                      ""]) + "\n"


def render() -> str:
    """docs/configuration.md's text between the markers."""
    grouped = [name for _, names in COMMON_GROUPS for name in names]
    wrong = sorted((set(CommonSettings.model_fields) ^ set(grouped))
                   | {n for n in grouped if grouped.count(n) > 1})
    if wrong:
        raise SystemExit("dwell_dev.settings_table: place each CommonSettings field in "
                         f"exactly one COMMON_GROUPS entry ({', '.join(wrong)})")
    lines = ["", "### Every process", ""]
    for title, names in COMMON_GROUPS:
        lines += [f"**{title}**", "",
                  *table([(n, CommonSettings.model_fields[n]) for n in names]), ""]
    for title, cls in PROCESSES:
        lines += [f"### {title}", "", *table(own_fields(cls)), ""]
    return "\n".join(lines) + "\n"


def targets() -> list[tuple[Path, str]]:
    """Each file this script writes, and what goes between its markers."""
    return [(README, render_first()), (CONFIG_DOC, render())]


def split(path: Path) -> tuple[str, str, str]:
    """A file's text before, between and after the markers."""
    head, begin, rest = path.read_text().partition(BEGIN + "\n")
    body, end, tail = rest.partition(END)
    if not begin or not end:
        raise SystemExit(f"{path.name} lacks the {BEGIN} / {END} markers")
    return head, body, tail


def _rows(block: str) -> set[str]:
    return {line for line in block.splitlines() if line.startswith("| `DWELL_")}


def stale() -> str | None:
    """Why README.md's generated part is not what the classes say, or None if it is."""
    lacking = undocumented()
    if lacking:
        return ("settings without a description (add Field(..., description=...)): "
                + ", ".join(lacking[:5]) + (f" and {len(lacking) - 5} more"
                                            if len(lacking) > 5 else ""))
    for path, want in targets():
        _, body, _ = split(path)
        if body == want:
            continue
        differ = sorted({row.split("|")[1].strip() for row in _rows(body) ^ _rows(want)})
        what = (", ".join(differ[:5]) + (f" and {len(differ) - 5} more"
                                         if len(differ) > 5 else "")
                ) if differ else "headings or order"
        return (f"{path.name}'s settings tables differ from the settings classes "
                f"({what}): run make docs-settings")
    return None


def main(argv: list[str]) -> int:
    if "--check" in argv:
        why = stale()
        if why:
            print(why, file=sys.stderr)
            return 1
        return 0
    lacking = undocumented()
    if lacking:
        print(f"settings without a description: {', '.join(lacking)}", file=sys.stderr)
        return 1
    for path, want in targets():
        head, _, tail = split(path)
        path.write_text(head + BEGIN + "\n" + want + END + tail)
        print(f"wrote the settings tables in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
