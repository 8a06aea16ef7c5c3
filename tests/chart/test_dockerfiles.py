"""Lint of the images the chart runs, without a Docker engine: the rules of
tests/chart/dockerfile_rules.py pass on docker/dwell.Dockerfile, docker/spark.Dockerfile
and docker/spark-entrypoint.sh, and each rule reports a broken variant of them; plus
.dockerignore's matcher and the entrypoint's command lines, run."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from dockerfile_parse import DockerfileParser

from .dockerfile_rules import (
    CHECKS,
    ENTRYPOINT,
    IMAGES,
    PIN,
    ROOT,
    SCRIPT_RULES,
    Problems,
    Rule,
    dockerignore,
    ignored,
    rule_apt_hygiene,
    rule_bash_syntax,
    rule_copy_sources,
    rule_driver_branch,
    rule_entrypoint_wired,
    rule_env,
    rule_executable,
    rule_executor_branch,
    rule_exposed_ports,
    rule_no_healthcheck,
    rule_non_root_user,
    rule_oci_labels,
    rule_one_base,
    rule_pinned_bases,
    rule_pip_no_cache,
    rule_pom_spark_version,
    rule_pyspark_pin,
    rule_risky_instructions,
    rule_stage_refs_by_name,
)

# --- tests: the real files pass every rule ----------------------------------------------

def parse(path: Path) -> DockerfileParser:
    assert path.is_file(), f"{path} is missing"
    return DockerfileParser(path=str(path))


@pytest.mark.parametrize(("image", "rule"), CHECKS,
                         ids=[f"{i}-{r.__name__.removeprefix('rule_')}" for i, r in CHECKS])
def test_dockerfile(image: str, rule: Rule) -> None:
    problems = rule(parse(IMAGES[image].dockerfile), IMAGES[image])
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("rule", SCRIPT_RULES, ids=lambda r: r.__name__.removeprefix("rule_"))
def test_entrypoint(rule: Callable[[Path], Problems]) -> None:
    problems = rule(ENTRYPOINT)
    assert not problems, "\n".join(problems)


def test_pom_spark_version() -> None:
    problems = rule_pom_spark_version(ROOT / "spark" / "pom.xml")
    assert not problems, "\n".join(problems)


# --- tests: every rule reports a broken variant ------------------------------------------

# (image, rule, text in the real Dockerfile, its replacement, words the problem must name)
BREAKAGES = [
    ("dwell", rule_pinned_bases, "ARG BASE_IMAGE=debian:12.11-slim",
     "ARG BASE_IMAGE=debian:latest", "'latest'"),
    ("dwell", rule_pinned_bases, "ARG BASE_IMAGE=debian:12.11-slim", "ARG BASE_IMAGE=debian",
     "no tag"),
    ("spark", rule_pinned_bases, "ARG BASE_IMAGE=debian:12.11-slim",
     "ARG BASE_IMAGE=debian:12-slim", "'12-slim'"),
    ("spark", rule_pinned_bases, "ARG BASE_IMAGE=debian:12.11-slim", "ARG BASE_IMAGE",
     "no ARG BASE_IMAGE with a default"),
    ("dwell", rule_pinned_bases, "FROM ${BASE_IMAGE} AS builder",
     "FROM python:latest AS builder", "'latest'"),
    ("dwell", rule_one_base, "FROM ${BASE_IMAGE} AS builder",
     "FROM python:3.11.14-slim-bookworm AS builder", "want FROM ${BASE_IMAGE}"),
    ("spark", rule_one_base, "FROM ${BASE_IMAGE} AS jars",
     "FROM maven:3.9.11-eclipse-temurin-17 AS jars", "maven:3.9.11"),
    ("spark", rule_one_base, "ARG BASE_IMAGE=debian:12.11-slim", "ARG BASE=debian:12.11-slim",
     "no ARG BASE_IMAGE"),
    ("dwell", rule_stage_refs_by_name, "--from=builder", "--from=0", "--from=0"),
    ("spark", rule_stage_refs_by_name, "--from=jars", "--from=maven:3.9.11", "--from=maven"),
    ("dwell", rule_non_root_user, "USER 10001:10001", "USER root", "not numeric"),
    ("spark", rule_non_root_user, "USER 10001:10001", "USER 0:0", "is root"),
    ("dwell", rule_non_root_user, "USER 10001:10001", "", "no USER"),
    ("spark", rule_apt_hygiene, "--no-install-recommends ", "", "--no-install-recommends"),
    ("spark", rule_apt_hygiene, "install -y ", "install ", "without -y"),
    ("spark", rule_apt_hygiene, " && rm -rf /var/lib/apt/lists/* \\\n", " \\\n",
     "/var/lib/apt/lists"),
    ("dwell", rule_pip_no_cache, "pip install --no-cache-dir -c", "pip install -c",
     "--no-cache-dir"),
    ("spark", rule_pip_no_cache, "pip install --no-cache-dir", "python -m pip install",
     "--no-cache-dir"),
    ("dwell", rule_risky_instructions, "COPY services ./services",
     "ADD https://example.com/s.tgz ./services", "URL"),
    ("dwell", rule_risky_instructions, " && groupadd", " && sudo groupadd", "sudo"),
    ("spark", rule_risky_instructions, "RUN mkdir -p /usr/share/man/man1",
     "RUN curl -fsSL https://example.com/i.sh | bash && mkdir -p /usr/share/man/man1",
     "shell"),
    ("dwell", rule_copy_sources, "COPY services ./services", "COPY servicez ./services",
     "does not exist"),
    ("dwell", rule_copy_sources, "COPY services ./services", "COPY tests ./services",
     ".dockerignore"),
    ("spark", rule_copy_sources, "COPY spark /opt", "COPY ../spark /opt", "outside"),
    ("dwell", rule_exposed_ports, "EXPOSE 8081 8082 8083", "EXPOSE 8081 8082", "8083"),
    ("spark", rule_exposed_ports, "EXPOSE 8084 7078 7079", "EXPOSE 8080 7078 7079", "8084"),
    ("dwell", rule_env, "DWELL_HTTP_HOST=0.0.0.0", "DWELL_HTTP_HOST=127.0.0.1",
     "DWELL_HTTP_HOST"),
    ("spark", rule_env, "SPARK_HOME=/opt/venv/lib/python3.11/",
     "SPARK_HOME=/opt/venv/lib/python3.12/", "SPARK_HOME"),
    ("spark", rule_env, "ENV PATH=/opt/venv/bin:$PATH", "ENV PATH=$PATH:/opt/venv/bin",
     "PATH"),
    ("dwell", rule_oci_labels, '"Apache-2.0"', '"MIT"', "licenses"),
    ("dwell", rule_no_healthcheck, "EXPOSE 8081 8082 8083",
     "EXPOSE 8081 8082 8083\nHEALTHCHECK CMD python -c 1", "HEALTHCHECK"),
    ("spark", rule_pyspark_pin, "'.[spark]'", "'.' 'pyspark==4.1.0'", "4.1.0"),
    ("spark", rule_pyspark_pin, "'.[spark]'", ".", "want"),
    ("dwell", rule_pyspark_pin, "./client .", "./client '.[spark]'", PIN),
    ("spark", rule_entrypoint_wired, '["/usr/bin/tini", "--", ', "[", "tini"),
    ("spark", rule_entrypoint_wired, "/opt/dwell/entrypoint.sh\n", "/opt/dwell/entry.sh\n",
     "COPY destination"),
]


def variant(tmp_path: Path, path: Path, old: str, new: str) -> Path:
    """A copy of path with old replaced; old must be there, or the test would prove
    nothing once the real file changes."""
    text = path.read_text()
    assert old in text, f"{path.name} no longer contains {old!r}: update BREAKAGES"
    out = tmp_path / path.name
    out.write_text(text.replace(old, new, 1))
    out.chmod(path.stat().st_mode & 0o777)
    return out


@pytest.mark.parametrize(("image", "rule", "old", "new", "expect"), BREAKAGES,
                         ids=[f"{b[0]}-{b[1].__name__.removeprefix('rule_')}-{n}"
                              for n, b in enumerate(BREAKAGES)])
def test_dockerfile_rule_reports(tmp_path: Path, image: str, rule: Rule, old: str, new: str,
                                 expect: str) -> None:
    broken = parse(variant(tmp_path, IMAGES[image].dockerfile, old, new))
    problems = rule(broken, IMAGES[image])
    assert any(expect in p for p in problems), f"{rule.__name__} missed it: {problems}"


@pytest.mark.parametrize(("rule", "old", "new", "expect"), [
    (rule_executor_branch, '      --podName "$SPARK_EXECUTOR_POD_NAME"\n', "\n", "--podName"),
    (rule_executor_branch, "k8s.KubernetesExecutorBackend",
     "CoarseGrainedExecutorBackend", "KubernetesExecutorBackend"),
    (rule_executor_branch, '-Xmx"$SPARK_EXECUTOR_MEMORY"', "", "-Xmx"),
    (rule_driver_branch, "--deploy-mode client \\\n", "--deploy-mode cluster \\\n",
     "client"),
    (rule_bash_syntax, "esac", "", "bash -n"),
], ids=["no-podName", "coarse-grained-backend", "no-Xmx", "cluster-mode", "syntax"])
def test_entrypoint_rule_reports(tmp_path: Path, rule: Callable[[Path], Problems], old: str,
                                 new: str, expect: str) -> None:
    problems = rule(variant(tmp_path, ENTRYPOINT, old, new))
    assert any(expect in p for p in problems), f"{rule.__name__} missed it: {problems}"


def test_executable_rule_reports(tmp_path: Path) -> None:
    script = tmp_path / ENTRYPOINT.name
    script.write_text(ENTRYPOINT.read_text())
    script.chmod(0o644)
    assert rule_executable(script)


def test_pom_rule_reports(tmp_path: Path) -> None:
    pom = variant(tmp_path, ROOT / "spark" / "pom.xml", f"<spark.version>{PIN}<",
                  "<spark.version>4.1.1<")
    assert any("4.1.1" in p for p in rule_pom_spark_version(pom))


# --- .dockerignore ------------------------------------------------------------------------

@pytest.mark.parametrize(("patterns", "path", "excluded"), [
    (["tests"], "tests/unit/test_x.py", True),
    (["tests"], "services/tests/x.py", False),
    (["/tests"], "tests", True),
    (["**/__pycache__"], "__pycache__/a.pyc", True),
    (["**/__pycache__"], "services/dwell/__pycache__/a.pyc", True),
    (["*.pyc"], "services/a.pyc", False),
    (["**/*.pyc"], "services/dwell/a.pyc", True),
    (["bench/out"], "bench/out/x.json", True),
    (["bench/out"], "bench/admission.py", False),
    (["spark/*.xml"], "spark/pom.xml", True),
    (["spark/?om.xml"], "spark/pom.xml", True),
    (["docs", "!docs/keep.md"], "docs/keep.md", False),
    (["!docs/keep.md", "docs"], "docs/keep.md", True),
])
def test_dockerignore_matcher(tmp_path: Path, patterns: list[str], path: str,
                              excluded: bool) -> None:
    (tmp_path / ".dockerignore").write_text("\n".join(patterns) + "\n")
    assert ignored(path, dockerignore(tmp_path / ".dockerignore")) is excluded


@pytest.mark.parametrize(("path", "excluded"), [
    (".git/HEAD", True), (".venv/bin/python", True), (".dwell/cache/x", True),
    ("bench/out/admission.json", True), ("services/dwell/__pycache__/x.cpython-311.pyc", True),
    ("spark/dwell_spark/x.pyc", True), (".pytest_cache/v", True), (".mypy_cache/x", True),
    (".ruff_cache/x", True), ("tests/unit/__init__.py", True),
    ("pyproject.toml", False), ("README.md", False), ("services/dwell/__init__.py", False),
    ("services/dwell/index/lua", False), ("spark/launch.py", False),
    ("spark/pom.xml", False), ("docker/spark-entrypoint.sh", False),
])
def test_dockerignore(path: str, excluded: bool) -> None:
    assert ignored(path, dockerignore(ROOT / ".dockerignore")) is excluded, (
        f"{path} should be {'excluded from' if excluded else 'in'} the build context")


# --- the entrypoint, run: the command lines it execs --------------------------------------

def fake_tool(path: Path) -> None:
    """An executable that prints its working directory and arguments, one per line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$PWD" "$@"\n')
    path.chmod(0o755)


