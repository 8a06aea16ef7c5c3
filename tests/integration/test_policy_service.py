"""The policy service against the real test Redis and Kafka: Pulsar's admin paths,
status codes and messages, field-by-field inheritance, and surviving kill -9."""

from __future__ import annotations

import httpx
import pytest

from dwell.adapters import kafka

# Broker defaults of the service under test, set explicitly so `applied` is predictable.
BROKER = {"DWELL_DELAYED_DELIVERY_ENABLED": "true", "DWELL_DELAYED_DELIVERY_TICK_TIME_MS": "1000",
          "DWELL_DELAYED_DELIVERY_MAX_DELAY_MS": "0", "DWELL_DELAYED_DELIVERY_FIXED_DELAY_MS": "0"}


@pytest.fixture(scope="module")
def policy(services):  # type: ignore[no-untyped-def]
    svc = services.start("policy", env=BROKER)
    yield svc
    svc.stop()


@pytest.fixture()
def http(policy):  # type: ignore[no-untyped-def]
    with httpx.Client(base_url=policy.url, timeout=30) as client:
        yield client


def _reason(resp: httpx.Response) -> str:
    return str(resp.json()["reason"])


def _namespace(http: httpx.Client, unique: str, *topics: str) -> str:
    """`<unique>/ns`, created with the given topics (a topic policy names an existing topic)."""
    assert http.put(f"/admin/v2/tenants/{unique}").status_code == 204
    assert http.put(f"/admin/v2/namespaces/{unique}/ns").status_code == 204
    for topic in topics:
        assert http.put(f"/admin/v2/persistent/{unique}/ns/{topic}").status_code == 204
    return f"{unique}/ns"


def test_tenants(http: httpx.Client, unique: str) -> None:
    body = {"adminRoles": ["ops"], "allowedClusters": ["standalone"]}
    assert http.put(f"/admin/v2/tenants/{unique}", json=body).status_code == 204
    assert http.get(f"/admin/v2/tenants/{unique}").json() == body
    assert unique in http.get("/admin/v2/tenants").json()
    again = http.put(f"/admin/v2/tenants/{unique}")
    assert (again.status_code, _reason(again)) == (409, "Tenant already exist")
    assert http.delete(f"/admin/v2/tenants/{unique}").status_code == 204
    assert unique not in http.get("/admin/v2/tenants").json()
    # Pulsar's texts, which differ from call to call
    for resp, reason in ((http.get(f"/admin/v2/tenants/{unique}"), "Tenant does not exist"),
                         (http.delete(f"/admin/v2/tenants/{unique}"), "Tenant doesn't exist"),
                         (http.get(f"/admin/v2/namespaces/{unique}"), "Tenant not found"),
                         (http.put(f"/admin/v2/namespaces/{unique}/ns"), "Tenant does not exist"),
                         (http.post(f"/admin/v2/tenants/{unique}", json=body),
                          f"Tenant {unique} not found")):
        assert (resp.status_code, _reason(resp)) == (404, reason)


def test_clusters(http: httpx.Client) -> None:
    assert http.get("/admin/v2/clusters").json() == ["standalone"]
    runtime = http.get("/admin/v2/brokers/configuration/runtime").json()
    assert runtime["clusterName"] == "standalone"
    assert runtime["delayedDeliveryTickTimeMillis"] == "1000"


def test_tenant_update_and_allowed_clusters(http: httpx.Client, unique: str) -> None:
    assert http.put(f"/admin/v2/tenants/{unique}",
                    json={"allowedClusters": ["standalone"]}).status_code == 204
    update = {"adminRoles": ["ops"], "allowedClusters": ["global"]}
    assert http.post(f"/admin/v2/tenants/{unique}", json=update).status_code == 204
    assert http.get(f"/admin/v2/tenants/{unique}").json() == update
    for body, reason in (({"allowedClusters": ["elsewhere"]}, "Clusters do not exist"),
                         ({"allowedClusters": [" "]}, "Clusters cannot be empty or blank"),
                         ({"adminRoles": [" ops"]},
                          "AdminRoles contains whitespace in the beginning or end.")):
        for resp in (http.put(f"/admin/v2/tenants/{unique}x", json=body),
                     http.post(f"/admin/v2/tenants/{unique}", json=body)):
            assert (resp.status_code, _reason(resp)) == (412, reason)
    assert http.get(f"/admin/v2/tenants/{unique}").json() == update
    assert http.get(f"/admin/v2/tenants/{unique}x").status_code == 404


