"""The Helm chart (charts/dwell), checked without a cluster: `helm lint --strict`, every
rendered object against the Kubernetes schemas of the oldest and newest supported version
(kubernetes-validate, offline, strict), values.schema.json refusing bad values, and the
contracts between the chart and the code: each container's environment is accepted by
that process's real settings class, the values' defaults equal the code's, ports are
docs/architecture.md's, and every pod runs non-root on a read-only root filesystem."""

from __future__ import annotations

import base64
import copy
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from dwell import endpoints
from dwell.settings import CommonSettings
from dwell_dev import chart_schema, devinstall

ROOT = Path(__file__).resolve().parent.parent.parent
CHART = ROOT / "charts" / "dwell"

# Chart.yaml's kubeVersion is >=1.27; kubernetes-validate 1.37 knows up to 1.37.
KUBE_VERSIONS = ("1.27.0", "1.37.0")
# Custom resources: no schema in kubernetes-validate. The Prometheus Operator's are checked
# by their own tests below (the rules with promtool, the selector against the Services),
# cert-manager's Certificate by test_secure_certificate_probes_and_scrapes, the Spark
# Operator's SparkApplication by tests/kube against its CRD on an API server.
CUSTOM_KINDS = {"ServiceMonitor", "PrometheusRule", "Certificate", "SparkApplication"}
# The ports the chart's helper dwell.ports spells (templates/_ports.tpl), by its names.
CHART_PORTS = {"policy": endpoints.POLICY_PORT, "admission": endpoints.ADMISSION_PORT,
               "tracker": endpoints.TRACKER_PORT, "spark": endpoints.SPARK_METRICS_PORT,
               "redis": endpoints.REDIS_PORT, "kafka": endpoints.KAFKA_PORT,
               "kafkaController": endpoints.KAFKA_CONTROLLER_PORT,
               # Only the chart's: the driver's fixed ports its executors connect back to
               # (a pod's network policy names them), and DNS.
               "sparkDriver": 7078, "sparkBlockManager": 7079, "dns": 53}
# dwell's own processes: each serves HTTP (the Spark app its metrics) on its port.
PORTS = {name: CHART_PORTS[name] for name in ("policy", "admission", "tracker", "spark")}
# The chart's scenarios: its defaults and each charts/dwell/{examples,ci}/<name>-values.yaml
# (which tests/kube also installs or dry-runs on a real API server), and `secure` below.
VARIANTS = {"defaults": [], **{p.name.removesuffix("-values.yaml"): ["-f", str(p)]
                               for p in sorted((CHART / "examples").glob("*-values.yaml"))}}
# ci/'s install as they are, as chart-testing installs them: the token Secret render()
# names is taken away again, and they make their own keys.
CI = {p.name.removesuffix("-values.yaml"): ["-f", str(p), "--set", "auth.existingSecret="]
      for p in sorted((CHART / "ci").glob("*-values.yaml"))}
VARIANTS.update(CI)
EXTERNAL = VARIANTS["external"]
EVERYTHING = VARIANTS["everything"]
# HTTPS from cert-manager, SASL_SSL Kafka and TLS Redis with an ACL user, from Secrets.
SECURE = [*EXTERNAL, "--set", "tls.enabled=true", "--set", "tls.certManager.enabled=true",
          "--set", "tls.certManager.issuerRef.name=ca-issuer",
          "--set", "kafka.security.protocol=SASL_SSL",
          "--set", "kafka.security.saslMechanism=SCRAM-SHA-512",
          "--set", "kafka.security.username=dwell",
          "--set", "kafka.security.existingSecret=dwell-kafka",
          "--set", "kafka.security.caSecret=kafka-ca",
          "--set", "redis.auth.username=dwell", "--set", "redis.tls.enabled=true",
          "--set", "redis.tls.caSecret=redis-ca", "--set", "metrics.serviceMonitor.enabled=true"]
VARIANTS["secure"] = SECURE
# Authentication is on by default and needs the Secret holding the token key: every
# rendering below names one (a later --set overrides it).
TOKEN_KEYS = ["--set", "auth.existingSecret=dwell-token-keys"]


def run_helm(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm, *args], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, HELM_CACHE_HOME="/tmp/dwell-helm-cache"))


