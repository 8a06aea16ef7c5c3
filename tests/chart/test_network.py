"""The chart's optional network pieces and pinned images: the NetworkPolicies (one per
component, off by default), the Ingress (off by default) and images pulled by digest.
The NetworkPolicies are checked by what they allow: a small evaluator of Kubernetes'
NetworkPolicy rules (pod selectors, ip-less peers, ports) answers who may reach whom."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
import yaml

from .test_chart import CHART, KUBE_VERSIONS, by_kind, render, run_helm, workloads

NP_ON = ["--set", "networkPolicy.enabled=true"]
EXTERNAL = ["--set", "redis.enabled=false", "--set", "redis.external.host=redis.example",
            "--set", "redis.external.port=6380",
            "--set", "kafka.enabled=false",
            "--set", "kafka.external.bootstrap=k0.example:9092\\,k1.example:9094"]
COMPONENTS = {"policy", "admission", "tracker", "spark", "spark-executor", "redis", "kafka"}
DIGEST = "sha256:" + "0123456789abcdef" * 4


def pod_labels(docs: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    """Labels of every kind of pod the release runs, by component: the workloads', the
    helm test pod's and the Spark executors' (their pod template)."""
    out = {w["metadata"]["labels"]["app.kubernetes.io/component"]:
           w["spec"]["template"]["metadata"]["labels"] for w in workloads(docs)}
    for p in docs:
        if p["kind"] == "Pod":
            out[p["metadata"]["labels"]["app.kubernetes.io/component"]] = p["metadata"]["labels"]
    template = yaml.safe_load(by_kind(docs, "ConfigMap")["rel-dwell-spark-executor"]["data"][
        "executor.yaml"])
    # Spark adds its own labels to the template's.
    out["spark-executor"] = template["metadata"]["labels"] | {"spark-role": "executor"}
    return out


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, selector
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def rule_allows(rule: dict[str, Any], direction: str, peer: dict[str, str] | None,
                port: int) -> bool:
    """One ingress (`from`) or egress (`to`) rule: `peer` is a pod's labels, or None for an
    address outside the cluster's pods."""
    ports = rule.get("ports")
    if ports is not None and not any(p.get("port") == port for p in ports):
        return False
    peers = rule.get(direction)
    if peers is None:
        return True
    for p in peers:
        assert set(p) <= {"podSelector", "ipBlock", "namespaceSelector"}, p
        if ("podSelector" in p and "namespaceSelector" not in p and peer is not None
                and selects(p["podSelector"], peer)):
            return True
    return False


def allowed(policies: list[dict[str, Any]], src: dict[str, str] | None,
            dst: dict[str, str] | None, port: int) -> bool:
    """Whether a connection from pod `src` to pod `dst` on `port` passes: the egress of
    every policy selecting src, and the ingress of every policy selecting dst."""
    for labels, kind, direction, peer in ((src, "Egress", "to", dst),
                                          (dst, "Ingress", "from", src)):
        if labels is None:
            continue
        chosen = [p["spec"] for p in policies if selects(p["spec"]["podSelector"], labels)
                  and kind in p["spec"]["policyTypes"]]
        if chosen and not any(rule_allows(r, direction, peer, port)
                              for s in chosen for r in s.get(kind.lower(), [])):
            return False
    return True


@pytest.fixture(scope="module")
def np_docs(helm: str) -> list[dict[str, Any]]:
    """The chart rendered with the NetworkPolicies on, once for the module."""
    return render(helm, *NP_ON)


def test_on_by_default(helm: str) -> None:
    docs = render(helm)
    policies = by_kind(docs, "NetworkPolicy")
    assert {p["metadata"]["labels"]["app.kubernetes.io/component"]
            for p in policies.values()} == COMPONENTS
    assert not by_kind(docs, "Ingress")
    images = {c["image"] for w in workloads(docs) for c in w["spec"]["template"]["spec"][
        "containers"]}
    assert images and not [i for i in images if "@" in i]
    off = render(helm, "--set", "networkPolicy.enabled=false")
    assert not by_kind(off, "NetworkPolicy")


def test_in_chart_redis_and_kafka_take_only_dwells_pods(
        helm: str, np_docs: list[dict[str, Any]]) -> None:
    """The in-chart Redis and Kafka authenticate no one: by default no pod but dwell's own
    (and the helm test hook's, which reads Kafka) reaches them; a pod networkPolicy.clients
    names reaches Kafka, never Redis."""
    policies = list(by_kind(np_docs, "NetworkPolicy").values())
    labels = pod_labels(np_docs)
    stranger = {"app": "stranger"}
    for dst, port in (("kafka", 9092), ("kafka", 9093), ("redis", 6379)):
        assert not allowed(policies, stranger, labels[dst], port), (dst, port)
    assert allowed(policies, labels["test"], labels["kafka"], 9092)
    named = render(helm, *NP_ON,
                   "--set", "networkPolicy.clients[0].podSelector.matchLabels.app=producer")
    policies = list(by_kind(named, "NetworkPolicy").values())
    assert allowed(policies, {"app": "producer"}, labels["kafka"], 9092)
    assert not allowed(policies, {"app": "producer"}, labels["redis"], 6379)
    assert not allowed(policies, stranger, labels["kafka"], 9092)


