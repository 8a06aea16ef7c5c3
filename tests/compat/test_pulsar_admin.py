"""The real `pulsar-admin` (Apache Pulsar 4.0's PulsarAdminTool) against the policy service:
each command's exit code and output, as a Pulsar standalone broker would give them.

The bulk runs in one JVM (AdminBatch.java); each command family also runs once as its own
`pulsar-admin` process. docs/pulsar-compatibility.md's admin table lists these commands."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from compat.conftest import PulsarAdmin, Result
from dwell.adapters.redis import connect
from dwell.index.topic import TopicIndex


@dataclass(frozen=True)
class Step:
    args: tuple[str, ...]
    endpoint: str  # the REST call(s) the command makes
    rc: int = 0
    out: str | None = None  # stdout exactly
    out_json: object = None  # stdout parsed as JSON
    out_lines: frozenset[str] | None = None  # stdout lines, in any order (Pulsar sends sets)
    out_has: dict[str, object] | None = None  # these fields of stdout's JSON object
    err: str | None = None  # text stderr must contain

    def check(self, got: Result) -> str | None:
        problems = []
        if got.rc != self.rc:
            problems.append(f"exit {got.rc}, expected {self.rc}")
        if self.out is not None and got.out != self.out:
            problems.append(f"stdout {got.out!r}, expected {self.out!r}")
        if self.out_json is not None:
            try:
                parsed = json.loads(got.out)
            except ValueError:
                parsed = got.out
            if parsed != self.out_json:
                problems.append(f"stdout {got.out!r}, expected JSON {self.out_json!r}")
        if self.out_has is not None:
            try:
                parsed = json.loads(got.out)
            except ValueError:
                parsed = {}
            if {k: parsed.get(k) for k in self.out_has} != self.out_has:
                problems.append(f"stdout {got.out[:300]!r} lacks {self.out_has!r}")
        if self.out_lines is not None and frozenset(got.out.split()) != self.out_lines:
            problems.append(f"stdout lines {got.out.split()!r}, expected {set(self.out_lines)!r}")
        if self.err is not None and self.err not in got.err:
            problems.append(f"stderr {got.err!r} lacks {self.err!r}")
        return "; ".join(problems) or None


# What a Pulsar 4.0 broker with no backlog quota answers in a topic's stats.
NO_QUOTA_STATS = {"backlogQuotaLimitSize": -1, "backlogQuotaLimitTime": -1}


def fresh_namespace_policies(delayed: dict[str, object]) -> dict[str, object]:
    """What pulsar-admin 4.0.8 prints for `namespaces policies` of a namespace made by
    `namespaces create` on a standalone broker (cluster `standalone`, 4 bundles), with a
    delayed-delivery policy set: Policies' non-null fields (Jackson's NON_NULL)."""
    return {
        "auth_policies": {"namespace_auth": {}, "destination_auth": {},
                          "subscription_auth_roles": {}},
        "replication_clusters": ["standalone"], "allowed_clusters": [],
        "bundles": {"boundaries": ["0x00000000", "0x40000000", "0x80000000", "0xc0000000",
                                   "0xffffffff"], "numBundles": 4},
        "backlog_quota_map": {}, "clusterDispatchRate": {}, "topicDispatchRate": {},
        "subscriptionDispatchRate": {}, "replicatorDispatchRate": {},
        "clusterSubscribeRate": {}, "publishMaxMessageRate": {},
        "latency_stats_sample_rate": {}, "deleted": False, "encryption_required": False,
        "delayed_delivery_policies": delayed, "subscription_auth_mode": "None",
        "offload_threshold": -1, "offload_threshold_in_seconds": -1,
        "schema_compatibility_strategy": "UNDEFINED", "is_allow_auto_update_schema": True,
        "schema_validation_enforced": False, "subscription_types_enabled": [],
        "properties": {}, "migrated": False, "clusterThatCanDeleteNamespace": "standalone",
    }


def scenario(t: str) -> list[Step]:
    """One tenant's life through pulsar-admin, the error cases included. pulsar-admin 4.0
    reads a policy into its own DelayedDeliveryPolicies, which has no fixed delay (PIP-437
    came later): what it prints has three fields whatever the service sends."""
    ns, topic, parts = f"{t}/ns", f"persistent://{t}/ns/x", f"persistent://{t}/ns/p"
    one = f"persistent://{t}/ns/one"
    t2 = t + "b"
    ns_dd = "/admin/v2/namespaces/{tenant}/{namespace}/delayedDelivery"
    topic_dd = "/admin/v2/persistent/{tenant}/{namespace}/{topic}/delayedDelivery"
    topic_base = "DELETE /admin/v2/persistent/{tenant}/{namespace}/{topic}"
    return [
        Step(("clusters", "list"),
             "GET /admin/v2/clusters, GET /admin/v2/brokers/configuration/runtime",
             out="standalone\n"),
        Step(("clusters", "list", "--current"),
             "GET /admin/v2/clusters, GET /admin/v2/brokers/configuration/runtime",
             out="standalone(*)\n"),
        Step(("tenants", "create", t, "-c", "standalone"), "PUT /admin/v2/tenants/{tenant}"),
        # the quickstart form: pulsar-admin asks for the clusters and allows them all
        Step(("tenants", "create", t2), "GET /admin/v2/clusters, PUT /admin/v2/tenants/{tenant}"),
        Step(("tenants", "get", t2), "GET /admin/v2/tenants/{tenant}",
             out_json={"adminRoles": [], "allowedClusters": ["standalone"]}),
        Step(("tenants", "update", t2, "-r", "ops"),
             "GET /admin/v2/tenants/{tenant}, POST /admin/v2/tenants/{tenant}"),
        Step(("tenants", "get", t2), "GET /admin/v2/tenants/{tenant}",
             out_json={"adminRoles": ["ops"], "allowedClusters": ["standalone"]}),
        Step(("tenants", "list"), "GET /admin/v2/tenants", rc=0),
        Step(("tenants", "create", t, "-c", "standalone"), "PUT /admin/v2/tenants/{tenant}",
             rc=1, err="Tenant already exist"),
        Step(("tenants", "create", t + "c", "-c", "nowhere"), "PUT /admin/v2/tenants/{tenant}",
             rc=1, err="Clusters do not exist"),
        Step(("tenants", "update", t + "c", "-r", "ops", "-c", "standalone"),
             "POST /admin/v2/tenants/{tenant}", rc=1, err=f"Tenant {t}c not found"),
        Step(("tenants", "delete", t2), "DELETE /admin/v2/tenants/{tenant}"),
        Step(("namespaces", "create", ns), "PUT /admin/v2/namespaces/{tenant}/{namespace}"),
        Step(("namespaces", "create", ns), "PUT /admin/v2/namespaces/{tenant}/{namespace}",
             rc=1, err="Namespace already exists"),
        Step(("namespaces", "list", t), "GET /admin/v2/namespaces/{tenant}", out=f"{ns}\n"),
        Step(("namespaces", "list", t + "c"), "GET /admin/v2/namespaces/{tenant}",
             rc=1, err="Tenant not found"),
        Step(("namespaces", "get-delayed-delivery", ns), f"GET {ns_dd}", out="null\n"),
        Step(("namespaces", "set-delayed-delivery", ns, "-e", "-t", "2s", "-md", "10s"),
             f"POST {ns_dd}"),
        Step(("namespaces", "get-delayed-delivery", ns), f"GET {ns_dd}",
             out_json={"active": True, "tickTime": 2000, "maxDeliveryDelayInMillis": 10000}),
        Step(("namespaces", "get-delayed-delivery", f"{t}/missing"), f"GET {ns_dd}",
             rc=1, err="Namespace does not exist"),
        Step(("namespaces", "set-delayed-delivery", f"{t}/missing", "-e"), f"POST {ns_dd}",
             rc=1, err="Namespace policies does not exist"),
        Step(("namespaces", "remove-delayed-delivery", f"{t}/missing"), f"DELETE {ns_dd}",
             rc=1, err="Namespace policies does not exist"),
        Step(("namespaces", "policies", ns), "GET /admin/v2/namespaces/{tenant}/{namespace}",
             out_json=fresh_namespace_policies(
                 {"tickTime": 2000, "active": True, "maxDeliveryDelayInMillis": 10000})),
        Step(("namespaces", "policies", f"{t}/missing"),
             "GET /admin/v2/namespaces/{tenant}/{namespace}",
             rc=1, err="Namespace does not exist"),
        Step(("topicPolicies", "set-delayed-delivery", topic, "-e", "-t", "3s"),
             f"POST {topic_dd}", rc=1, err=f"Topic {topic} not found"),
        Step(("topics", "create", topic), "PUT /admin/v2/persistent/{tenant}/{namespace}/{topic}"),
        Step(("topics", "create", topic), "PUT /admin/v2/persistent/{tenant}/{namespace}/{topic}",
             rc=1, err="This topic already exists"),
        Step(("topicPolicies", "set-delayed-delivery", topic, "-e", "-t", "3s"),
             f"POST {topic_dd}"),
        Step(("topicPolicies", "get-delayed-delivery", topic), f"GET {topic_dd}",
             out_json={"active": True, "tickTime": 3000, "maxDeliveryDelayInMillis": 0}),
        Step(("topicPolicies", "get-delayed-delivery", topic, "-ap"), f"GET {topic_dd}?applied",
             out_json={"active": True, "tickTime": 3000, "maxDeliveryDelayInMillis": 0}),
        Step(("topicPolicies", "set-delayed-delivery", topic, "-e", "-t", "5s", "-md", "20s",
              "-g"), f"POST {topic_dd}?isGlobal"),
        Step(("topicPolicies", "get-delayed-delivery", topic, "-g"), f"GET {topic_dd}?isGlobal",
             out_json={"active": True, "tickTime": 5000, "maxDeliveryDelayInMillis": 20000}),
        Step(("topicPolicies", "get-delayed-delivery", topic), f"GET {topic_dd}",
             out_json={"active": True, "tickTime": 3000, "maxDeliveryDelayInMillis": 0}),
        Step(("topicPolicies", "get-delayed-delivery", topic, "-ap"), f"GET {topic_dd}?applied",
             out_json={"active": True, "tickTime": 3000, "maxDeliveryDelayInMillis": 0}),
        Step(("topicPolicies", "remove-delayed-delivery", topic), f"DELETE {topic_dd}"),
        Step(("topicPolicies", "get-delayed-delivery", topic), f"GET {topic_dd}", out="null\n"),
        Step(("topicPolicies", "get-delayed-delivery", topic, "-ap"), f"GET {topic_dd}?applied",
             out_json={"active": True, "tickTime": 5000, "maxDeliveryDelayInMillis": 20000}),
        Step(("topicPolicies", "remove-delayed-delivery", topic, "-g"),
             f"DELETE {topic_dd}?isGlobal"),
        Step(("topicPolicies", "get-delayed-delivery", topic, "-ap"), f"GET {topic_dd}?applied",
             out_json={"active": True, "tickTime": 2000, "maxDeliveryDelayInMillis": 10000}),
        Step(("topics", "stats", topic),
             "GET /admin/v2/persistent/{tenant}/{namespace}/{topic}/stats",
             out_has={"delayedMessageIndexSizeInBytes": 0, "subscriptions": {},
                      **NO_QUOTA_STATS, "oldestBacklogMessageAgeSeconds": -1,
                      "deduplicationStatus": "Disabled"}),
        Step(("topics", "stats", f"persistent://{t}/ns/nope"),
             "GET /admin/v2/persistent/{tenant}/{namespace}/{topic}/stats",
             rc=1, err=f"Topic persistent://{t}/ns/nope not found"),
        Step(("topics", "create-partitioned-topic", parts, "-p", "3"),
             "PUT /admin/v2/persistent/{tenant}/{namespace}/{topic}/partitions"),
        Step(("topics", "partitioned-stats", parts),
             "GET /admin/v2/persistent/{tenant}/{namespace}/{topic}/partitioned-stats",
             out_has={"metadata": {"partitions": 3, "deleted": False}, "subscriptions": {},
                      "partitions": {}, **NO_QUOTA_STATS,
                      # Pulsar's sum of the partitions keeps its own 0 over their -1.
                      "oldestBacklogMessageAgeSeconds": 0}),
        Step(("topics", "partitioned-stats", topic),
             "GET /admin/v2/persistent/{tenant}/{namespace}/{topic}/partitioned-stats",
             rc=1, err=f"Partitioned Topic {topic} not found"),
        Step(("topics", "create", f"{parts}-partition-1"),
             "PUT /admin/v2/persistent/{tenant}/{namespace}/{topic}",
             rc=1, err="This topic already exists"),
        Step(("topics", "list", ns), "GET /admin/v2/persistent/{tenant}/{namespace}, "
             "GET /admin/v2/non-persistent/{tenant}/{namespace}",
             out_lines=frozenset([topic] + [f"{parts}-partition-{i}" for i in range(3)])),
        Step(("topics", "list-partitioned-topics", ns),
             "GET /admin/v2/persistent/{tenant}/{namespace}/partitioned, "
             "GET /admin/v2/non-persistent/{tenant}/{namespace}/partitioned", out=f"{parts}\n"),
        # Adding partitions (update-partitioned-topic); fewer is refused, as is a topic
        # that is not partitioned.
        Step(("topics", "update-partitioned-topic", parts, "-p", "2"),
             "POST /admin/v2/persistent/{tenant}/{namespace}/{topic}/partitions",
             rc=1, err="Desired partitions 2 can't be less than the current partitions 3."),
        Step(("topics", "update-partitioned-topic", topic, "-p", "4"),
             "POST /admin/v2/persistent/{tenant}/{namespace}/{topic}/partitions",
             rc=1, err=f"Topic {topic} is not the partitioned topic."),
        Step(("topics", "update-partitioned-topic", parts, "-p", "4"),
             "POST /admin/v2/persistent/{tenant}/{namespace}/{topic}/partitions", out=""),
        Step(("topics", "update-partitioned-topic", parts, "-p", "4", "-f"),
             "POST /admin/v2/persistent/{tenant}/{namespace}/{topic}/partitions?force", out=""),
        Step(("topics", "get-partitioned-topic-metadata", parts),
             "GET /admin/v2/persistent/{tenant}/{namespace}/{topic}/partitions",
             out_has={"partitions": 4}),
        Step(("topics", "list", f"{t}/missing"), "GET /admin/v2/persistent/{tenant}/{namespace}",
             rc=1, err="Namespace does not exist"),
        Step(("topicPolicies", "set-delayed-delivery", f"{parts}-partition-0", "-e", "-t", "1s"),
             f"POST {topic_dd}", rc=1, err="Not allowed to set/get topic policy for a partition"),
        # Each delete refuses the other's kind of topic (409), and a partition's name (412).
        Step(("topics", "delete", parts), topic_base,
             out=f"Failed to delete topic: {parts}. Exception: org.apache.pulsar.client.admin."
                 f"PulsarAdminException$ConflictException: {parts} is a partitioned topic, "
                 "instead of calling delete topic, please call delete-partitioned-topic.\n"),
        Step(("topics", "delete-partitioned-topic", topic), f"{topic_base}/partitions",
             rc=1, err=f"{topic} is a non-partitioned topic. Instead of calling "
                       "delete-partitioned-topic please call delete."),
        Step(("topics", "delete-partitioned-topic", f"{parts}-partition-0"),
             f"{topic_base}/partitions",
             rc=1, err="Partitioned Topic Name should not contain '-partition-'"),
        Step(("topics", "delete", topic), topic_base),
        # pulsar-admin reports a failed delete on stdout and exits 0
        Step(("topics", "delete", topic), topic_base,
             out=f"Failed to delete topic: {topic}. Exception: org.apache.pulsar.client.admin."
                 f"PulsarAdminException$NotFoundException: Topic {topic} not found\n"),
        Step(("namespaces", "delete", ns), "DELETE /admin/v2/namespaces/{tenant}/{namespace}",
             rc=1, err="Cannot delete non empty namespace"),
        Step(("topics", "delete-partitioned-topic", parts),
             "DELETE /admin/v2/persistent/{tenant}/{namespace}/{topic}/partitions"),
        # One partition: a partitioned topic all the same (its ready topic cannot tell).
        Step(("topics", "create-partitioned-topic", one, "-p", "1"),
             "PUT /admin/v2/persistent/{tenant}/{namespace}/{topic}/partitions"),
        Step(("topics", "get-partitioned-topic-metadata", one),
             "GET /admin/v2/persistent/{tenant}/{namespace}/{topic}/partitions",
             out_has={"partitions": 1}),
        Step(("topics", "partitioned-stats", one),
             "GET /admin/v2/persistent/{tenant}/{namespace}/{topic}/partitioned-stats",
             out_has={"metadata": {"partitions": 1, "deleted": False}}),
        Step(("topics", "list", ns), "GET /admin/v2/persistent/{tenant}/{namespace}, "
             "GET /admin/v2/non-persistent/{tenant}/{namespace}", out=f"{one}-partition-0\n"),
        Step(("topics", "list-partitioned-topics", ns),
             "GET /admin/v2/persistent/{tenant}/{namespace}/partitioned, "
             "GET /admin/v2/non-persistent/{tenant}/{namespace}/partitioned", out=f"{one}\n"),
        Step(("topics", "delete-partitioned-topic", one),
             "DELETE /admin/v2/persistent/{tenant}/{namespace}/{topic}/partitions"),
        Step(("topics", "list", ns), "GET /admin/v2/persistent/{tenant}/{namespace}, "
             "GET /admin/v2/non-persistent/{tenant}/{namespace}", out=""),
        Step(("namespaces", "remove-delayed-delivery", ns), f"DELETE {ns_dd}"),
        Step(("namespaces", "get-delayed-delivery", ns), f"GET {ns_dd}", out="null\n"),
        Step(("tenants", "delete", t), "DELETE /admin/v2/tenants/{tenant}",
             rc=1, err="The tenant still has active namespaces"),
        Step(("namespaces", "delete", ns), "DELETE /admin/v2/namespaces/{tenant}/{namespace}"),
        Step(("namespaces", "delete", ns), "DELETE /admin/v2/namespaces/{tenant}/{namespace}",
             rc=1, err=f"Namespace {ns} does not exist."),
        Step(("tenants", "delete", t), "DELETE /admin/v2/tenants/{tenant}"),
        Step(("tenants", "delete", t), "DELETE /admin/v2/tenants/{tenant}",
             rc=1, err="Tenant doesn't exist"),
    ]


def coverage(steps: list[Step]) -> tuple[int, set[str], set[str]]:
    """(command lines, distinct `pulsar-admin <family> <command>`, distinct endpoints)."""
    commands = {"pulsar-admin " + " ".join(s.args[:2]) for s in steps}
    endpoints = {e.strip().split("?")[0] for s in steps for e in s.endpoint.split(",")}
    return len(steps), commands, endpoints


def _failures(steps: list[Step], results: list[Result]) -> list[str]:
    return [f"pulsar-admin {' '.join(step.args)}: {problem}"
            for step, got in zip(steps, results, strict=True)
            if (problem := step.check(got))]


def test_pulsar_admin_scenario(pulsar_admin: PulsarAdmin, unique: str, tmp_path: Path) -> None:
    steps = scenario(unique)
    results = pulsar_admin.batch([s.args for s in steps], tmp_path)
    failures = _failures(steps, results)
    listed = set(results[[s.args for s in steps].index(("tenants", "list"))].out.split())
    if not {unique, unique + "b"} <= listed:
        failures.append(f"pulsar-admin tenants list: {sorted(listed)} lacks {unique}")
    lines, commands, endpoints = coverage(steps)
    print(f"\npulsar-admin scenario: {lines} command lines, {len(commands)} commands, "
          f"{len(endpoints)} endpoints, {len(steps) - len(failures)} as Pulsar answers them")
    assert not failures, "\n".join(failures)


def test_each_command_family_as_its_own_process(pulsar_admin: PulsarAdmin, unique: str) -> None:
    """The `pulsar-admin` entry point itself, once per command family: its exit code is
    what scripts see (PulsarAdminTool halts the JVM with it)."""
    steps = [
        Step(("clusters", "list"), "", out="standalone\n"),
        Step(("tenants", "create", unique), ""),
        Step(("namespaces", "create", f"{unique}/ns"), ""),
        Step(("topics", "create", f"persistent://{unique}/ns/x"), ""),
        Step(("topicPolicies", "get-delayed-delivery", f"persistent://{unique}/ns/x", "-ap"), "",
             out_json={"active": True, "tickTime": 1000, "maxDeliveryDelayInMillis": 0}),
        Step(("tenants", "create", unique), "", rc=1, err="Tenant already exist"),
    ]
    failures = _failures(steps, [pulsar_admin.cli(*s.args) for s in steps])
    assert not failures, "\n".join(failures)


def test_topic_stats_carry_the_delayed_index(pulsar_admin: PulsarAdmin, policy, tracker,  # type: ignore[no-untyped-def]
                                             redis_url: str, unique: str) -> None:
    """`pulsar-admin topics stats` on the admin URL: the tracker's index figures in
    Pulsar's TopicStats, per subscription and summed for the topic as Pulsar sums them."""
    topic = f"persistent://{unique}/ns/x"
    with httpx.Client(base_url=policy.url, timeout=30) as http:
        for url in (f"/admin/v2/tenants/{unique}", f"/admin/v2/namespaces/{unique}/ns",
                    f"/admin/v2/persistent/{unique}/ns/x"):
            assert http.put(url).status_code == 204, url
    later = int(time.time() * 1000) + 3_600_000
    TopicIndex(connect(redis_url), topic).add([(0, o, later, 1000) for o in range(40)])
    with httpx.Client(base_url=tracker.url, timeout=30) as http:
        for sub in ("s1", "s2"):
            assert http.put(f"/v1/topics/persistent/{unique}/ns/x/subscriptions/{sub}",
                            json={}).status_code == 200
    got = pulsar_admin.cli("topics", "stats", topic)
    assert (got.rc, got.err) == (0, "")
    stats = json.loads(got.out)
    subs = stats["subscriptions"]
    assert sorted(subs) == ["s1", "s2"]
    assert [subs[s]["msgDelayed"] for s in ("s1", "s2")] == [40, 40]
    size = subs["s1"]["delayedMessageIndexSizeInBytes"]
    assert size > 0 and subs["s2"]["delayedMessageIndexSizeInBytes"] == size
    assert stats["delayedMessageIndexSizeInBytes"] == 2 * size
    # The broker that owns the topic, as Pulsar names it (host:port): the policy service.
    assert stats["ownerBroker"] == policy.url.removeprefix("http://")


