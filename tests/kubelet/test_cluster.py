"""dwell installed by its chart on a node that runs its pods: every pod Ready by its own
probes under the chart's security context, `helm test`, each pod's /metrics through its
Service, a nack redelivered by the Spark app whose executors run in pods, and the fault
rows of deleting a pod of each kind, of `helm upgrade` and of the node's containerd
stopped for 20 s (lost, early, SDK duplicates 0).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from dwell.client import Consumer, Message, Producer, PublishError
from dwell.core.topics import TopicName
from dwell_dev import kubenode
from dwell_dev.kubeclient import CHART, wait_for
from dwell_dev.workload import (
    Checker,
    Generator,
    Row,
    SdkReader,
    format_table,
    now_ms,
    outcome,
    wait_delivered,
)

from .conftest import RELEASE, Cluster, unique

# An executor first: the driver's go with it (they are owned by its pod).
COMPONENTS = ("spark-executor", "admission", "policy", "tracker", "spark")
ROWS: list[Row] = []


def component(pod: dict[str, object]) -> str:
    labels = pod["metadata"]["labels"]  # type: ignore[index]
    return str(labels["app.kubernetes.io/component"])  # type: ignore[index]


def make_namespace(c: Cluster, tenant: str) -> None:
    headers = {"Authorization": f"Bearer {c.token}"}
    with httpx.Client(base_url=c.service_url("policy", 8081), headers=headers,
                      timeout=10) as http:
        for method, path, body in (
                ("PUT", f"/admin/v2/tenants/{tenant}", {"adminRoles": [],
                                                        "allowedClusters": []}),
                ("PUT", f"/admin/v2/namespaces/{tenant}/ns", None),
                ("POST", f"/admin/v2/namespaces/{tenant}/ns/delayedDelivery",
                 {"active": True, "tickTime": 1000, "maxDeliveryDelayInMillis": 600_000})):
            r = http.request(method, path, json=body)
            assert r.status_code < 300, (path, r.status_code, r.text)


def test_every_pod_runs_ready_on_the_real_node(cluster: Cluster) -> None:
    print("\n" + cluster.table())
    pods = cluster.pods()
    kinds = sorted(component(p) for p in pods)
    assert kinds == sorted(["admission", "policy", "tracker", "spark", "spark-executor",
                            "spark-executor"]), kinds
    for p in pods:
        name = p["metadata"]["name"]
        assert p["spec"]["nodeName"] == "dwell-node-0", name
        assert p["status"]["phase"] == "Running", name
        for cs in p["status"]["containerStatuses"]:
            assert cs["ready"] and "running" in cs["state"], (name, cs)
        # What the kubelet enforced: non-root, read-only root filesystem.
        assert p["spec"]["securityContext"]["runAsNonRoot"] is True, name
        for ctr in p["spec"]["containers"]:
            assert ctr["securityContext"]["readOnlyRootFilesystem"] is True, (name, ctr["name"])


def test_helm_test_delivers_a_delayed_message_through_the_services(cluster: Cluster) -> None:
    got = cluster.kube.helm("test", RELEASE, "--namespace", cluster.namespace,
                            "--timeout", "5m", timeout=330)
    print(got.stdout)
    assert "Phase:          Succeeded" in got.stdout


def test_each_pods_metrics_are_scraped_through_its_service(cluster: Cluster) -> None:
    """As Prometheus's endpoints discovery does: every ready endpoint of each dwell
    Service that has a port named metrics or http."""
    scraped = {}
    slices = cluster.kube.items(
        f"/apis/discovery.k8s.io/v1/namespaces/{cluster.namespace}/endpointslices")
    for s in slices:
        svc = s["metadata"]["labels"]["kubernetes.io/service-name"]
        for port in s.get("ports") or []:
            if port.get("name") not in ("http", "metrics"):
                continue
            for ep in s.get("endpoints") or []:
                for addr in ep["addresses"]:
                    r = httpx.get(f"http://{addr}:{port['port']}/metrics", timeout=10,
                                  headers={"Authorization": f"Bearer {cluster.token}"})
                    assert r.status_code == 200, (svc, addr, r.status_code, r.text[:200])
                    assert "# TYPE dwell_" in r.text, (svc, addr, r.text[:200])
                    scraped[f"{svc} {addr}:{port['port']}"] = len(r.text.splitlines())
    print("\n".join(f"{k}: {v} lines" for k, v in sorted(scraped.items())))
    for name in ("admission", "policy", "tracker", "spark"):
        assert any(k.startswith(f"{RELEASE}-{name}") for k in scraped), (name, scraped)


def receive(consumer: Consumer, message_id: str, timeout_s: float) -> Message | None:
    """The message with this id, once it comes (others are left unacknowledged)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        msg = consumer.receive(0.5)
        if msg is not None and msg.message_id == message_id:
            return msg
    return None


def test_a_nack_is_redelivered_by_the_spark_app_in_the_cluster(cluster: Cluster) -> None:
    tenant = unique()
    make_namespace(cluster, tenant)
    topic = f"persistent://{tenant}/ns/nack"
    env = cluster.client_env()
    with Consumer(topic, "sub", token=cluster.token, bootstrap=env["DWELL_KAFKA_BOOTSTRAP"],
                  tracker_url=env["DWELL_TRACKER_URL"], policy_url=env["DWELL_POLICY_URL"],
                  initial_position="earliest") as consumer, \
            Producer(topic, admission_url=env["DWELL_ADMISSION_URL"],
                     token=cluster.token) as producer:
        deadline = time.monotonic() + 30
        while True:
            try:
                mid = producer.send(b"nack me", deliver_after=1000)
                break
            except PublishError:
                if time.monotonic() > deadline:  # the namespace reaches admission late
                    raise
                time.sleep(0.5)
        first = receive(consumer, mid, 60)
        assert first is not None, "the delayed message never arrived"
        consumer.negative_acknowledge(first)
        again = receive(consumer, mid, 120)
        assert again is not None, "the nacked message was not redelivered"
        assert again.redelivery_count >= 1
        consumer.acknowledge(again)
    # The executors ran tasks: the Spark app's work is done in their pods.
    tasks = {p["metadata"]["name"]: cluster.pod_log(p["metadata"]["name"]).count(
        "Finished task") for p in cluster.pods("app.kubernetes.io/component=spark-executor")}
    print(f"tasks finished per executor pod: {tasks}")
    assert tasks and all(n > 0 for n in tasks.values()), tasks