def test_tenant_body_without_body_and_bad_bodies(http: httpx.Client, unique: str) -> None:
    assert http.put(f"/admin/v2/tenants/{unique}").status_code == 204
    assert http.get(f"/admin/v2/tenants/{unique}").json() == {"adminRoles": [],
                                                                "allowedClusters": []}
    for body, field in (('{"adminRole": []}', "adminRole"), ('{"adminRoles": "a"}', "adminRoles"),
                        ("{nope", "body")):
        resp = http.put(f"/admin/v2/tenants/{unique}x", content=body)
        assert resp.status_code == 400
        assert _reason(resp).startswith(f"{field}"), _reason(resp)


@pytest.mark.parametrize(("tenant", "word"), [("dwell", "reserved"), ("a%20b", "whitespace"),
                                              ("a!b", "may only contain")])
def test_bad_tenant_names(http: httpx.Client, tenant: str, word: str) -> None:
    resp = http.put(f"/admin/v2/tenants/{tenant}")
    assert resp.status_code == 412
    assert _reason(resp).startswith("Tenant name is not valid: ")
    assert word in _reason(resp)


def test_namespaces(http: httpx.Client, unique: str) -> None:
    ns = _namespace(http, unique)
    assert http.put(f"/admin/v2/namespaces/{unique}/other").status_code == 204
    assert http.get(f"/admin/v2/namespaces/{unique}").json() == [ns, f"{unique}/other"]
    policies = http.get(f"/admin/v2/namespaces/{ns}").json()
    assert "delayed_delivery_policies" not in policies  # none set: Jackson leaves it out
    assert (policies["replication_clusters"], policies["bundles"]["numBundles"]) == (
        ["standalone"], 4)
    again = http.put(f"/admin/v2/namespaces/{ns}")
    assert (again.status_code, _reason(again)) == (409, "Namespace already exists")
    busy = http.delete(f"/admin/v2/tenants/{unique}")
    assert (busy.status_code, _reason(busy)) == (409, "The tenant still has active namespaces")
    bad = http.put(f"/admin/v2/namespaces/{unique}/a!b")
    assert bad.status_code == 412
    assert _reason(bad).startswith("Namespace name is not valid: ")
    assert http.delete(f"/admin/v2/namespaces/{unique}/other").status_code == 204
    gone = http.get(f"/admin/v2/namespaces/{unique}/other")
    assert (gone.status_code, _reason(gone)) == (404, "Namespace does not exist")
    again = http.delete(f"/admin/v2/namespaces/{unique}/other")
    assert (again.status_code, _reason(again)) == (
        404, f"Namespace {unique}/other does not exist.")
    assert http.get(f"/admin/v2/namespaces/{unique}").json() == [ns]


def test_namespace_create_with_pulsar_policies_body(http: httpx.Client, unique: str) -> None:
    assert http.put(f"/admin/v2/tenants/{unique}").status_code == 204
    body = {"bundles": {"numBundles": 4}, "delayed_delivery_policies": {"tickTime": 250}}
    assert http.put(f"/admin/v2/namespaces/{unique}/ns", json=body).status_code == 204
    assert http.get(f"/admin/v2/namespaces/{unique}/ns/delayedDelivery").json() == {
        "tickTime": 250}
    bad = http.put(f"/admin/v2/namespaces/{unique}/n2",
                   json={"delayed_delivery_policies": {"tickTime": 0}})
    assert (bad.status_code, _reason(bad)) == (
        400, "delayed_delivery_policies.tickTime: must be >= 1")