def run_entrypoint(env: dict[str, str], *args: str) -> list[str]:
    got = subprocess.run(["bash", str(ENTRYPOINT), *args], capture_output=True, text=True,
                         env={"PATH": os.environ["PATH"], **env}, cwd="/", timeout=30)
    assert got.returncode == 0, got.stderr
    return got.stdout.splitlines()


def test_entrypoint_runs_executor(tmp_path: Path) -> None:
    spark_home, java_home = tmp_path / "spark", tmp_path / "jdk"
    local = [tmp_path / "local-1", tmp_path / "local-2"]
    for d in local:
        d.mkdir()
    fake_tool(java_home / "bin" / "java")
    env = {
        "SPARK_HOME": str(spark_home), "JAVA_HOME": str(java_home),
        "SPARK_LOCAL_DIRS": ",".join(map(str, local)), "SPARK_EXECUTOR_MEMORY": "1g",
        "SPARK_DRIVER_URL": "spark://CoarseGrainedScheduler@dwell-spark.ns.svc:7078",
        "SPARK_EXECUTOR_ID": "3", "SPARK_EXECUTOR_CORES": "1", "SPARK_APPLICATION_ID": "spark-1",
        "SPARK_EXECUTOR_POD_IP": "10.0.0.7", "SPARK_RESOURCE_PROFILE_ID": "0",
        "SPARK_EXECUTOR_POD_NAME": "dwell-spark-exec-3",
        # Spark numbers the options; 10 after 2, not between 1 and 2.
        "SPARK_JAVA_OPT_0": "-Dspark.driver.port=7078", "SPARK_JAVA_OPT_10": "-Da=10",
        "SPARK_JAVA_OPT_2": "-Db=two words",
    }
    assert run_entrypoint(env, "executor") == [
        str(local[0]),
        "-Dspark.driver.port=7078", "-Db=two words", "-Da=10",
        "-Xms1g", "-Xmx1g",
        "-cp", f"{spark_home}/conf:{spark_home}/jars/*:{local[0]}",
        "org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend",
        "--driver-url", env["SPARK_DRIVER_URL"], "--executor-id", "3", "--cores", "1",
        "--app-id", "spark-1", "--hostname", "10.0.0.7", "--resourceProfileId", "0",
        "--podName", "dwell-spark-exec-3",
    ]


def test_entrypoint_runs_driver(tmp_path: Path) -> None:
    fake_tool(tmp_path / "bin" / "spark-submit")
    env = {"SPARK_HOME": str(tmp_path), "JAVA_HOME": str(tmp_path),
           "SPARK_DRIVER_BIND_ADDRESS": "10.0.0.9"}
    assert run_entrypoint(env, "driver", "--name", "dwell", "/opt/dwell/spark/launch.py") == [
        "/", "--conf", "spark.driver.bindAddress=10.0.0.9",
        "--conf", "spark.executorEnv.SPARK_DRIVER_POD_IP=10.0.0.9",
        "--deploy-mode", "client", "--name", "dwell", "/opt/dwell/spark/launch.py",
    ]


def test_entrypoint_passes_other_commands_through(tmp_path: Path) -> None:
    fake_tool(tmp_path / "spark-submit")
    out = run_entrypoint({"JAVA_HOME": str(tmp_path)}, str(tmp_path / "spark-submit"),
                         "--master", "k8s://https://kubernetes.default.svc")
    assert out == ["/", "--master", "k8s://https://kubernetes.default.svc"]