@pytest.fixture()
def workload(cluster: Cluster) -> Iterator[tuple[Generator, Checker, SdkReader]]:
    tenant = unique()
    make_namespace(cluster, tenant)
    topics = [f"persistent://{tenant}/ns/t{i}" for i in range(2)]
    env = cluster.client_env()
    gen = Generator(env["DWELL_ADMISSION_URL"], topics, rate=40, max_delay_ms=15_000,
                    token=cluster.token)
    checker = Checker(cluster.kafka_bootstrap, [TopicName.parse(t).kafka_topic for t in topics])
    sdk = SdkReader(topics[0], "faults", env, cluster.stack.log_dir)
    checker.start()
    sdk.start()
    # Until admission has the namespace (it follows the policy feed).
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with httpx.Client(base_url=env["DWELL_ADMISSION_URL"], timeout=10,
                          headers={"Authorization": f"Bearer {cluster.token}"}) as http:
            r = http.post(f"/topics/persistent/{tenant}/ns/probe",
                          json={"messages": [{"payload": "probe"}]})
        if r.status_code == 200:
            break
        time.sleep(0.3)
    gen.start()
    try:
        yield gen, checker, sdk
    finally:
        gen.stop()
        checker.stopping.set()
        sdk.stop()


def finish(scenario: str, gen: Generator, checker: Checker, sdk: SdkReader,
           fault_ms: int) -> Row:
    gen.stop()
    pub = gen.out
    sdk_ids = {i for i, t in pub.topic_of.items() if t == sdk.topic}
    wait_delivered(pub, checker, 240, sdk, sdk_ids)
    time.sleep(2)
    checker.stop()
    sdk.stop()
    row = outcome(scenario, pub, checker, sdk, fault_ms)
    ROWS.append(row)
    print("\n" + format_table(ROWS))
    assert not pub.other_errors, pub.other_errors[:5]
    return row


def test_deleting_a_pod_of_each_kind_loses_nothing(
        cluster: Cluster, workload: tuple[Generator, Checker, SdkReader]) -> None:
    gen, checker, sdk = workload
    time.sleep(8)
    fault_ms = now_ms()
    for kind in COMPONENTS:
        pod = next(p for p in cluster.pods(f"app.kubernetes.io/component={kind}")
                   if not p["metadata"].get("deletionTimestamp"))
        name = pod["metadata"]["name"]
        r = cluster.kube.api.delete(f"/api/v1/namespaces/{cluster.namespace}/pods/{name}")
        assert r.status_code == 200, r.text
        print(f"deleted {name}")
        time.sleep(6)
    time.sleep(20)
    row = finish("delete a pod of each kind", gen, checker, sdk, fault_ms)
    assert (row.lost, row.early, row.sdk_duplicates) == (0, 0, 0), row
    assert row.accepted > 500, row
    wait_for(cluster.all_ready, 300, "every pod Ready")


def test_helm_upgrade_rolls_only_the_changed_pods(
        cluster: Cluster, workload: tuple[Generator, Checker, SdkReader]) -> None:
    gen, checker, sdk = workload
    wait_for(cluster.all_ready, 300, "every pod Ready")
    before = {p["metadata"]["uid"]: component(p) for p in cluster.pods()}
    time.sleep(5)
    fault_ms = now_ms()
    cluster.kube.helm("upgrade", RELEASE, str(CHART), "--namespace", cluster.namespace,
                      "--reuse-values",
                      "--set", "tracker.config.stall_timeout_ms=150000",
                      "--wait", "--timeout", "5m", timeout=330)
    time.sleep(10)
    row = finish("helm upgrade (tracker)", gen, checker, sdk, fault_ms)
    after = {p["metadata"]["uid"]: component(p) for p in cluster.pods()}
    replaced = sorted({before[u] for u in before.keys() - after.keys()})
    print(f"replaced: {replaced}")
    assert replaced == ["tracker"], replaced
    assert (row.lost, row.early, row.sdk_duplicates) == (0, 0, 0), row


def test_the_nodes_containerd_stopped_for_20s_loses_nothing(
        cluster: Cluster, workload: tuple[Generator, Checker, SdkReader]) -> None:
    """containerd away: the containers keep running under their shims, the kubelet cannot
    start or check anything until it is back."""
    gen, checker, sdk = workload
    wait_for(cluster.all_ready, 300, "every pod Ready")
    time.sleep(5)
    fault_ms = now_ms()
    tier = cluster.kube.tier
    assert tier.stop("containerd")
    time.sleep(20)
    tier.start("containerd")
    kubenode.wait_socket(tier.containerd_sock)
    time.sleep(15)
    row = finish("containerd stopped 20 s", gen, checker, sdk, fault_ms)
    assert (row.lost, row.early, row.sdk_duplicates) == (0, 0, 0), row
    wait_for(cluster.all_ready, 300, "every pod Ready")