def test_namespace_policy_lifecycle(http: httpx.Client, unique: str) -> None:
    ns = _namespace(http, unique)
    url = f"/admin/v2/namespaces/{ns}/delayedDelivery"
    unset = http.get(url)
    assert (unset.status_code, unset.text) == (200, "null")
    policy = {"active": True, "tickTime": 500, "maxDeliveryDelayInMillis": 2**63 - 1}
    assert http.post(url, json=policy).status_code == 204
    assert http.get(url).json() == policy
    assert http.get(f"/admin/v2/namespaces/{ns}").json()["delayed_delivery_policies"] == policy
    assert http.get(url, params={"applied": "true", "isGlobal": "false"}).json() == {
        **policy, "fixedDeliveryDelayInMillis": 0}
    assert http.delete(url).status_code == 204
    assert http.get(url).text == "null"
    assert http.delete(url).status_code == 204  # removing nothing is fine, as in Pulsar
    assert http.get(url, params={"applied": "true"}).json() == {
        "active": True, "tickTime": 1000, "maxDeliveryDelayInMillis": 0,
        "fixedDeliveryDelayInMillis": 0}
    # Pulsar's texts: reading the namespace's policies, or writing one field of them.
    for method, reason in (("GET", "Namespace does not exist"),
                           ("POST", "Namespace policies does not exist"),
                           ("DELETE", "Namespace policies does not exist")):
        resp = http.request(method, f"/admin/v2/namespaces/{unique}/nope/delayedDelivery",
                            json={"active": True} if method == "POST" else None)
        assert (resp.status_code, _reason(resp)) == (404, reason)


BAD_BODIES = [
    ('{"tickTime": 0}', "tickTime", "must be >= 1"),
    ('{"tickTime": "5000"}', "tickTime", "must be an integer"),
    ('{"maxDeliveryDelayInMillis": 5.5}', "maxDeliveryDelayInMillis", "must be an integer"),
    ('{"maxDeliveryDelayInMillis": true}', "maxDeliveryDelayInMillis", "must be an integer"),
    ('{"maxDeliveryDelayInMillis": -1}', "maxDeliveryDelayInMillis", "must be >= 0"),
    ('{"fixedDeliveryDelayInMillis": 9223372036854775808}', "fixedDeliveryDelayInMillis",
     "must be <= 9223372036854775807"),
    ('{"active": "yes"}', "active", "must be true or false"),
    ('{"tickTime": 1', "body", "is not valid JSON"),
    ("[1]", "body", "must be a JSON object"),
]


def test_policy_body_as_pulsar_reads_it(http: httpx.Client, unique: str) -> None:
    """Unknown fields are ignored (Pulsar's Jackson does so), missing ones inherit."""
    ns = _namespace(http, unique, "x")
    for url in (f"/admin/v2/namespaces/{ns}/delayedDelivery",
                f"/admin/v2/persistent/{ns}/x/delayedDelivery"):
        body = {"tickTime": 250, "maxDelay": 5, "fixedDeliveryDelayInMillis": None,
                "someNewerField": {"a": [1]}}
        assert http.post(url, json=body).status_code == 204
        assert http.get(url).json() == {"tickTime": 250}
        assert http.get(url, params={"applied": "true"}).json() == {
            "active": True, "tickTime": 250, "maxDeliveryDelayInMillis": 0,
            "fixedDeliveryDelayInMillis": 0}
        bad = http.post(url, json={"tickTime": 0, "maxDelay": 5})
        assert (bad.status_code, _reason(bad)) == (400, "tickTime: must be >= 1")
    created = http.put(f"/admin/v2/namespaces/{unique}/n2", json={
        "delayed_delivery_policies": {"active": False, "unknown": 1}})
    assert created.status_code == 204
    assert http.get(f"/admin/v2/namespaces/{unique}/n2/delayedDelivery").json() == {
        "active": False}