@pytest.mark.parametrize("kube", KUBE_VERSIONS)
def test_network_objects_are_valid_kubernetes(helm: str, kube: str) -> None:
    docs = render(helm, *NP_ON, "--set", "ingress.enabled=true",
                  "--set", "ingress.tls[0].secretName=dwell-tls",
                  "--set", "ingress.tls[0].hosts[0]=dwell.example.com", kube=kube)
    objs = [d for d in docs if d["kind"] in ("NetworkPolicy", "Ingress")]
    assert len(objs) == len(COMPONENTS) + 1
    for doc in objs:
        kubernetes_validate.validate(doc, kube, strict=True)


def test_one_network_policy_per_component_selecting_its_pods(np_docs: list[dict[str, Any]]
                                                             ) -> None:
    docs = np_docs
    policies = by_kind(docs, "NetworkPolicy")
    labels = pod_labels(docs)
    got = {p["metadata"]["labels"]["app.kubernetes.io/component"]: p for p in policies.values()}
    assert set(got) == COMPONENTS
    for component, policy in got.items():
        spec = policy["spec"]
        assert spec["policyTypes"] == ["Ingress", "Egress"], component
        chosen = {c for c, lv in labels.items() if selects(spec["podSelector"], lv)}
        assert chosen == {component}, (component, chosen)
        # Every pod resolves names.
        assert allowed([policy], labels[component], None, 53), component


# Who may reach whom with the in-chart Redis and Kafka (source, destination, port).
REACHABLE = [
    ("admission", "redis", 6379), ("admission", "kafka", 9092), ("policy", "kafka", 9092),
    ("policy", "tracker", 8083), ("admission", "tracker", 8083), ("tracker", "redis", 6379),
    ("spark", "kafka", 9092),
    ("spark-executor", "spark", 7078), ("spark-executor", "spark", 7079),
    ("spark", "spark-executor", 40000), ("spark-executor", "spark-executor", 40000),
    ("spark-executor", "redis", 6379), ("spark-executor", "kafka", 9092),
    ("kafka", "kafka", 9093), ("test", "policy", 8081), ("test", "admission", 8082),
    ("test", "tracker", 8083), ("test", "spark", 8084),
]
UNREACHABLE = [
    ("admission", "tracker", 8084), ("admission", "policy", 8081), ("redis", "kafka", 9092),
    ("kafka", "redis", 6379), ("tracker", "spark", 8084), ("policy", "kafka", 9093),
    ("admission", "redis", 6380), ("test", "redis", 6379), ("tracker", "spark-executor", 1),
    ("policy", "spark", 7078),
]


@pytest.mark.parametrize(("src", "dst", "port", "want"),
                         [(*c, True) for c in REACHABLE] + [(*c, False) for c in UNREACHABLE])
def test_network_policies_allow_what_dwell_uses_and_nothing_else(
        np_docs: list[dict[str, Any]], src: str, dst: str, port: int, want: bool) -> None:
    docs = np_docs
    labels = pod_labels(docs)
    assert allowed(list(by_kind(docs, "NetworkPolicy").values()), labels[src], labels[dst],
                   port) is want


def test_clients_and_prometheus_reach_the_http_ports(helm: str,
                                                    np_docs: list[dict[str, Any]]) -> None:
    docs = np_docs
    policies = list(by_kind(docs, "NetworkPolicy").values())
    labels = pod_labels(docs)
    outside = {"app": "producer"}
    # No clients named: any source reaches the HTTP ports, and no other port (the in-chart
    # Kafka's neither: it authenticates no one).
    for dst, port in (("policy", 8081), ("admission", 8082), ("tracker", 8083),
                      ("spark", 8084)):
        assert allowed(policies, outside, labels[dst], port), dst
    assert not allowed(policies, outside, labels["kafka"], 9092)
    assert not allowed(policies, outside, labels["redis"], 6379)
    assert not allowed(policies, outside, labels["spark"], 7078)
    # Named clients and Prometheus: only they.
    docs = render(helm, *NP_ON,
                  "--set", "networkPolicy.clients[0].podSelector.matchLabels.app=producer",
                  "--set", "networkPolicy.metrics[0].podSelector.matchLabels.app=prometheus")
    policies = list(by_kind(docs, "NetworkPolicy").values())
    prometheus, stranger = {"app": "prometheus"}, {"app": "stranger"}
    for dst, port in (("policy", 8081), ("admission", 8082), ("tracker", 8083)):
        assert allowed(policies, outside, labels[dst], port), dst
        assert allowed(policies, prometheus, labels[dst], port), dst
        assert not allowed(policies, stranger, labels[dst], port), dst
    assert allowed(policies, prometheus, labels["spark"], 8084)
    assert not allowed(policies, outside, labels["spark"], 8084)
    assert allowed(policies, outside, labels["kafka"], 9092)
    assert not allowed(policies, prometheus, labels["kafka"], 9092)