def test_a_topic_with_subscriptions_is_deleted_only_by_force(
        pulsar_admin: PulsarAdmin, policy, tracker,  # type: ignore[no-untyped-def]
        unique: str, tmp_path: Path) -> None:
    """`topics delete` and `delete-partitioned-topic` refuse a topic with subscriptions (here
    registered at the tracker, as the SDK registers them) as Pulsar 4.0's broker does, and
    `-f` deletes it with them."""
    topic, parts = f"persistent://{unique}/ns/x", f"persistent://{unique}/ns/p"
    with httpx.Client(base_url=policy.url, timeout=30) as http:
        for url in (f"/admin/v2/tenants/{unique}", f"/admin/v2/namespaces/{unique}/ns",
                    f"/admin/v2/persistent/{unique}/ns/x"):
            assert http.put(url).status_code == 204, url
        assert http.put(f"/admin/v2/persistent/{unique}/ns/p/partitions",
                        json=2).status_code == 204
    with httpx.Client(base_url=tracker.url, timeout=30) as http:
        for local, sub in (("x", "s2"), ("x", "s1"), ("p", "s")):
            assert http.put(f"/v1/topics/persistent/{unique}/ns/{local}/subscriptions/{sub}",
                            json={}).status_code == 200
    delete = "DELETE /admin/v2/persistent/{tenant}/{namespace}/{topic}"
    steps = [
        # pulsar-admin reports a failed delete on stdout and exits 0
        Step(("topics", "delete", topic), delete,
             out=f"Failed to delete topic: {topic}. Exception: org.apache.pulsar.client.admin."
                 "PulsarAdminException$PreconditionFailedException: Topic has subscriptions: "
                 "[s1, s2]\n"),
        Step(("topics", "delete", topic, "-f"), f"{delete}?force"),
        Step(("topics", "delete-partitioned-topic", parts), f"{delete}/partitions",
             rc=1, err="Topic has active producers/subscriptions"),
        Step(("topics", "delete-partitioned-topic", parts, "-f"), f"{delete}/partitions?force"),
        Step(("topics", "delete", topic), delete,
             out=f"Failed to delete topic: {topic}. Exception: org.apache.pulsar.client.admin."
                 f"PulsarAdminException$NotFoundException: Topic {topic} not found\n"),
    ]
    failures = _failures(steps, pulsar_admin.batch([s.args for s in steps], tmp_path))
    assert not failures, "\n".join(failures)