@pytest.mark.parametrize(("body", "field", "message"), BAD_BODIES)
def test_bad_policy_bodies_are_400_naming_the_field(http: httpx.Client, unique: str, body: str,
                                                    field: str, message: str) -> None:
    ns = _namespace(http, unique, "x")
    for url in (f"/admin/v2/namespaces/{ns}/delayedDelivery",
                f"/admin/v2/persistent/{ns}/x/delayedDelivery"):
        resp = http.post(url, content=body, headers={"content-type": "application/json"})
        assert resp.status_code == 400
        assert _reason(resp) == f"{field}: {message}"
    assert http.get(f"/admin/v2/namespaces/{ns}/delayedDelivery").text == "null"


def test_topic_policy_and_applied_inherits_field_by_field(http: httpx.Client,
                                                          unique: str) -> None:
    ns = _namespace(http, unique, "orders")
    topic_url = f"/admin/v2/persistent/{ns}/orders/delayedDelivery"
    assert http.get(topic_url).text == "null"
    assert http.post(f"/admin/v2/namespaces/{ns}/delayedDelivery",
                     json={"maxDeliveryDelayInMillis": 10_000,
                           "fixedDeliveryDelayInMillis": 300}).status_code == 204
    assert http.post(topic_url, json={"tickTime": 50},
                     params={"isGlobal": "true"}).status_code == 204
    assert http.get(topic_url, params={"isGlobal": "true"}).json() == {"tickTime": 50}
    # tickTime from the topic, max and fixed from the namespace, active from the broker.
    assert http.get(topic_url, params={"applied": "true"}).json() == {
        "active": True, "tickTime": 50, "maxDeliveryDelayInMillis": 10_000,
        "fixedDeliveryDelayInMillis": 300}
    assert http.get(f"/admin/v2/namespaces/{ns}/delayedDelivery",
                    params={"applied": "true"}).json() == {
        "active": True, "tickTime": 1000, "maxDeliveryDelayInMillis": 10_000,
        "fixedDeliveryDelayInMillis": 300}
    # The local topic policy overrides one namespace field; the other still inherits,
    # and the global tickTime stays under it.
    assert http.post(topic_url, json={"active": False, "maxDeliveryDelayInMillis": 0}
                     ).status_code == 204
    assert http.get(topic_url, params={"applied": "true"}).json() == {
        "active": False, "tickTime": 50, "maxDeliveryDelayInMillis": 0,
        "fixedDeliveryDelayInMillis": 300}
    busy = http.delete(f"/admin/v2/namespaces/{ns}")
    assert (busy.status_code, _reason(busy)) == (409, "Cannot delete non empty namespace")
    assert http.delete(topic_url, params={"isGlobal": "false"}).status_code == 204
    assert http.get(topic_url).text == "null"
    assert http.delete(topic_url, params={"isGlobal": "true"}).status_code == 204
    assert http.delete(f"/admin/v2/persistent/{ns}/orders").status_code == 204
    assert http.delete(f"/admin/v2/namespaces/{ns}").status_code == 204
    assert http.delete(f"/admin/v2/tenants/{unique}").status_code == 204