def render(helm: str, *args: str, kube: str = "1.31.0") -> list[dict[str, Any]]:
    got = run_helm(helm, "template", "rel", str(CHART), "--namespace", "ns",
                   "--kube-version", kube, *TOKEN_KEYS, *args)
    assert got.returncode == 0, got.stderr
    return [doc for doc in yaml.safe_load_all(got.stdout) if doc]


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def workloads(docs: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for d in docs:
        if d["kind"] in ("Deployment", "StatefulSet"):
            yield d


def container_env(container: dict[str, Any], password: str = "s3cret") -> dict[str, str]:
    """The container's env as the kubelet would give it: $(VAR) refers to earlier vars,
    secrets read as `password`."""
    env: dict[str, str] = {}
    for e in container.get("env", []):
        if "valueFrom" in e:
            env[e["name"]] = password
        else:
            env[e["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env.get(m[1], m[0]), e["value"])
    return env


# ---------------------------------------------------------------- lint and schemas


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_helm_lint_strict(helm: str, variant: str) -> None:
    got = run_helm(helm, "lint", str(CHART), "--strict", "--kube-version", "1.31.0",
                   *TOKEN_KEYS, *VARIANTS[variant])
    assert got.returncode == 0, got.stdout + got.stderr
    assert "0 chart(s) failed" in got.stdout


@pytest.mark.parametrize("kube", KUBE_VERSIONS)
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_object_is_valid_kubernetes(helm: str, variant: str, kube: str) -> None:
    docs = render(helm, *VARIANTS[variant], kube=kube)
    checked = 0
    for doc in docs:
        if doc["kind"] in CUSTOM_KINDS:
            continue
        try:
            kubernetes_validate.validate(doc, kube, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']} on {kube}: {exc.message} "
                        f"at {'.'.join(map(str, exc.path))}")
        checked += 1
    assert checked >= 15



# ---------------------------------------------------------------- ports

PORTS_HELPER = CHART / "templates" / "_ports.tpl"
# A port where a template would spell one: a YAML port field, a host:port, or any of the
# ports dwell.ports names.
_ANY_PORT = "|".join(str(p) for p in sorted(set(CHART_PORTS.values())))
PORT_LITERAL = re.compile(rf"\b(({_ANY_PORT})\b|(port|containerPort|targetPort|number):"
                          rf"\s*\d|port=\d|[\w.}}]:\d{{2,5}}\b)")


def helper_ports() -> dict[str, int]:
    """The table of the helper dwell.ports, as YAML."""
    text = PORTS_HELPER.read_text()
    body = re.search(r'define "dwell\.ports" -}}(.*?){{- end -}}', text, re.S)
    assert body, "no dwell.ports in _ports.tpl"
    return yaml.safe_load(body[1])


def port_literals(text: str) -> list[str]:
    return [f"line {n}: {line.strip()}" for n, line in enumerate(text.splitlines(), 1)
            if PORT_LITERAL.search(line)]


def test_the_chart_spells_each_port_once_as_the_code_does() -> None:
    """The chart's ports are dwell.endpoints' (what the processes listen on without the
    chart), named once in the helper dwell.ports; every other template asks the helper."""
    assert helper_ports() == CHART_PORTS
    templates = [p for p in sorted((CHART / "templates").iterdir())
                 if p.is_file() and p != PORTS_HELPER]
    assert len(templates) > 30
    found = {p.name: hits for p in templates if (hits := port_literals(p.read_text()))}
    assert found == {}


@pytest.mark.parametrize("line", ["containerPort: 8080", "      port: 443",
                                  "advertised.listeners=PLAINTEXT://{{ $host }}:9092",
                                  'value: "8084"', "number: 80",
                                  "spark.driver.port=7078"])
def test_a_spelled_port_is_found(line: str) -> None:
    assert port_literals(f"a: b\n{line}\n") == [f"line 2: {line.strip()}"]


def test_the_helper_gives_each_named_port_and_refuses_an_unknown_name(helm: str,
                                                                     tmp_path: Path) -> None:
    chart = tmp_path / "dwell"
    shutil.copytree(CHART, chart)
    probe = chart / "templates" / "zz-ports.yaml"
    probe.write_text("".join(f'{name}: {{{{ include "dwell.port" "{name}" }}}}\n'
                             for name in CHART_PORTS))
    got = run_helm(helm, "template", "rel", str(chart), *TOKEN_KEYS,
                   "--show-only", "templates/zz-ports.yaml")
    assert got.returncode == 0, got.stderr
    assert yaml.safe_load(got.stdout) == CHART_PORTS
    probe.write_text('x: {{ include "dwell.port" "kafak" }}\n')
    got = run_helm(helm, "template", "rel", str(chart), *TOKEN_KEYS)
    assert got.returncode != 0
    assert 'no port named "kafak"' in got.stderr

def test_values_schema_is_what_the_settings_say() -> None:
    """values.schema.json is generated from the settings classes: re-run the script."""
    assert chart_schema.main(["--check"]) == 0, "run .venv/bin/python -m dwell_dev.chart_schema"


def test_every_value_is_described_in_the_schema() -> None:
    """Each `## @param` of values.yaml names a key of the schema and describes it there;
    every setting under a `config:` map is described by its env var and its field."""
    text = chart_schema.VALUES.read_text()
    assert chart_schema.unknown_params(text) == []
    found = chart_schema.keys_of(json.loads(chart_schema.SCHEMA.read_text()))
    params = chart_schema.params(text)
    assert len(params) > 100
    for key, said in params.items():
        assert found[key]["description"] == said, key
    config = {k: v for k, v in found.items() if ".config." in k or k.startswith("config.")}
    assert config and all(v["description"].startswith("DWELL_") and ": " in v["description"]
                          for v in config.values())
    # A misspelt key is named.
    assert chart_schema.unknown_params("## @param tracker.replicaCont Replicas\n") == [
        "tracker.replicaCont"]


@pytest.mark.parametrize(("args", "says"), [
    (["--set", "tracker.config.restage_lead=5000"],
     "tracker.config: Additional property restage_lead is not allowed"),
    (["--set", "tracker.config.restage_lead_ms=5"],
     "tracker.config.restage_lead_ms: Must be greater than or equal to 1000"),
    (["--set", "config.env=prod"], "config.env"),
    (["--set", "admission.replicaCount=0"], "admission.replicaCount"),
    (["--set", "spark.master=yarn"], "spark.master"),
    (["--set", "kafka.clusterId=short"], "kafka.clusterId"),
    (["--set", "tracker.config.tracker_group_id=acme"],
     "tracker.config.tracker_group_id: Does not match pattern '^dwell-.'"),
    (["--set", "policy.config.policy_audit_group=dwell-"], "policy.config.policy_audit_group"),
    (["--set", "config.redis_url=redis://x"],
     "config: Additional property redis_url is not allowed"),
    (["--set", "unknownTop=1"], "Additional property unknownTop is not allowed"),
    (["--set", "redis.enabled=false"], "redis.external.host is required"),
    (["--set", "kafka.enabled=false"], "kafka.external.bootstrap is required"),
])
def test_bad_values_are_refused_naming_the_field(helm: str, args: list[str], says: str) -> None:
    got = run_helm(helm, "template", "rel", str(CHART), "--kube-version", "1.31.0",
                   *TOKEN_KEYS, *args)
    assert got.returncode != 0
    assert says in got.stderr, got.stderr


# ---------------------------------------------------------------- chart <-> code


def test_values_defaults_equal_the_code_defaults() -> None:
    """A value in values.yaml that differs from the code's default would change dwell's
    behaviour on Kubernetes only: each must be the same (env, and allow_insecure, which
    names what the in-chart servers run without, are the exceptions)."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    differ: list[str] = []
    for key, value in values["config"].items():
        default = CommonSettings.model_fields[key].default
        if key not in ("env", "allow_insecure") and value != default:
            differ.append(f"config.{key}: {value!r} != {default!r}")
    assert values["config"]["env"] == "production"
    for component, model in chart_schema.COMPONENT_SETTINGS.items():
        for key, value in values[component]["config"].items():
            default = model.model_fields[key].default
            if value != default:
                differ.append(f"{component}.config.{key}: {value!r} != {default!r}")
    assert not differ


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_each_process_accepts_its_rendered_environment(helm: str, variant: str) -> None:
    """Instantiate the real settings class of each container from its rendered env: a
    bad value, a validator (restage chunk > lead) or production without a Redis password
    fails here, not in a crash-looping pod."""
    docs = render(helm, *VARIANTS[variant])
    processes = [(w["metadata"]["labels"]["app.kubernetes.io/component"], container)
                 for w in workloads(docs) for container in w["spec"]["template"]["spec"][
                     "containers"]]
    # spark.mode operator: the Spark Operator starts the driver from the SparkApplication.
    processes += [("spark", d["spec"]["driver"]) for d in docs
                  if d["kind"] == "SparkApplication"]
    seen = set()
    for component, container in processes:
        if component not in PORTS:
            continue
        env = container_env(container)
        saved = dict(os.environ)
        try:
            os.environ.update(env)
            settings = chart_schema.COMPONENT_SETTINGS[component]()
        finally:
            os.environ.clear()
            os.environ.update(saved)
        assert settings.env == "production"
        assert ":s3cret@" in settings.redis_url
        assert settings.http_host == "0.0.0.0"
        port = settings.spark_metrics_port if component == "spark" else settings.http_port
        assert port == PORTS[component]
        assert {"name": "http", "containerPort": port} in [
            {k: v for k, v in p.items() if k != "protocol"} for p in container["ports"]]
        if variant in ("external", "secure", "production"):
            assert settings.kafka_bootstrap == "kafka-0.example:9092,kafka-1.example:9092"
            assert settings.kafka_replication_factor == 3
            scheme = "rediss" if variant in ("secure", "production") else "redis"
            assert settings.redis_url == f"{scheme}://:s3cret@redis.example:6379/0"
        if variant in ("secure", "production"):
            assert settings.tls_enabled and settings.kafka_security_protocol == "SASL_SSL"
            assert settings.kafka_sasl_password is not None
            assert settings.kafka_sasl_password.get_secret_value() == "s3cret"
            assert settings.redis_username == "dwell"
            mounts = {m["mountPath"] for m in container["volumeMounts"]}
            for path in (settings.tls_certificate_file_path, settings.tls_key_file_path,
                         settings.tls_trust_certs_file_path, settings.kafka_ssl_ca_location,
                         settings.redis_tls_ca_cert_file):
                assert str(Path(path).parent) in mounts, path
            probes = [container[p]["httpGet"] for p in
                      ("startupProbe", "livenessProbe", "readinessProbe")]
            assert all(p["scheme"] == "HTTPS" for p in probes)
        else:
            assert not settings.tls_enabled
            # The in-chart Kafka, locked by default (tests/chart/test_kafka_locked.py).
            locked = any(d["metadata"]["name"] == "rel-dwell-kafka-users" for d in docs)
            assert settings.kafka_security_protocol == (
                "SASL_PLAINTEXT" if locked else "PLAINTEXT")
            if locked:
                assert settings.kafka_sasl_username == f"dwell-{component}"
        seen.add(component)
    assert seen == set(PORTS)


def test_config_values_reach_the_processes(helm: str) -> None:
    docs = render(helm, "--set", "config.delayed_delivery_tick_time_ms=250",
                  "--set", "tracker.config.restage_max_records=2000000",
                  "--set", "spark.config.spark_checkpoint_dir=s3a://bucket/dwell")
    envs = {w["metadata"]["labels"]["app.kubernetes.io/component"]:
            container_env(w["spec"]["template"]["spec"]["containers"][0])
            for w in workloads(docs)}
    assert all(envs[c]["DWELL_DELAYED_DELIVERY_TICK_TIME_MS"] == "250" for c in PORTS)
    assert envs["tracker"]["DWELL_RESTAGE_MAX_RECORDS"] == "2000000"
    assert envs["policy"]["DWELL_TRACKER_URL"] == "http://rel-dwell-tracker:8083"
    assert "DWELL_RESTAGE_MAX_RECORDS" not in envs["admission"]
    # Set once: the config value replaces the chart's volume path, not a second entry.
    spark_env = [e["name"] for e in by_kind(docs, "Deployment")["rel-dwell-spark"]["spec"]
                 ["template"]["spec"]["containers"][0]["env"]]
    assert spark_env.count("DWELL_SPARK_CHECKPOINT_DIR") == 1
    assert envs["spark"]["DWELL_SPARK_CHECKPOINT_DIR"] == "s3a://bucket/dwell"


# ---------------------------------------------------------------- security


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_pods_run_non_root_with_nothing_secret_in_the_manifests(helm: str, variant: str
                                                                ) -> None:
    docs = render(helm, *VARIANTS[variant])
    pods = [(w["metadata"]["name"], w["spec"]["template"]["spec"]) for w in workloads(docs)]
    pods += [(p["metadata"]["name"], p["spec"]) for p in docs if p["kind"] == "Pod"]
    # The inner loop's values run as root on a writable root filesystem, so that live
    # update can write into the image (charts/dwell/examples/dev-values.yaml says so).
    for name, spec in pods:
        dev = variant == "dev" and not name.endswith(("-kafka", "-redis"))
        assert spec["securityContext"]["runAsNonRoot"] is not dev, name
        assert (spec["securityContext"]["runAsUser"] == 0) is dev, name
        for c in spec["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False, name
            assert sc["capabilities"]["drop"] == ["ALL"], name
            # The in-chart Kafka's scripts write under /opt/kafka; nothing else may.
            writable = variant == "dev" or (name.endswith("-kafka") and c["name"] == "kafka")
            assert sc["readOnlyRootFilesystem"] is not writable, name
            assert not c["image"].endswith(":latest"), name
            if "resources" in c:
                assert c["resources"]["limits"]["memory"], name
        # Only the Spark driver talks to the API server (it creates its executors).
        assert spec["automountServiceAccountToken"] is name.endswith("-spark"), name
    # The locked Kafka's start script spells the JAAS login, whose password is the shell
    # variable it reads from the Secret's file (tests/chart/test_kafka_locked.py).
    shown = copy.deepcopy(docs)
    for d in shown:
        if d["kind"] == "ConfigMap" and "start.sh" in d.get("data", {}):
            d["data"]["start.sh"] = d["data"]["start.sh"].replace('password=\\"$pw\\"', "")
    text = yaml.safe_dump_all(shown)
    assert "password" not in text.lower().replace("redis-password", "").replace(
        "redis_password", "").replace("kafka_sasl_password", "").replace(
        "kafka-password", ""), (
        "a password-like value in the manifests")
    secrets = by_kind(docs, "Secret")
    # Spark's RPC secret: the chart's in every variant (none names an existingSecret).
    spark_secret = secrets.pop("rel-dwell-spark-auth")
    assert len(spark_secret["data"]["spark-auth-secret"]) >= 64  # 48 random chars, base64
    # The token keys: the chart's in ci/'s variants (auth.generateKeys).
    assert (secrets.pop("rel-dwell-token-keys", None) is not None) == (variant in CI)
    if variant in ("external", "secure", "production"):
        assert not secrets  # the user's existingSecret
    else:
        secrets.pop("rel-dwell-kafka-users", None)
        (secret,) = secrets.values()
        assert len(secret["data"]["redis-password"]) >= 40  # 32 random chars, base64


def test_generated_secrets_stay_in_their_secrets(helm: str) -> None:
    """The secrets the chart makes (the in-chart Redis password, Spark's RPC secret, the
    token keys, base64 as they are random bytes) appear in their Secrets and nowhere
    else: not in a ConfigMap (the executors' pod template, dashboards), not in an env
    value."""
    docs = render(helm, *EVERYTHING, "--set", "auth.existingSecret=",
                  "--set", "auth.generateKeys=true")
    secrets = by_kind(docs, "Secret")
    values = [base64.b64decode(secrets["rel-dwell-redis"]["data"]["redis-password"]).decode(),
              base64.b64decode(secrets["rel-dwell-spark-auth"]["data"][
                  "spark-auth-secret"]).decode(),
              *secrets["rel-dwell-token-keys"]["data"].values()]
    others = [d for d in docs if d["kind"] != "Secret"]
    assert by_kind(others, "ConfigMap")
    for d in others:
        text = yaml.safe_dump(d)
        assert not [v for v in values if v in text], f"{d['kind']}/{d['metadata']['name']}"


def spark_auth(pod: dict[str, Any], container: dict[str, Any]) -> str:
    """The path of the Spark RPC secret file a pod mounts from the Spark auth Secret."""
    (vol,) = [v for v in pod["volumes"] if v["name"] == "spark-auth"]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "spark-auth"]
    assert mount["readOnly"] is True
    secret = vol["secret"]
    return f"{mount['mountPath']}/{secret['items'][0]['path']}@{secret['secretName']}"


@pytest.mark.parametrize("existing", ["", "my-spark-auth"])
def test_spark_rpc_is_authenticated_in_both_modes(helm: str, existing: str) -> None:
    """spark.authenticate with a secret file the driver and the executors mount from one
    Secret (the chart's or existingSecret), not Spark's generated secret, which it passes
    to executors in an environment variable; RPC traffic encrypted too."""
    extra = ["--set", f"spark.authenticate.existingSecret={existing}"] if existing else []
    docs = render(helm, *extra)
    secret = existing or "rel-dwell-spark-auth"
    assert (secret in by_kind(docs, "Secret")) is not bool(existing)
    deploy = by_kind(docs, "Deployment")["rel-dwell-spark"]
    pod = deploy["spec"]["template"]["spec"]
    (driver,) = pod["containers"]
    args = driver["args"]
    confs = dict(a.split("=", 1) for a in args[args.index("--driver-memory") + 2:-1]
                 if a != "--conf")
    assert confs["spark.authenticate"] == "true"
    assert confs["spark.network.crypto.enabled"] == "true"
    path = confs["spark.authenticate.secret.file"]
    assert spark_auth(pod, driver) == f"{path}@{secret}"
    template = yaml.safe_load(by_kind(docs, "ConfigMap")["rel-dwell-spark-executor"]["data"][
        "executor.yaml"])
    (executor,) = template["spec"]["containers"]
    assert spark_auth(template["spec"], executor) == f"{path}@{secret}"
    # An executor reads the secret file only when it starts knowing spark.master (a
    # SPARK_JAVA_OPT_* variable becomes a JVM option): tests/kubelet runs it.
    master = {e["name"]: e.get("value") for e in executor["env"]}["SPARK_JAVA_OPT_DWELL_MASTER"]
    assert args[args.index("--master") + 1] == "$(DWELL_SPARK_MASTER)"
    assert master == f"-Dspark.master={container_env(driver)['DWELL_SPARK_MASTER']}"

    app = by_kind(render(helm, *extra, "--set", "spark.mode=operator"),
                  "SparkApplication")["rel-dwell-spark"]["spec"]
    assert app["sparkConf"]["spark.authenticate"] == "true"
    assert app["sparkConf"]["spark.authenticate.secret.file"] == path
    for role in ("driver", "executor"):
        assert spark_auth(app, app[role]) == f"{path}@{secret}", role
    assert {"name": "SPARK_JAVA_OPT_DWELL_MASTER", "value": master} in app["executor"]["env"]

    off = render(helm, "--set", "spark.authenticate.enabled=false")
    assert "rel-dwell-spark-auth" not in by_kind(off, "Secret")
    assert "spark.authenticate" not in str(by_kind(off, "Deployment")["rel-dwell-spark"])
    assert "SPARK_JAVA_OPT_DWELL_MASTER" not in str(by_kind(off, "ConfigMap"))


@pytest.mark.parametrize("mode", ["client", "operator"])
def test_spark_driver_rbac_is_its_namespace_and_what_spark_needs(helm: str, mode: str
                                                                 ) -> None:
    """Spark on Kubernetes makes and removes executor pods, the config maps and services
    of its executors and their volume claims: a Role in the release's namespace for those
    resources only, bound to the driver's ServiceAccount; nothing cluster-wide."""
    docs = render(helm, *EVERYTHING, "--set", f"spark.mode={mode}")
    assert not [d for d in docs if d["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    roles = by_kind(docs, "Role")
    assert set(roles) == {"rel-dwell-spark"}
    for rule in roles["rel-dwell-spark"]["rules"]:
        assert rule["apiGroups"] == [""], rule
        assert set(rule["resources"]) <= {"pods", "configmaps", "services",
                                          "persistentvolumeclaims"}, rule
        assert "*" not in rule["verbs"] and "escalate" not in rule["verbs"], rule
    (binding,) = by_kind(docs, "RoleBinding").values()
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": "rel-dwell-spark"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "rel-dwell-spark",
                                    "namespace": "ns"}]


def test_secure_certificate_probes_and_scrapes(helm: str) -> None:
    docs = render(helm, *SECURE)
    (cert,) = by_kind(docs, "Certificate").values()
    assert cert["spec"]["secretName"] == "rel-dwell-tls"
    assert cert["spec"]["issuerRef"]["name"] == "ca-issuer"
    for component in PORTS:
        assert f"rel-dwell-{component}.ns.svc" in cert["spec"]["dnsNames"]
    (monitor,) = by_kind(docs, "ServiceMonitor").values()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"]["ca"]["secret"] == {"name": "rel-dwell-tls", "key": "ca.crt"}
    executor = yaml.safe_load(by_kind(docs, "ConfigMap")["rel-dwell-spark-executor"]["data"]
                              ["executor.yaml"])
    env = {e["name"]: e for e in executor["spec"]["containers"][0]["env"]}
    assert env["DWELL_KAFKA_SASL_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": "dwell-kafka", "key": "kafka-password"}
    envs = {w["metadata"]["labels"]["app.kubernetes.io/component"]:
            container_env(w["spec"]["template"]["spec"]["containers"][0])
            for w in workloads(docs)}
    assert envs["policy"]["DWELL_TRACKER_URL"] == "https://rel-dwell-tracker:8083"
    # An existing Secret replaces the Certificate.
    docs = render(helm, *SECURE, "--set", "tls.existingSecret=my-tls")
    assert not by_kind(docs, "Certificate")
    volumes = [v for w in workloads(docs) for v in w["spec"]["template"]["spec"]["volumes"]
               if v["name"] == "tls"]
    assert volumes and all(v["secret"]["secretName"] == "my-tls" for v in volumes)


def test_existing_secret_is_used_as_given(helm: str) -> None:
    docs = render(helm, "--set", "redis.auth.existingSecret=mine",
                  "--set", "redis.auth.existingSecretPasswordKey=pw",
                  "--set", "spark.authenticate.existingSecret=my-spark-auth",
                  "--set", "kafka.auth.existingSecret=my-kafka-users")
    assert not by_kind(docs, "Secret")
    for w in workloads(docs):
        for c in w["spec"]["template"]["spec"]["containers"]:
            for e in c.get("env", []):
                if e["name"] == "REDIS_PASSWORD":
                    assert e["valueFrom"]["secretKeyRef"] == {"name": "mine", "key": "pw"}


def test_auth_on_by_default_needs_the_token_key_secret(helm: str) -> None:
    got = run_helm(helm, "template", "rel", str(CHART), "--kube-version", "1.31.0")
    assert got.returncode != 0
    assert "auth.enabled is true (the default) but auth.existingSecret is empty" in got.stderr


@pytest.mark.parametrize(("args", "setting", "path"), [
    ([], "DWELL_TOKEN_PUBLIC_KEY", "file:///etc/dwell/auth/public.key"),
    (["--set", "auth.secretKeyKey=secret.key"], "DWELL_TOKEN_SECRET_KEY",
     "file:///etc/dwell/auth/secret.key"),
])
def test_auth_reads_its_key_from_the_mounted_secret(helm: str, args: list[str], setting: str,
                                                    path: str) -> None:
    docs = render(helm, "--set", "auth.superUserRoles={admin,ops}", *args)
    for w in workloads(docs):
        component = w["metadata"]["labels"]["app.kubernetes.io/component"]
        spec = w["spec"]["template"]["spec"]
        env = container_env(spec["containers"][0])
        # The Spark driver checks the tokens of ack events (dwell_spark.invalid).
        if component not in ("policy", "admission", "tracker", "spark"):
            assert "DWELL_AUTHENTICATION_ENABLED" not in env, component
            continue
        assert env["DWELL_AUTHENTICATION_ENABLED"] == env["DWELL_AUTHORIZATION_ENABLED"] == "true"
        assert env["DWELL_SUPER_USER_ROLES"] == "admin,ops"
        assert env[setting] == path
        assert env["DWELL_KAFKA_TOKEN_SECRET_KEY"] == "file:///etc/dwell/auth/kafka-token.key"
        assert {"name": "token-keys", "mountPath": "/etc/dwell/auth", "readOnly": True} in (
            spec["containers"][0]["volumeMounts"])
        (volume,) = [v for v in spec["volumes"] if v["name"] == "token-keys"]
        assert volume["secret"]["secretName"] == "dwell-token-keys"
    # Its executors run the check: they read the key from the same Secret.
    (template,) = [d for d in docs if d["kind"] == "ConfigMap"
                   and d["metadata"]["name"].endswith("-spark-executor")]
    pod = yaml.safe_load(template["data"]["executor.yaml"])["spec"]
    assert {"name": "token-keys", "mountPath": "/etc/dwell/auth", "readOnly": True} in (
        pod["containers"][0]["volumeMounts"])
    (volume,) = [v for v in pod["volumes"] if v["name"] == "token-keys"]
    assert volume["secret"]["secretName"] == "dwell-token-keys"


def test_a_public_key_needs_a_kafka_token_key(helm: str) -> None:
    got = run_helm(helm, "template", "rel", str(CHART), "--kube-version", "1.31.0",
                   *TOKEN_KEYS, "--set", "auth.kafkaTokenSecretKeyKey=")
    assert got.returncode != 0
    assert "auth.kafkaTokenSecretKeyKey is required with auth.publicKeyKey" in got.stderr
    # An HMAC secret for users' tokens signs Kafka tokens too.
    docs = render(helm, "--set", "auth.kafkaTokenSecretKeyKey=",
                  "--set", "auth.secretKeyKey=secret.key")
    for w in workloads(docs):
        env = container_env(w["spec"]["template"]["spec"]["containers"][0])
        assert "DWELL_KAFKA_TOKEN_SECRET_KEY" not in env


def test_helm_test_hook_authenticates_with_the_test_token_secret(helm: str) -> None:
    def hook(*args: str) -> tuple[dict[str, str], dict[str, Any]]:
        (pod,) = [d for d in render(helm, *args) if d["kind"] == "Pod"]
        assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
        return container_env(pod["spec"]["containers"][0]), pod["spec"]

    env, spec = hook("--set", "auth.testToken.existingSecret=dwell-test-token")
    assert env["DWELL_AUTH_PARAMS"] == "file:///etc/dwell/test-token/token"
    assert {"name": "test-token", "mountPath": "/etc/dwell/test-token", "readOnly": True} in (
        spec["containers"][0]["volumeMounts"])
    (volume,) = [v for v in spec["volumes"] if v["name"] == "test-token"]
    assert volume["secret"] == {"secretName": "dwell-test-token",
                                "items": [{"key": "token", "path": "token"}]}
    # Without the Secret (or with auth off) the hook runs without a token.
    for args in ([], ["--set", "auth.enabled=false", "--set",
                      "auth.testToken.existingSecret=dwell-test-token"]):
        env, spec = hook(*args)
        assert "DWELL_AUTH_PARAMS" not in env, args
        assert all(v["name"] != "test-token" for v in spec["volumes"]), args


def test_generated_token_keys_are_random_mounted_everywhere_and_sign_the_hooks_token(
        helm: str) -> None:
    """auth.generateKeys (ci/'s files): one Secret with two random 32-byte keys, the HS256
    key and the Kafka token key, read by every process that checks tokens (the executors
    too); the helm test hook mounts only the HS256 key and signs its own super-user token."""
    docs = render(helm, *CI["minimal"], "--set", "auth.superUserRoles={ops,admin}")
    (secret,) = [d for d in docs if d["kind"] == "Secret"
                 and d["metadata"]["name"] == "rel-dwell-token-keys"]
    keys = {k: base64.b64decode(v) for k, v in secret["data"].items()}
    assert sorted(keys) == ["kafka-token.key", "secret.key"]
    assert all(len(v) == 32 for v in keys.values()) and len(set(keys.values())) == 2
    checked = 0
    for w in workloads(docs):
        spec = w["spec"]["template"]["spec"]
        env = container_env(spec["containers"][0])
        if env.get("DWELL_AUTHENTICATION_ENABLED") != "true":
            continue
        assert env["DWELL_TOKEN_SECRET_KEY"] == "file:///etc/dwell/auth/secret.key"
        assert env["DWELL_KAFKA_TOKEN_SECRET_KEY"] == "file:///etc/dwell/auth/kafka-token.key"
        assert "DWELL_TOKEN_PUBLIC_KEY" not in env
        (volume,) = [v for v in spec["volumes"] if v["name"] == "token-keys"]
        assert volume["secret"]["secretName"] == "rel-dwell-token-keys"
        checked += 1
    assert checked == 4
    (template,) = [d for d in docs if d["kind"] == "ConfigMap"
                   and d["metadata"]["name"].endswith("-spark-executor")]
    pod = yaml.safe_load(template["data"]["executor.yaml"])["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "token-keys"]
    assert volume["secret"]["secretName"] == "rel-dwell-token-keys"
    (hook,) = [d for d in docs if d["kind"] == "Pod"]
    env = container_env(hook["spec"]["containers"][0])
    assert env["DWELL_SMOKE_SIGNING_KEY"] == "file:///etc/dwell/auth/secret.key"
    assert env["DWELL_SMOKE_ROLE"] == "ops"
    assert "DWELL_AUTH_PARAMS" not in env
    (volume,) = [v for v in hook["spec"]["volumes"] if v["name"] == "token-keys"]
    assert volume["secret"]["items"] == [{"key": "secret.key", "path": "secret.key"}]


@pytest.mark.parametrize(("args", "hook_env"), [
    # A Secret named wins: nothing is made, and the hook takes the test token if any.
    (["--set", "auth.existingSecret=dwell-token-keys",
      "--set", "auth.testToken.existingSecret=dwell-test-token"], "DWELL_AUTH_PARAMS"),
    # A test token given wins over signing one.
    (["--set", "auth.testToken.existingSecret=dwell-test-token"], "DWELL_AUTH_PARAMS"),
    (["--set", "auth.enabled=false"], None),
])
def test_generated_keys_give_way(helm: str, args: list[str], hook_env: str | None) -> None:
    docs = render(helm, *CI["minimal"], *args)
    made = [d for d in docs if d["kind"] == "Secret" and "token-keys" in d["metadata"]["name"]]
    generated = "auth.existingSecret=dwell-token-keys" not in args and (
        "auth.enabled=false" not in args)
    assert bool(made) == generated
    (hook,) = [d for d in docs if d["kind"] == "Pod"]
    env = container_env(hook["spec"]["containers"][0])
    assert "DWELL_SMOKE_SIGNING_KEY" not in env
    assert (hook_env in env) if hook_env else "DWELL_AUTH_PARAMS" not in env


def test_no_token_key_secret_names_both_ways_out(helm: str) -> None:
    got = run_helm(helm, "template", "rel", str(CHART), "--kube-version", "1.31.0",
                   "--set", "auth.generateKeys=false")
    assert got.returncode != 0
    assert "set auth.existingSecret, set auth.generateKeys=true" in got.stderr


def test_auth_can_be_turned_off(helm: str) -> None:
    docs = render(helm, "--set", "auth.enabled=false", "--set", "auth.existingSecret=")
    for w in workloads(docs):
        spec = w["spec"]["template"]["spec"]
        env = container_env(spec["containers"][0])
        assert env.get("DWELL_AUTHENTICATION_ENABLED", "false") == "false"
        assert "DWELL_TOKEN_PUBLIC_KEY" not in env
        assert all(v["name"] != "token-keys" for v in spec.get("volumes", []))


# ---------------------------------------------------------------- Spark on Kubernetes


OAUTH = ("--set", "kafka.security.protocol=SASL_SSL",
         "--set", "kafka.security.saslMechanism=OAUTHBEARER",
         "--set", "kafka.security.oauthbearer.tokenEndpointUrl=https://idp.example/token",
         "--set", "kafka.security.oauthbearer.clientId=dwell",
         "--set", "kafka.security.existingSecret=kafka-oidc")
ALLOWED = "-Dorg.apache.kafka.sasl.oauthbearer.allowed.urls=https://idp.example/token"


def test_spark_jvms_may_fetch_oauthbearer_tokens_in_both_modes(helm: str) -> None:
    """Kafka's Java client fetches tokens only from an allowed endpoint: the driver's and
    executors' JVM options allow the configured one, after any the user set."""
    docs = render(helm, *OAUTH, "--set",
                  "spark.sparkConf.spark\\.executor\\.extraJavaOptions=-XX:+UseG1GC")
    args = by_kind(docs, "Deployment")["rel-dwell-spark"]["spec"]["template"]["spec"][
        "containers"][0]["args"]
    confs = dict(a.split("=", 1) for a in args if a.startswith("spark."))
    assert confs["spark.driver.extraJavaOptions"] == ALLOWED
    assert confs["spark.executor.extraJavaOptions"] == f"-XX:+UseG1GC {ALLOWED}"
    docs = render(helm, *OAUTH, "--set", "spark.mode=operator")
    (app,) = [d for d in docs if d["kind"] == "SparkApplication"]
    assert app["spec"]["sparkConf"]["spark.driver.extraJavaOptions"] == ALLOWED
    assert app["spec"]["sparkConf"]["spark.executor.extraJavaOptions"] == ALLOWED
    plain = render(helm)
    assert "extraJavaOptions" not in str(by_kind(plain, "Deployment")["rel-dwell-spark"])



def test_trackers_of_two_releases_never_run_side_by_side(helm: str) -> None:
    """A tracker's low watermarks rely on every append naming its bucket in the changes
    stream; a tracker of an older release would append without it."""
    deploy = by_kind(render(helm), "Deployment")["rel-dwell-tracker"]
    assert deploy["spec"]["strategy"] == {"type": "Recreate"}


def test_spark_driver_runs_spark_submit_on_kubernetes(helm: str) -> None:
    docs = render(helm, "--set", "spark.executor.instances=3",
                  "--set", "spark.sparkConf.spark\\.kubernetes\\.executor\\.request\\.cores=500m")
    deploy = by_kind(docs, "Deployment")["rel-dwell-spark"]
    assert deploy["spec"]["replicas"] == 1
    assert deploy["spec"]["strategy"]["type"] == "Recreate"
    pod = deploy["spec"]["template"]["spec"]
    (driver,) = pod["containers"]
    args = driver["args"]
    env = container_env(driver)
    assert args[:6] == ["spark-submit", "--master", "$(DWELL_SPARK_MASTER)",
                        "--deploy-mode", "client", "--name"]
    assert env["DWELL_SPARK_MASTER"] == "k8s://https://kubernetes.default.svc"
    confs = dict(a.split("=", 1) for a in args[args.index("--driver-memory") + 2:-1]
                 if a != "--conf")
    assert confs["spark.kubernetes.container.image"] == driver["image"]
    assert driver["image"] == "ghcr.io/dwell-dev/dwell-spark:0.1.0"
    assert confs["spark.kubernetes.namespace"] == "ns"
    assert confs["spark.kubernetes.driver.pod.name"] == "$(POD_NAME)"
    assert confs["spark.executor.instances"] == "3"
    assert confs["spark.kubernetes.executor.request.cores"] == "500m"
    # Executors reach the driver through its headless Service, on the ports it opens.
    svc = by_kind(docs, "Service")["rel-dwell-spark"]
    assert confs["spark.driver.host"] == "rel-dwell-spark.ns.svc"
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"]["spark-role"] == "driver"
    assert deploy["spec"]["template"]["metadata"]["labels"]["spark-role"] == "driver"
    ports = {p["name"]: p["containerPort"] for p in driver["ports"]}
    assert ports["driver-rpc"] == int(confs["spark.driver.port"])
    assert ports["blockmanager"] == int(confs["spark.driver.blockManager.port"])
    # The script spark-submit runs is the repo's spark/launch.py (the image copies spark/).
    assert args[-1] == "/opt/dwell/spark/launch.py"
    assert (ROOT / "spark" / "launch.py").exists()
    # The service account may create and delete the executor pods.
    assert pod["serviceAccountName"] == "rel-dwell-spark"
    (rule,) = by_kind(docs, "Role")["rel-dwell-spark"]["rules"]
    assert {"pods"} <= set(rule["resources"]) and {"create", "delete", "watch"} <= set(
        rule["verbs"])
    binding = by_kind(docs, "RoleBinding")["rel-dwell-spark"]
    assert binding["subjects"][0]["name"] == "rel-dwell-spark"
    # Checkpoints on a volume that outlives the pod, mounted by the driver only (the
    # queries keep no state on executors): ReadWriteOnce.
    mounts = {m["name"]: m["mountPath"] for m in driver["volumeMounts"]}
    assert env["DWELL_SPARK_CHECKPOINT_DIR"] == mounts["checkpoints"]
    pvc = by_kind(docs, "PersistentVolumeClaim")["rel-dwell-spark-checkpoints"]
    assert pvc["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert not [k for k in confs if k.startswith("spark.kubernetes.executor.volumes.")]
    # Executors get the pod template: non-root, read-only root, a writable /tmp.
    template_path = confs["spark.kubernetes.executor.podTemplateFile"]
    assert Path(template_path).parent.as_posix() == mounts["executor-template"]
    template = yaml.safe_load(by_kind(docs, "ConfigMap")["rel-dwell-spark-executor"]["data"][
        Path(template_path).name])
    kubernetes_validate.validate(template | {"metadata": {"name": "x"}}, "1.27.0", strict=True)
    (executor,) = template["spec"]["containers"]
    assert executor["name"] == confs["spark.kubernetes.executor.podTemplateContainerName"]
    assert template["spec"]["securityContext"]["runAsNonRoot"] is True
    assert executor["securityContext"]["readOnlyRootFilesystem"] is True
    assert {"name": "tmp", "mountPath": "/tmp"} in executor["volumeMounts"]


def test_spark_checkpoints_in_object_storage_need_no_volume(helm: str) -> None:
    docs = render(helm, "--set", "spark.config.spark_checkpoint_dir=s3a://bucket/dwell")
    assert "rel-dwell-spark-checkpoints" not in by_kind(docs, "PersistentVolumeClaim")
    driver = by_kind(docs, "Deployment")["rel-dwell-spark"]["spec"]["template"]["spec"]
    assert "checkpoints" not in [v["name"] for v in driver["volumes"]]
    assert not [a for a in driver["containers"][0]["args"] if "persistentVolumeClaim" in a]


def test_admission_is_a_statefulset_for_stable_transactional_ids(helm: str) -> None:
    docs = render(helm)
    sts = by_kind(docs, "StatefulSet")["rel-dwell-admission"]
    assert sts["spec"]["replicas"] == 2
    assert "DWELL_INGRESS_TRANSACTIONAL_ID" not in container_env(
        sts["spec"]["template"]["spec"]["containers"][0])  # derived from the pod name
    hpa = render(helm, *EVERYTHING)
    assert "replicas" not in by_kind(hpa, "StatefulSet")["rel-dwell-admission"]["spec"]
    assert by_kind(hpa, "HorizontalPodAutoscaler")["rel-dwell-admission"]["spec"][
        "scaleTargetRef"]["kind"] == "StatefulSet"



def test_each_process_can_scale_on_cpu_and_keeps_replicas_through_disruptions(
        helm: str) -> None:
    """Admission, the tracker and the policy service each get a PodDisruptionBudget over
    their own pods, and with autoscaling on an HPA on CPU that owns the replica count;
    without it the chart sets the replicas and makes no HPA."""
    workloads = {"admission": "StatefulSet", "tracker": "Deployment", "policy": "Deployment"}
    plain, scaled = render(helm), render(helm, *EVERYTHING)
    assert not by_kind(plain, "HorizontalPodAutoscaler")
    for name, kind in workloads.items():
        full = f"rel-dwell-{name}"
        pod_labels = by_kind(plain, kind)[full]["spec"]["template"]["metadata"]["labels"]
        pdb = by_kind(plain, "PodDisruptionBudget")[full]["spec"]
        assert pdb["maxUnavailable"] == 1
        assert pdb["selector"]["matchLabels"].items() <= pod_labels.items()
        assert pdb["selector"]["matchLabels"]["app.kubernetes.io/component"] == name
        assert by_kind(plain, kind)[full]["spec"]["replicas"] >= 1
        assert "replicas" not in by_kind(scaled, kind)[full]["spec"]
        hpa = by_kind(scaled, "HorizontalPodAutoscaler")[full]["spec"]
        assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": kind, "name": full}
        assert 1 <= hpa["minReplicas"] <= hpa["maxReplicas"]
    off = render(helm, "--set", "tracker.podDisruptionBudget.enabled=false")
    assert "rel-dwell-tracker" not in by_kind(off, "PodDisruptionBudget")


# ---------------------------------------------------------------- monitoring


def test_service_monitor_selects_each_process_once(helm: str) -> None:
    docs = render(helm, *EVERYTHING)
    (sm,) = by_kind(docs, "ServiceMonitor").values()
    sel = sm["spec"]["selector"]

    def selected(labels: dict[str, str]) -> bool:
        if any(labels.get(k) != v for k, v in sel["matchLabels"].items()):
            return False
        for e in sel["matchExpressions"]:
            if e["operator"] == "In" and labels.get(e["key"]) not in e["values"]:
                return False
            if e["operator"] == "DoesNotExist" and e["key"] in labels:
                return False
        return True

    scraped = {s["metadata"]["labels"]["app.kubernetes.io/component"]: s
               for s in by_kind(docs, "Service").values() if selected(s["metadata"]["labels"])}
    assert set(scraped) == set(PORTS)
    assert len([s for s in by_kind(docs, "Service").values()
                if selected(s["metadata"]["labels"])]) == len(PORTS)
    (endpoint,) = sm["spec"]["endpoints"]
    for component, svc in scraped.items():
        port = {p["name"]: p["port"] for p in svc["spec"]["ports"]}[endpoint["port"]]
        assert port == PORTS[component]


def test_service_monitor_sends_a_token_when_metrics_need_one(helm: str) -> None:
    """With authenticateMetricsEndpoint on, Prometheus must send a token: the chart
    refuses to render a ServiceMonitor without one, and sends the named Secret's."""
    on = ["--set", "config.authenticate_metrics_endpoint=true"]
    refused = run_helm(helm, "template", "rel", str(CHART), *TOKEN_KEYS, *EVERYTHING, *on)
    assert refused.returncode != 0
    assert "metrics.serviceMonitor.tokenSecret.name is required" in refused.stderr
    docs = render(helm, *EVERYTHING, *on, "--set",
                  "metrics.serviceMonitor.tokenSecret.name=dwell-metrics-token")
    (sm,) = by_kind(docs, "ServiceMonitor").values()
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint["authorization"] == {
        "type": "Bearer", "credentials": {"name": "dwell-metrics-token", "key": "token"}}
    (plain,) = by_kind(render(helm, *EVERYTHING), "ServiceMonitor").values()
    assert "authorization" not in plain["spec"]["endpoints"][0]


def test_prometheus_rule_is_the_checked_rules_file(helm: str, tmp_path: Path) -> None:
    docs = render(helm, *EVERYTHING)
    (rule,) = by_kind(docs, "PrometheusRule").values()
    rules_file = CHART / "files" / "rules" / "dwell.rules.yaml"
    assert rule["spec"] == yaml.safe_load(rules_file.read_text())
    out = tmp_path / "rendered.rules.yaml"
    out.write_text(yaml.safe_dump(rule["spec"]))
    got = subprocess.run([str(devinstall.promtool_bin()), "check", "rules", str(out)],
                         capture_output=True, text=True)
    assert got.returncode == 0, got.stdout + got.stderr


def test_dashboards_configmap_carries_every_dashboard(helm: str) -> None:
    docs = render(helm, *EVERYTHING)
    cm = by_kind(docs, "ConfigMap")["rel-dwell-dashboards"]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    files = sorted((CHART / "files" / "dashboards").glob("*.json"))
    assert files and sorted(cm["data"]) == [f.name for f in files]
    for f in files:
        assert cm["data"][f.name] == f.read_text()
    assert "rel-dwell-dashboards" not in by_kind(render(helm), "ConfigMap")  # off by default
