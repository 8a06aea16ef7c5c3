"""Writes charts/dwell/values.schema.json: the chart's own keys, plus, for every `config:`
map, the settings fields of that process (types, bounds, enums from the pydantic models),
so that `helm install --set tracker.config.restage_lead=...` fails on the typo instead of
starting with a default. Each key is described: a chart key by its `## @param` comment in
values.yaml, a setting by its env var and its field's description. tests/chart checks
the file is what this script writes, and that every `@param` names a key of the schema.

    .venv/bin/python -m dwell_dev.chart_schema          # rewrite the file
    .venv/bin/python -m dwell_dev.chart_schema --check  # exit 1 if it is stale
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

from dwell.admission.settings import AdmissionSettings
from dwell.policy.settings import PolicySettings
from dwell.security import KafkaSecurity, RedisSecurity, TlsSettings
from dwell.settings import CommonSettings
from dwell.tracker.settings import TrackerSettings
from dwell_dev import ROOT
from dwell_spark.settings import SparkSettings

SCHEMA = ROOT / "charts" / "dwell" / "values.schema.json"
VALUES = ROOT / "charts" / "dwell" / "values.yaml"
PARAM = re.compile(r"^## @param (\S+) ?(.*)$")


# Settings the chart sets itself from other values (addresses, ports, the Spark master,
# the connections' security from tls/kafka.security/redis.tls and Secrets): not for a
# `config:` map.
CHART_OWNED = frozenset({
    "http_host", "http_port", "redis_url", "kafka_bootstrap", "kafka_replication_factor",
    "spark_master", "spark_metrics_port", "spark_jars", "tracker_url",
    # the pod's name (a restarted container takes its own bookkeeping lease back)
    "bookkeeping_lease_holder",
    *TlsSettings.model_fields, *KafkaSecurity.model_fields, *RedisSecurity.model_fields,
    # from the `auth:` values, the keys from its existingSecret
    "authentication_enabled", "authorization_enabled", "super_user_roles",
    "token_secret_key", "token_public_key", "kafka_token_secret_key",
})
NONEMPTY = {"type": "string", "minLength": 1}
COMPONENT_SETTINGS = {"policy": PolicySettings, "admission": AdmissionSettings,
                      "tracker": TrackerSettings, "spark": SparkSettings}


def settings_schema(model: type[CommonSettings], own_only: bool) -> dict[str, Any]:
    """A closed object schema of a settings class's fields (or of those it adds to
    CommonSettings), each as pydantic describes it, titled with its env var."""
    props = model.model_json_schema()["properties"]
    common = set(CommonSettings.model_fields)
    out: dict[str, Any] = {}
    for name, prop in sorted(props.items()):
        if name in CHART_OWNED or (own_only and name in common):
            continue
        text = " ".join(prop.get("description", "").split())
        prop = {k: v for k, v in prop.items() if k not in ("title", "description")}
        prop["description"] = f"DWELL_{name.upper()}: {text}" if text else f"DWELL_{name.upper()}"
        out[name] = prop
    return {"type": "object", "additionalProperties": False, "properties": out}


def obj(props: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object", "additionalProperties": False,
                           "properties": props}
    if required:
        out["required"] = required
    return out


STR = {"type": "string"}
BOOL = {"type": "boolean"}
POS = {"type": "integer", "minimum": 1}
MAP = {"type": "object"}
LIST = {"type": "array"}
QUANTITY = {"type": ["string", "integer"], "pattern": "^[0-9]+(\\.[0-9]+)?([EPTGMk]i?|[m])?$"}
RESOURCES = {"type": "object", "additionalProperties": False,
             "properties": {"requests": MAP, "limits": MAP, "claims": LIST}}
# An image is pulled by digest when one is set (a release records its builds' digests).
DIGEST = {"type": "string", "pattern": "^(sha256:[0-9a-f]{64})?$"}
IMAGE = obj({"registry": STR, "repository": {"type": "string", "minLength": 1}, "tag": STR,
             "digest": DIGEST, "pullPolicy": {"enum": ["Always", "IfNotPresent", "Never"]}},
            ["repository"])
# NetworkPolicyPeer lists (the API server checks each peer's fields).
PEERS = {"type": "array", "items": {"type": "object"}}
PORT = {"type": "integer", "minimum": 1, "maximum": 65535}
INGRESS_PATH = obj({"path": {"type": "string", "pattern": "^/"},
                    "pathType": {"enum": ["Prefix", "Exact", "ImplementationSpecific"]},
                    "service": {"enum": ["policy", "admission", "tracker"]}},
                   ["path", "pathType", "service"])
PERSISTENCE = obj({"size": QUANTITY, "storageClass": STR})
SCHEDULING = {"nodeSelector": MAP, "tolerations": LIST, "affinity": MAP,
              "podAnnotations": MAP}


# A process's HorizontalPodAutoscaler and PodDisruptionBudget (templates/_scaling.tpl).
SCALING = {
    "autoscaling": obj({"enabled": BOOL, "minReplicas": POS, "maxReplicas": POS,
                        "targetCPUUtilizationPercentage": {
                            "type": "integer", "minimum": 1, "maximum": 100}}),
    "podDisruptionBudget": obj({"enabled": BOOL,
                                "maxUnavailable": {"type": ["integer", "string"]}}),
}


def component(name: str, extra: dict[str, Any]) -> dict[str, Any]:
    return obj({"config": settings_schema(COMPONENT_SETTINGS[name], own_only=True),
                "resources": RESOURCES, **SCHEDULING, **extra})


def schema() -> dict[str, Any]:
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "dwell chart values (written by dwell_dev.chart_schema)",
        **obj({
            "nameOverride": STR,
            "fullnameOverride": STR,
            "image": IMAGE,
            "imagePullSecrets": LIST,
            "devReload": BOOL,
            "config": settings_schema(CommonSettings, own_only=False),
            "podSecurityContext": MAP,
            "securityContext": MAP,
            "tls": obj({
                "enabled": BOOL, "existingSecret": STR, "trustCertsKey": STR,
                "certManager": obj({
                    "enabled": BOOL,
                    "issuerRef": obj({"name": STR,
                                      "kind": {"enum": ["Issuer", "ClusterIssuer"]}}),
                    "duration": STR, "renewBefore": STR}),
            }),
            "redis": obj({
                "enabled": BOOL,
                "image": IMAGE,
                "external": obj({"host": STR, "port": {"type": "integer", "minimum": 1,
                                                       "maximum": 65535},
                                 "db": {"type": "integer", "minimum": 0}}),
                "auth": obj({"existingSecret": STR, "existingSecretPasswordKey": NONEMPTY,
                             "username": STR}),
                "tls": obj({"enabled": BOOL, "caSecret": STR, "caSecretKey": NONEMPTY}),
                "persistence": PERSISTENCE,
                "resources": RESOURCES,
            }),
            "kafka": obj({
                "enabled": BOOL,
                "image": IMAGE,
                "external": obj({"bootstrap": STR}),
                "security": obj({
                    "protocol": {"enum": ["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]},
                    "saslMechanism": {"enum": ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512",
                                               "OAUTHBEARER"]},
                    "username": STR, "existingSecret": STR,
                    "existingSecretPasswordKey": NONEMPTY,
                    "oauthbearer": obj({"tokenEndpointUrl": STR, "clientId": STR,
                                        "scope": STR}),
                    "caSecret": STR, "caSecretKey": NONEMPTY}),
                "auth": obj({"enabled": BOOL, "existingSecret": STR,
                             "resources": RESOURCES}),
                "replicationFactor": POS,
                "clusterId": {"type": "string", "pattern": "^[A-Za-z0-9_-]{22}$"},
                "persistence": PERSISTENCE,
                "resources": RESOURCES,
            }),
            "policy": component("policy", {"replicaCount": POS, **SCALING}),
            "admission": component("admission", {"replicaCount": POS, **SCALING}),
            "tracker": component("tracker", {"replicaCount": POS, **SCALING}),
            "spark": component("spark", {
                "image": IMAGE,
                "mode": {"type": "string", "enum": ["client", "operator"]},
                "master": {"type": "string", "pattern": "^(k8s://|local)"},
                "operator": obj({"sparkVersion": STR}),
                "executor": obj({"instances": POS, "cores": POS, "memory": STR}),
                "driver": obj({"memory": STR}),
                "authenticate": obj({"enabled": BOOL, "existingSecret": STR}),
                "sparkConf": {"type": "object",
                              "additionalProperties": {"type": ["string", "number",
                                                                "boolean"]}},
                "checkpoints": obj({"existingClaim": STR, "size": QUANTITY,
                                    "storageClass": STR,
                                    "accessModes": {"type": "array", "minItems": 1, "items": {
                                        "enum": ["ReadWriteMany", "ReadWriteOnce",
                                                 "ReadWriteOncePod"]}}}),
            }),
            "networkPolicy": obj({
                "enabled": BOOL,
                "clients": PEERS,
                "metrics": PEERS,
                "kubeAPIServer": obj({"to": PEERS,
                                      "ports": {"type": "array", "minItems": 1, "items": PORT}}),
                "externalTo": PEERS,
                "dns": obj({"to": PEERS}),
            }),
            "ingress": obj({
                "enabled": BOOL,
                "className": STR,
                "annotations": MAP,
                "hosts": {"type": "array", "items": obj({
                    "host": STR,
                    "paths": {"type": "array", "minItems": 1, "items": INGRESS_PATH}},
                    ["paths"])},
                "tls": {"type": "array", "items": obj({
                    "secretName": {"type": "string", "minLength": 1},
                    "hosts": {"type": "array", "items": STR}}, ["secretName"])},
            }),
            "auth": obj({
                "enabled": BOOL,
                "superUserRoles": {"type": "array", "items": {"type": "string",
                                                              "minLength": 1}},
                "existingSecret": STR, "generateKeys": BOOL,
                "secretKeyKey": STR,
                "publicKeyKey": STR,
                "kafkaTokenSecretKeyKey": STR,
                "testToken": obj({"existingSecret": STR, "key": NONEMPTY}),
            }),
            "metrics": obj({
                "serviceMonitor": obj({"enabled": BOOL, "interval": STR, "labels": MAP,
                                       "tokenSecret": obj({"name": STR, "key": NONEMPTY})}),
                "prometheusRule": obj({"enabled": BOOL, "labels": MAP}),
                "dashboards": obj({"enabled": BOOL, "labels": MAP}),
            }),
        }),
    }


def params(text: str) -> dict[str, str]:
    """values.yaml's ``## @param <key> <text>`` comments (indented or not), a comment's
    following ``##`` lines (not another @param or @section) joined to it: dotted key ->
    text."""
    out: dict[str, str] = {}
    key = None
    for line in (raw.strip() for raw in text.splitlines()):
        m = PARAM.match(line)
        if m:
            key = m.group(1)
            out[key] = m.group(2).strip()
        elif key is not None and line.startswith("## ") and not line.startswith("## @"):
            out[key] = f"{out[key]} {line[3:].strip()}".strip()
        else:
            key = None
    return out


def keys_of(node: dict[str, Any], prefix: str = "") -> dict[str, dict[str, Any]]:
    """Every property of the schema by its dotted key."""
    out: dict[str, dict[str, Any]] = {}
    for name, prop in node.get("properties", {}).items():
        key = f"{prefix}{name}"
        out[key] = prop
        out.update(keys_of(prop, f"{key}."))
    return out


def described(tree: dict[str, Any], values_text: str) -> dict[str, Any]:
    """``tree`` with each key that has an @param comment described by it. Properties
    shared between keys (IMAGE, RESOURCES, ...) are copied before they are described."""
    tree = json.loads(json.dumps(tree))
    found = keys_of(tree)
    for key, text in params(values_text).items():
        if key in found and text:
            found[key]["description"] = text
    return tree


def unknown_params(values_text: str) -> list[str]:
    """@param keys that name no key of the schema (a renamed or misspelt value)."""
    found = keys_of(schema())
    return sorted(k for k in params(values_text) if k not in found)


def render() -> str:
    return json.dumps(described(schema(), VALUES.read_text()), indent=2) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if not SCHEMA.exists() or SCHEMA.read_text() != text:
            print(f"{SCHEMA.relative_to(ROOT)} is stale: run dwell_dev.chart_schema",
                  file=sys.stderr)
            return 1
        return 0
    SCHEMA.write_text(text)
    print(f"wrote {SCHEMA.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