def test_local_and_global_topic_policies(http: httpx.Client, unique: str) -> None:
    """`isGlobal` keeps a second topic policy; the topic runs with local over global over
    namespace over broker, field by field (Pulsar's PolicyHierarchyValue)."""
    ns = _namespace(http, unique, "x")
    url = f"/admin/v2/persistent/{ns}/x/delayedDelivery"
    glob = {"isGlobal": "true"}
    assert http.post(f"/admin/v2/namespaces/{ns}/delayedDelivery",
                     json={"fixedDeliveryDelayInMillis": 40}).status_code == 204
    assert http.post(url, json={"tickTime": 500}).status_code == 204
    assert http.post(url, params=glob, json={"tickTime": 700, "maxDeliveryDelayInMillis": 9000}
                     ).status_code == 204
    assert http.get(url).json() == {"tickTime": 500}
    assert http.get(url, params=glob).json() == {"tickTime": 700, "maxDeliveryDelayInMillis": 9000}
    applied = {"active": True, "tickTime": 500, "maxDeliveryDelayInMillis": 9000,
               "fixedDeliveryDelayInMillis": 40}
    for params in ({"applied": "true"}, {"applied": "true", "isGlobal": "true"}):
        assert http.get(url, params=params).json() == applied
    assert http.delete(url).status_code == 204
    assert http.get(url).text == "null"
    assert http.get(url, params={"applied": "true"}).json() == {**applied, "tickTime": 700}
    assert http.post(url, json={"active": False}).status_code == 204
    assert http.delete(url, params=glob).status_code == 204
    assert http.get(url, params=glob).text == "null"
    assert http.get(url).json() == {"active": False}
    assert http.get(url, params={"applied": "true"}).json() == {
        "active": False, "tickTime": 1000, "maxDeliveryDelayInMillis": 0,
        "fixedDeliveryDelayInMillis": 40}
    assert http.delete(f"/admin/v2/persistent/{ns}/x").status_code == 204
    # The topic's policies went with it.
    assert http.get(url).status_code == 404
    assert http.put(f"/admin/v2/persistent/{ns}/x").status_code == 204
    assert http.get(url).text == "null"
    assert http.delete(f"/admin/v2/persistent/{ns}/x").status_code == 204
    assert http.delete(f"/admin/v2/namespaces/{ns}").status_code == 204