def test_external_redis_and_kafka_are_reached_on_their_ports(helm: str) -> None:
    docs = render(helm, *NP_ON, *EXTERNAL)
    policies = list(by_kind(docs, "NetworkPolicy").values())
    components = {p["metadata"]["labels"]["app.kubernetes.io/component"] for p in policies}
    assert components == COMPONENTS - {"redis", "kafka"}
    labels = pod_labels(docs)
    for src in ("policy", "admission", "tracker", "spark", "spark-executor"):
        for port in (6380, 9092, 9094):
            assert allowed(policies, labels[src], None, port), (src, port)
        assert not allowed(policies, labels[src], None, 6379), src
    # Named destinations: the rules carry them.
    docs = render(helm, *NP_ON, *EXTERNAL,
                  "--set", "networkPolicy.externalTo[0].ipBlock.cidr=10.1.0.0/16")
    egress = by_kind(docs, "NetworkPolicy")["rel-dwell-admission"]["spec"]["egress"]
    kafka_rule = next(r for r in egress if {"port": 9094, "protocol": "TCP"} in r["ports"])
    assert kafka_rule["to"] == [{"ipBlock": {"cidr": "10.1.0.0/16"}}]


def test_spark_driver_reaches_the_api_server(np_docs: list[dict[str, Any]]) -> None:
    docs = np_docs
    policies = list(by_kind(docs, "NetworkPolicy").values())
    labels = pod_labels(docs)
    assert allowed(policies, labels["spark"], None, 443)
    assert allowed(policies, labels["spark"], None, 6443)
    assert not allowed(policies, labels["spark-executor"], None, 443)
    assert not allowed(policies, labels["tracker"], None, 443)


def test_ingress_routes_to_the_services(helm: str) -> None:
    docs = render(helm, "--set", "ingress.enabled=true", "--set", "ingress.className=nginx",
                  "--set", "ingress.annotations.nginx\\.ingress\\.kubernetes\\.io/"
                           "proxy-body-size=8m",
                  "--set", "ingress.tls[0].secretName=dwell-tls",
                  "--set", "ingress.tls[0].hosts[0]=dwell.example.com")
    (ing,) = by_kind(docs, "Ingress").values()
    spec = ing["spec"]
    assert spec["ingressClassName"] == "nginx"
    assert ing["metadata"]["annotations"] == {"nginx.ingress.kubernetes.io/proxy-body-size": "8m"}
    assert spec["tls"] == [{"secretName": "dwell-tls", "hosts": ["dwell.example.com"]}]
    (rule,) = spec["rules"]
    assert rule["host"] == "dwell.example.com"
    services = {s["metadata"]["name"]: {p["port"] for p in s["spec"]["ports"]}
                for s in by_kind(docs, "Service").values()}
    routes = {}
    for path in rule["http"]["paths"]:
        backend = path["backend"]["service"]
        assert backend["port"]["number"] in services[backend["name"]], path
        routes[path["path"]] = backend["name"]
    assert routes == {"/admin": "rel-dwell-policy", "/topics": "rel-dwell-admission",
                      "/v1": "rel-dwell-tracker"}


def test_images_are_pulled_by_digest_when_one_is_set(helm: str) -> None:
    args = [a for key in ("image", "redis.image", "kafka.image", "spark.image")
            for a in ("--set", f"{key}.digest={DIGEST}")]
    docs = render(helm, *args)
    images = {c["image"] for w in workloads(docs) for c in w["spec"]["template"]["spec"][
        "containers"]}
    images |= {c["image"] for p in docs if p["kind"] == "Pod" for c in p["spec"]["containers"]}
    assert images == {f"ghcr.io/dwell-dev/dwell@{DIGEST}",
                      f"ghcr.io/dwell-dev/dwell-spark@{DIGEST}",
                      f"docker.io/library/redis@{DIGEST}", f"docker.io/apache/kafka@{DIGEST}"}
    # The executors run the driver's image.
    driver = by_kind(docs, "Deployment")["rel-dwell-spark"]["spec"]["template"]["spec"][
        "containers"][0]
    assert f"spark.kubernetes.container.image=ghcr.io/dwell-dev/dwell-spark@{DIGEST}" in \
        driver["args"]


@pytest.mark.parametrize(("args", "says"), [
    (["--set", "image.digest=latest"], "image.digest: Does not match pattern"),
    (["--set", "spark.image.digest=sha256:abc"], "spark.image.digest: Does not match pattern"),
    (["--set", "ingress.hosts[0].paths[0].service=redis",
      "--set", "ingress.hosts[0].paths[0].path=/",
      "--set", "ingress.hosts[0].paths[0].pathType=Prefix"], "ingress.hosts.0.paths.0.service"),
    (["--set", "networkPolicy.kubeAPIServer.ports[0]=0"], "networkPolicy.kubeAPIServer.ports"),
    (["--set", "networkPolicy.enable=true"], "Additional property enable is not allowed"),
])
def test_bad_network_values_are_refused(helm: str, args: list[str], says: str) -> None:
    got = run_helm(helm, "template", "rel", str(CHART), "--kube-version", "1.31.0", *args)
    assert got.returncode != 0
    assert says in got.stderr, got.stderr