def test_topics_are_kafka_ready_topics(http: httpx.Client, unique: str,
                                      kafka_bootstrap: str) -> None:
    ns = _namespace(http, unique)
    base = f"/admin/v2/persistent/{ns}"
    assert http.put(f"{base}/x").status_code == 204
    assert http.put(f"{base}/p/partitions", json=3).status_code == 204
    assert http.put(f"{base}/q/partitions", json={"partitions": 2, "properties": {}}
                    ).status_code == 204
    counts = kafka.partition_counts(kafka_bootstrap)
    assert [counts.get(f"{unique}.ns.{x}") for x in "xpq"] == [1, 3, 2]
    assert http.get(base).json() == [f"persistent://{ns}/p-partition-{i}" for i in range(3)] + [
        f"persistent://{ns}/q-partition-{i}" for i in range(2)] + [f"persistent://{ns}/x"]
    assert http.get(f"/admin/v2/non-persistent/{ns}").json() == []
    assert http.get(f"{base}/partitioned").json() == [f"persistent://{ns}/p",
                                                      f"persistent://{ns}/q"]
    assert http.get(f"{base}/p/partitions").json() == {"partitions": 3}
    assert http.get(f"{base}/x/partitions").json() == {"partitions": 0}
    for method, url, body, status, reason in (
            ("PUT", f"{base}/x", None, 409, "This topic already exists"),
            ("PUT", f"{base}/p/partitions", 3, 409, "This topic already exists"),
            ("PUT", f"{base}/p-partition-2", None, 409, "This topic already exists"),
            ("PUT", f"{base}/p-partition-3", None, 412, f"Can't create topic persistent://{ns}/"
             "p-partition-3 with \"-partition-\" followed by a number smaller than number of "
             "partition of partitioned topic p"),
            ("PUT", f"{base}/z-partition-0", None, 412, f"Can't create topic persistent://{ns}/"
             "z-partition-0 with \"-partition-\" followed by numeric value if there isn't a "
             "partitioned topic z created."),
            ("PUT", f"{base}/r-partition-x/partitions", 2, 412,
             "Partitioned Topic Name should not contain '-partition-'"),
            ("PUT", f"{base}/r/partitions", 0, 406, "Number of partitions should be more than 0"),
            ("PUT", f"/admin/v2/persistent/{unique}/nope/x", None, 404, "Namespace does not exist"),
            ("GET", f"/admin/v2/persistent/{unique}/nope", None, 404, "Namespace does not exist"),
            ("POST", f"{base}/p-partition-0/delayedDelivery", {"tickTime": 5}, 412,
             "Not allowed to set/get topic policy for a partition"),
            ("GET", f"{base}/p-partition-0/delayedDelivery", None, 412,
             "Not allowed to set/get topic policy for a partition"),
            ("DELETE", f"{base}/nope", None, 404, f"Topic persistent://{ns}/nope not found"),
            ("DELETE", f"{base}/nope/partitions", None, 404,
             f"Topic persistent://{ns}/nope not found."),
            # Each delete refuses the other's kind of topic, and a partition's name.
            ("DELETE", f"{base}/x/partitions", None, 409, f"persistent://{ns}/x is a "
             "non-partitioned topic. Instead of calling delete-partitioned-topic please call "
             "delete."),
            ("DELETE", f"{base}/p", None, 409, f"persistent://{ns}/p is a partitioned topic, "
             "instead of calling delete topic, please call delete-partitioned-topic."),
            ("DELETE", f"{base}/p-partition-0/partitions", None, 412,
             "Partitioned Topic Name should not contain '-partition-'"),
            ("DELETE", f"{base}/p-partition-0", None, 404,
             f"Topic persistent://{ns}/p-partition-0 not found")):
        resp = http.request(method, url, json=body)
        assert (resp.status_code, _reason(resp)) == (status, reason), url
    for body in ("three", "1.5", "true", "{nope"):
        bad = http.put(f"{base}/r/partitions", content=body)
        assert bad.status_code == 400 and _reason(bad).startswith("body: "), body
    # One partition: a partitioned topic all the same (Kafka cannot tell; the record does).
    assert http.put(f"{base}/r/partitions", json=1).status_code == 204
    assert kafka.partition_counts(kafka_bootstrap).get(f"{unique}.ns.r") == 1
    assert f"persistent://{ns}/r-partition-0" in http.get(base).json()
    assert f"persistent://{ns}/r" in http.get(f"{base}/partitioned").json()
    assert http.get(f"{base}/r/partitions").json() == {"partitions": 1}
    for method, url in (("PUT", f"{base}/r-partition-0"), ("PUT", f"{base}/r"),
                        ("PUT", f"{base}/r/partitions")):
        assert http.request(method, url, json=1).status_code == 409, url
    assert http.delete(f"{base}/r").status_code == 409
    assert http.delete(f"{base}/r/partitions").status_code == 204
    # Deleted with its mark: the name made again as a non-partitioned topic is a plain one,
    # and so it is after a create cut short between its mark and its Kafka topic.
    for cut_short in (False, True):
        if cut_short:
            assert http.put(f"{base}/r/partitions", json=1).status_code == 204
            assert kafka.delete_topic(kafka_bootstrap, f"{unique}.ns.r")
        assert http.put(f"{base}/r").status_code == 204
        assert http.get(f"{base}/r/partitions").json() == {"partitions": 0}
        assert f"persistent://{ns}/r" in http.get(base).json()
        assert http.delete(f"{base}/r").status_code == 204
    # A mark left on no topic does not keep the namespace from being deleted (at the end).
    assert http.put(f"{base}/r/partitions", json=1).status_code == 204
    assert kafka.delete_topic(kafka_bootstrap, f"{unique}.ns.r")
    # A deleted topic takes its policies along; a namespace with topics is not empty.
    assert http.post(f"{base}/x/delayedDelivery", json={"tickTime": 5}).status_code == 204
    assert http.post(f"{base}/x/delayedDelivery", params={"isGlobal": "true"},
                     json={"tickTime": 6}).status_code == 204
    assert http.delete(f"{base}/x").status_code == 204
    assert f"{unique}.ns.x" not in kafka.partition_counts(kafka_bootstrap)
    assert http.put(f"{base}/x").status_code == 204
    for params in ({}, {"isGlobal": "true"}):
        assert http.get(f"{base}/x/delayedDelivery", params=params).text == "null"
    assert http.delete(f"{base}/x").status_code == 204
    for topic in ("p", "q"):
        busy = http.delete(f"/admin/v2/namespaces/{ns}")
        assert (busy.status_code, _reason(busy)) == (409, "Cannot delete non empty namespace")
        assert http.delete(f"{base}/{topic}/partitions").status_code == 204
    assert http.get(base).json() == []
    assert http.delete(f"/admin/v2/namespaces/{ns}").status_code == 204


def test_topic_policy_needs_the_topic_and_a_valid_name(http: httpx.Client, unique: str) -> None:
    """As in Pulsar (TopicPoliciesBase.preValidation), a topic policy names a topic that
    exists: 404 otherwise, whether or not its namespace does."""
    ns = _namespace(http, unique)
    for topic in (f"{unique}/nope/x", f"{ns}/x"):
        for method in ("GET", "POST", "DELETE"):
            resp = http.request(method, f"/admin/v2/persistent/{topic}/delayedDelivery",
                                json={"tickTime": 5} if method == "POST" else None)
            assert (resp.status_code, _reason(resp)) == (
                404, f"Topic persistent://{topic} not found")
            if method == "GET":
                resp = http.get(f"/admin/v2/persistent/{topic}/delayedDelivery",
                                params={"applied": "true"})
                assert resp.status_code == 404
    bad = http.post(f"/admin/v2/persistent/{ns}/a%20b/delayedDelivery", json={"tickTime": 5})
    assert bad.status_code == 412 and "whitespace" in _reason(bad)
    reserved = http.get("/admin/v2/persistent/dwell/ns/x/delayedDelivery")
    assert reserved.status_code == 412 and "reserved" in _reason(reserved)
    query = http.get(f"/admin/v2/persistent/{ns}/x/delayedDelivery", params={"applied": "maybe"})
    assert query.status_code == 400 and "applied" in _reason(query)


def test_readyz_metrics_docs(http: httpx.Client, unique: str) -> None:
    assert http.get("/readyz").json() == {"ready": True, "redis": True, "kafka": True,
                                          "rebuildingStore": False}
    _namespace(http, unique)
    metrics = http.get("/metrics").text
    assert 'dwell_policy_changes_total{kind="namespace_create"}' in metrics
    version = [line for line in metrics.splitlines() if line.startswith("dwell_policy_version ")]
    assert version and float(version[0].split()[1]) >= 2
    assert http.get("/openapi.json").json()["paths"][
        "/admin/v2/persistent/{tenant}/{namespace}/{topic}/delayedDelivery"]
    assert http.get("/docs").status_code == 200


def test_kill_9_loses_nothing(services, unique: str) -> None:  # type: ignore[no-untyped-def]
    svc = services.start("policy", env=BROKER)
    with httpx.Client(base_url=svc.url, timeout=30) as http:
        ns = _namespace(http, unique, "x")
        assert http.post(f"/admin/v2/namespaces/{ns}/delayedDelivery",
                         json={"maxDeliveryDelayInMillis": 7000}).status_code == 204
        assert http.post(f"/admin/v2/persistent/{ns}/x/delayedDelivery",
                         json={"tickTime": 20}).status_code == 204
    svc.kill()
    svc.start()
    svc.wait_ready()
    try:
        with httpx.Client(base_url=svc.url, timeout=30) as http:
            assert unique in http.get("/admin/v2/tenants").json()
            assert http.get(f"/admin/v2/namespaces/{unique}").json() == [ns]
            assert http.get(f"/admin/v2/persistent/{ns}/x/delayedDelivery",
                            params={"applied": "true"}).json() == {
                "active": True, "tickTime": 20, "maxDeliveryDelayInMillis": 7000,
                "fixedDeliveryDelayInMillis": 0}
    finally:
        svc.stop()
