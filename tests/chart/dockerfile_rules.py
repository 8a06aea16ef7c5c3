"""The lint rules for the images the chart runs (tests/chart/test_dockerfiles.py applies
them): docker/dwell.Dockerfile (policy, admission, tracker),
docker/spark.Dockerfile (the Spark driver and executors) and docker/spark-entrypoint.sh,
without a Docker engine. Hadolint-like rules (pinned bases, a numeric non-root user, apt
and pip hygiene, no ADD/sudo/curl|sh, COPY sources that exist and survive .dockerignore)
and dwell's contracts (ports, environment, the pyspark pin against pyproject.toml and
spark/pom.xml, the entrypoint's executor command line).

Each rule is a function of the parsed Dockerfile returning its problems, so besides
passing on the real files every rule is fed a broken variant and must report it."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import tomllib
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dockerfile_parse import DockerfileParser

from dwell.admission.settings import AdmissionSettings
from dwell.policy.settings import PolicySettings
from dwell.tracker.settings import TrackerSettings
from dwell_spark.settings import SparkSettings

ROOT = Path(__file__).resolve().parent.parent.parent
DOCKER = ROOT / "docker"
ENTRYPOINT = DOCKER / "spark-entrypoint.sh"

Problems = list[str]


def _default(settings: type, field: str) -> int:
    return int(settings.model_fields[field].default)


def pyspark_pin(pyproject: Path) -> str:
    """The version pyproject.toml's `spark` extra pins pyspark to."""
    extra = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]["spark"]
    pins = [m.group(1) for dep in extra if (m := re.fullmatch(r"pyspark==(\S+)", dep))]
    assert len(pins) == 1, f"{pyproject}: the spark extra must pin pyspark once: {extra}"
    return pins[0]


PIN = pyspark_pin(ROOT / "pyproject.toml")


@dataclass(frozen=True)
class Image:
    """What an image owes the chart and the code."""

    dockerfile: Path
    title: str
    # The ports the processes listen on, from their settings classes' defaults (the chart
    # does not override them) plus the Spark driver's fixed RPC ports.
    ports: frozenset[int]
    env: dict[str, str]
    # Which pyspark the image installs; None: none at all.
    pyspark: str | None


COMMON_ENV = {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1",
              "DWELL_HTTP_HOST": "0.0.0.0"}
IMAGES = {
    "dwell": Image(
        dockerfile=DOCKER / "dwell.Dockerfile",
        title="dwell",
        ports=frozenset(_default(s, "http_port")
                        for s in (PolicySettings, AdmissionSettings, TrackerSettings)),
        env=COMMON_ENV,
        pyspark=None,
    ),
    "spark": Image(
        dockerfile=DOCKER / "spark.Dockerfile",
        title="dwell-spark",
        # 7078 spark.driver.port, 7079 spark.blockManager.port: the chart fixes both.
        ports=frozenset({_default(SparkSettings, "spark_metrics_port"), 7078, 7079}),
        env=COMMON_ENV | {
            "SPARK_HOME": "/opt/venv/lib/python3.11/site-packages/pyspark",
            "PYTHONPATH": "/opt/dwell/spark",
            "PYSPARK_PYTHON": "/opt/venv/bin/python",
            "JAVA_HOME": "/usr/lib/jvm/java-17-openjdk-amd64",
        },
        pyspark=PIN,
    ),
}


# --- reading a parsed Dockerfile ------------------------------------------------------

@dataclass(frozen=True)
class Step:
    instruction: str
    value: str
    line: int  # 1-based, as an editor shows it
    stage: int


def steps(df: DockerfileParser) -> list[Step]:
    out, stage = [], -1
    for item in df.structure:
        if item["instruction"] == "FROM":
            stage += 1
        out.append(Step(item["instruction"], item["value"].strip(), item["startline"] + 1,
                        stage))
    return out


def where(df: DockerfileParser, step: Step) -> str:
    return f"{Path(df.dockerfile_path).name}:{step.line}"


def from_parts(value: str) -> tuple[str, str | None]:
    """`FROM [--platform=...] image [AS name]` -> (image, name)."""
    words = [w for w in value.split() if not w.startswith("--")]
    name = words[2] if len(words) == 3 and words[1].lower() == "as" else None
    return words[0], name


def final_stage(df: DockerfileParser) -> list[Step]:
    all_steps = steps(df)
    last = max(s.stage for s in all_steps)
    return [s for s in all_steps if s.stage == last]


def copy_args(value: str) -> tuple[dict[str, str], list[str]]:
    """COPY/ADD's flags and paths, shell or JSON form: ({'from': 'jars'}, [src..., dest])."""
    words = json.loads(value) if value.startswith("[") else shlex.split(value)
    flags = {}
    while words and words[0].startswith("--"):
        key, _, val = words.pop(0)[2:].partition("=")
        flags[key] = val
    return flags, words


SEPARATORS = {"&&", "||", ";", "|", "&"}


def commands(run: str) -> list[list[str]]:
    """A RUN's shell commands as word lists, split at && || ; | (quotes respected)."""
    lexer = shlex.shlex(run, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    out: list[list[str]] = [[]]
    for token in lexer:
        if token in SEPARATORS:
            out.append([])
        else:
            out[-1].append(token)
    return [c for c in out if c]


def runs(df: DockerfileParser) -> list[Step]:
    return [s for s in steps(df) if s.instruction == "RUN"]


def subcommand(cmd: list[str], tool: tuple[str, ...], verb: str) -> list[str] | None:
    """The words after `<tool> ... <verb>` when cmd is that invocation, else None."""
    if not cmd or Path(cmd[0]).name not in tool:
        return None
    rest = cmd[1:]
    if Path(cmd[0]).name.startswith("python") and rest[:2] == ["-m", "pip"]:
        rest = rest[2:]
    elif Path(cmd[0]).name.startswith("python"):
        return None
    positional = [w for w in rest if not w.startswith("-")]
    if not positional or positional[0] != verb:
        return None
    return rest


# --- the rules: each takes the parsed Dockerfile and returns its problems ---------------

def global_args(df: DockerfileParser) -> dict[str, str | None]:
    """The ARGs declared before the first FROM (the only ones a FROM line may use), with
    their defaults (None: no default)."""
    out: dict[str, str | None] = {}
    for s in steps(df):
        if s.stage >= 0:
            break
        if s.instruction == "ARG":
            name, eq, default = s.value.partition("=")
            out[name.strip()] = default.strip().strip('"') if eq else None
    return out


ARG_REF = re.compile(r"^\$\{?(\w+)\}?$")


def rule_pinned_bases(df: DockerfileParser, image: Image) -> Problems:
    """Every FROM is a version-pinned image (a tag with major.minor, or a digest) or an
    earlier stage: `latest`, a bare name or `3` rebuild into something else silently. A
    FROM ${ARG} is judged by the ARG's default, what a plain `docker build` uses."""
    problems, stages, args = [], set(), global_args(df)
    for s in steps(df):
        if s.instruction != "FROM":
            continue
        ref, name = from_parts(s.value)
        if m := ARG_REF.match(ref):
            default = args.get(m.group(1))
            if default is None:
                problems.append(f"{where(df, s)}: FROM {ref}: no ARG {m.group(1)} with a "
                                "default before the first FROM")
                continue
            ref = default
        if ref not in stages and "@sha256:" not in ref:
            # A registry may carry a port (host:5000/x), so the tag is after the last '/'.
            tag = ref.split("/")[-1].partition(":")[2]
            if not tag:
                problems.append(f"{where(df, s)}: FROM {ref} has no tag; pin a version")
            elif tag == "latest" or not re.search(r"\d+\.\d+", tag):
                problems.append(f"{where(df, s)}: FROM {ref}: tag {tag!r} is not a specific "
                                "version (want major.minor at least, e.g. 3.11.14-slim)")
        if name:
            stages.add(name)
    return problems


BASE_ARG = "BASE_IMAGE"


def rule_one_base(df: DockerfileParser, image: Image) -> Problems:
    """Every stage starts FROM ${BASE_IMAGE} (ARG BASE_IMAGE before the first FROM): one
    Debian base for all stages, which `make images` replaces with one it makes from
    Debian's packages (--build-arg BASE_IMAGE=...), while the default keeps a plain
    `docker build` working."""
    name = Path(df.dockerfile_path).name
    problems = [] if BASE_ARG in global_args(df) else [
        f"{name}: no ARG {BASE_ARG} before the first FROM"]
    for s in steps(df):
        if s.instruction == "FROM":
            m = ARG_REF.match(from_parts(s.value)[0])
            if not m or m.group(1) != BASE_ARG:
                problems.append(f"{where(df, s)}: FROM {from_parts(s.value)[0]}, want "
                                f"FROM ${{{BASE_ARG}}}")
    return problems


def rule_stage_refs_by_name(df: DockerfileParser, image: Image) -> Problems:
    """COPY --from names an earlier stage: an index breaks when a stage is inserted, and an
    image there would bypass the pinned-FROM rule."""
    problems, stages = [], []
    for s in steps(df):
        if s.instruction == "FROM":
            stages.append(from_parts(s.value)[1])
        elif s.instruction in ("COPY", "ADD"):
            src = copy_args(s.value)[0].get("from")
            if src is not None and src not in stages[:-1]:
                problems.append(f"{where(df, s)}: --from={src} is not the name of an earlier "
                                f"stage ({[n for n in stages[:-1] if n]})")
    return problems


def rule_non_root_user(df: DockerfileParser, image: Image) -> Problems:
    """The final stage ends as a numeric uid:gid other than 0: Kubernetes' runAsNonRoot can
    only verify a numeric user, and the chart's runAsUser names the same one."""
    users = [s for s in final_stage(df) if s.instruction == "USER"]
    if not users:
        return [f"{Path(df.dockerfile_path).name}: the final stage has no USER (runs as root)"]
    last = users[-1]
    uid, _, gid = last.value.partition(":")
    if not uid.isdigit() or (gid and not gid.isdigit()):
        return [f"{where(df, last)}: USER {last.value} is not numeric uid[:gid]"]
    if int(uid) == 0 or (gid and int(gid) == 0):
        return [f"{where(df, last)}: USER {last.value} is root"]
    return []


def rule_apt_hygiene(df: DockerfileParser, image: Image) -> Problems:
    """apt-get install -y --no-install-recommends, and the same RUN drops the package lists
    (a later RUN cannot shrink the layer that holds them)."""
    problems = []
    for s in runs(df):
        cmds = commands(s.value)
        installs = [rest for c in cmds
                    if (rest := subcommand(c, ("apt-get", "apt"), "install")) is not None]
        for rest in installs:
            if not any(w in ("--yes", "--assume-yes") or re.fullmatch(r"-[a-z]*y[a-z]*", w)
                       for w in rest):
                problems.append(f"{where(df, s)}: apt-get install without -y")
            if "--no-install-recommends" not in rest:
                problems.append(f"{where(df, s)}: apt-get install without "
                                "--no-install-recommends")
        cleaned = any(c[0] == "rm" and any(w.startswith("/var/lib/apt/lists") for w in c)
                      for c in cmds)
        if installs and not cleaned:
            problems.append(f"{where(df, s)}: apt-get install without rm -rf "
                            "/var/lib/apt/lists/* in the same RUN")
    return problems


def rule_pip_no_cache(df: DockerfileParser, image: Image) -> Problems:
    """pip install --no-cache-dir: the wheel cache would ship in the layer."""
    return [f"{where(df, s)}: pip install without --no-cache-dir"
            for s in runs(df) for c in commands(s.value)
            if (rest := subcommand(c, ("pip", "pip3", "python", "python3"), "install"))
            is not None and "--no-cache-dir" not in rest]


def rule_risky_instructions(df: DockerfileParser, image: Image) -> Problems:
    """No ADD (it fetches URLs and unpacks archives behind COPY's back), no sudo, no
    `curl ... | sh`: what runs at build time is pinned and visible."""
    problems = []
    for s in steps(df):
        if s.instruction == "ADD":
            srcs = copy_args(s.value)[1][:-1]
            what = "of a URL " if any(re.match(r"[a-z]+://|git@", p) for p in srcs) else ""
            problems.append(f"{where(df, s)}: ADD {what}({' '.join(srcs)}); use COPY")
        if s.instruction != "RUN":
            continue
        cmds = commands(s.value)
        if any("sudo" in c for c in cmds):
            problems.append(f"{where(df, s)}: sudo in RUN; switch USER instead")
        if re.search(r"\b(curl|wget)\b[^;&]*\|\s*(sudo\s+)?(ba|da|z)?sh\b", s.value):
            problems.append(f"{where(df, s)}: a download piped into a shell")
    return problems


def rule_copy_sources(df: DockerfileParser, image: Image) -> Problems:
    """Each COPY source from the build context exists and .dockerignore keeps it: an
    excluded source fails the build, or worse, copies an empty directory."""
    patterns = dockerignore(ROOT / ".dockerignore")
    problems = []
    for s in steps(df):
        if s.instruction not in ("COPY", "ADD"):
            continue
        flags, paths = copy_args(s.value)
        if "from" in flags:
            continue
        for src in paths[:-1]:
            rel = os.path.normpath(src.lstrip("/"))
            if rel.startswith(".."):
                problems.append(f"{where(df, s)}: {src} is outside the build context")
            elif not list(ROOT.glob(rel)):
                problems.append(f"{where(df, s)}: {src} does not exist in the repository")
            elif ignored(rel, patterns):
                problems.append(f"{where(df, s)}: {src} is excluded by .dockerignore")
    return problems


def rule_exposed_ports(df: DockerfileParser, image: Image) -> Problems:
    """The final stage EXPOSEs exactly the ports the processes listen on."""
    exposed = {int(p.split("/")[0]) for s in final_stage(df) if s.instruction == "EXPOSE"
               for p in s.value.split()}
    if exposed != image.ports:
        return [f"{Path(df.dockerfile_path).name}: EXPOSE {sorted(exposed)}, the processes "
                f"listen on {sorted(image.ports)}"]
    return []


def rule_env(df: DockerfileParser, image: Image) -> Problems:
    """The final stage's environment: the venv first on PATH, and the values the processes
    need in a pod (listen on the pod IP, no bytecode on a read-only root, Spark's paths)."""
    env = df.envs
    problems = [f"{Path(df.dockerfile_path).name}: ENV {k}={env.get(k)!r}, want {v!r}"
                for k, v in image.env.items() if env.get(k) != v]
    if not env.get("PATH", "").startswith("/opt/venv/bin:"):
        problems.append(f"{Path(df.dockerfile_path).name}: PATH does not start with "
                        f"/opt/venv/bin: {env.get('PATH')!r}")
    return problems


def rule_oci_labels(df: DockerfileParser, image: Image) -> Problems:
    want = {"org.opencontainers.image.title": image.title,
            "org.opencontainers.image.licenses": "Apache-2.0"}
    labels = df.labels
    problems = [f"{Path(df.dockerfile_path).name}: LABEL {k}={labels.get(k)!r}, want {v!r}"
                for k, v in want.items() if labels.get(k) != v]
    if not labels.get("org.opencontainers.image.source", "").startswith("https://"):
        problems.append(f"{Path(df.dockerfile_path).name}: no "
                        "org.opencontainers.image.source URL")
    return problems


def rule_no_healthcheck(df: DockerfileParser, image: Image) -> Problems:
    """Kubernetes ignores HEALTHCHECK; the chart's probes are the health checks."""
    return [f"{where(df, s)}: HEALTHCHECK (the chart's probes do this)"
            for s in steps(df) if s.instruction == "HEALTHCHECK"]


def installed_pyspark(df: DockerfileParser) -> set[str]:
    """Versions of pyspark the image's pip installs name: pyspark==X directly, or the
    repository's `spark` extra (whose pin pyproject.toml holds)."""
    found = set()
    for s in runs(df):
        for c in commands(s.value):
            rest = subcommand(c, ("pip", "pip3", "python", "python3"), "install")
            for word in [w for w in rest or [] if not w.startswith("-")][1:]:
                if m := re.fullmatch(r"pyspark==(\S+)", word):
                    found.add(m.group(1))
                elif (m := re.fullmatch(r"\.\[([\w,\s-]+)\]", word)) and "spark" in [
                        e.strip() for e in m.group(1).split(",")]:
                    found.add(PIN)
    return found


def rule_pyspark_pin(df: DockerfileParser, image: Image) -> Problems:
    """The Spark image installs exactly pyproject's pyspark (its jars are the runtime the
    Kafka connector is built for); the services' image installs none."""
    found = installed_pyspark(df)
    want = {image.pyspark} if image.pyspark else set()
    if found != want:
        return [f"{Path(df.dockerfile_path).name}: installs pyspark {sorted(found)}, want "
                f"{sorted(want)} (pyproject.toml's spark extra pins {PIN})"]
    return []


def rule_entrypoint_wired(df: DockerfileParser, image: Image) -> Problems:
    """ENTRYPOINT is exec-form tini -- the script the image COPYs, and tini is installed:
    Spark's executor pods pass only args (`executor`), so the entrypoint must survive."""
    name = Path(df.dockerfile_path).name
    entry = [s for s in final_stage(df) if s.instruction == "ENTRYPOINT"]
    if not entry or not entry[-1].value.startswith("["):
        return [f"{name}: no exec-form ENTRYPOINT"]
    argv = json.loads(entry[-1].value)
    problems = []
    if argv[:2] != ["/usr/bin/tini", "--"] or len(argv) != 3:
        problems.append(f"{name}: ENTRYPOINT {argv}, want [/usr/bin/tini, --, <script>]")
    copied = {(copy_args(s.value)[1][0], copy_args(s.value)[1][-1])
              for s in final_stage(df) if s.instruction == "COPY"}
    if ("docker/spark-entrypoint.sh", argv[-1]) not in copied:
        problems.append(f"{name}: {argv[-1]} is not docker/spark-entrypoint.sh's COPY "
                        "destination")
    if not any("tini" in (subcommand(c, ("apt-get", "apt"), "install") or [])
               for s in runs(df) for c in commands(s.value)):
        problems.append(f"{name}: tini is not installed")
    return problems


Rule = Callable[[DockerfileParser, Image], Problems]
COMMON_RULES: list[Rule] = [
    rule_pinned_bases, rule_one_base, rule_stage_refs_by_name, rule_non_root_user, rule_apt_hygiene,
    rule_pip_no_cache, rule_risky_instructions, rule_copy_sources, rule_exposed_ports,
    rule_env, rule_oci_labels, rule_no_healthcheck, rule_pyspark_pin,
]
CHECKS = [(image, rule) for image in IMAGES for rule in COMMON_RULES] + [
    ("spark", rule_entrypoint_wired)]


# --- .dockerignore: Docker's matcher (moby/patternmatcher), for the patterns used here ---

def dockerignore(path: Path) -> list[tuple[bool, re.Pattern[str]]]:
    """(exclude?, regex) per pattern, in file order (the last match wins, as in Docker)."""
    out = []
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = os.path.normpath(line.lstrip("!").strip().lstrip("/"))
        out.append((not negate, re.compile(_pattern_regex(pattern))))
    return out


def _pattern_regex(pattern: str) -> str:
    # `**` spans directories (`**/` also none), `*` and `?` stay within one, as Go's
    # filepath.Match; character classes pass through.
    out, i = "^", 0
    while i < len(pattern):
        ch = pattern[i]
        if pattern.startswith("**/", i):
            out, i = out + "(.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif ch == "*":
            out, i = out + "[^/]*", i + 1
        elif ch == "?":
            out, i = out + "[^/]", i + 1
        elif ch == "[":
            end = pattern.index("]", i)
            out, i = out + pattern[i:end + 1], end + 1
        else:
            out, i = out + re.escape(ch), i + 1
    return out + "$"


def ignored(rel: str, patterns: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Whether Docker leaves rel out of the context: a pattern matching the path or one of
    its parent directories excludes it (a directory goes with everything in it)."""
    parts = Path(rel).parts
    prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    excluded = False
    for exclude, regex in patterns:
        if any(regex.match(p) for p in prefixes):
            excluded = exclude
    return excluded


# --- the Spark entrypoint's rules (they take the script's path) ------------------------

EXECUTOR_ARGS = [("--driver-url", "SPARK_DRIVER_URL"), ("--executor-id", "SPARK_EXECUTOR_ID"),
                 ("--cores", "SPARK_EXECUTOR_CORES"), ("--app-id", "SPARK_APPLICATION_ID"),
                 ("--hostname", "SPARK_EXECUTOR_POD_IP"),
                 ("--resourceProfileId", "SPARK_RESOURCE_PROFILE_ID"),
                 ("--podName", "SPARK_EXECUTOR_POD_NAME")]


def branch(script: str, word: str) -> str | None:
    """The text of the case branch `word)` up to its `;;`."""
    m = re.search(rf"^\s*{re.escape(word)}\)\s*$(.*?)^\s*;;", script, re.M | re.S)
    return m.group(1) if m else None


def rule_executor_branch(script: Path) -> Problems:
    """The executor branch execs what Spark 4.x's entrypoint runs: java with the executor
    memory, KubernetesExecutorBackend and its seven flags from Spark's pod variables."""
    text = branch(script.read_text(), "executor")
    if text is None:
        return [f"{script.name}: no `executor)` branch"]
    # (what a reader is told is missing, the pattern), quotes and braces optional.
    expected = [("exec", r"\bexec\b"), ("$JAVA_HOME/bin/java", r"\$\{?JAVA_HOME\}?/bin/java"),
                ('-Xms"$SPARK_EXECUTOR_MEMORY"', r"-Xms\"?\$\{?SPARK_EXECUTOR_MEMORY\b"),
                ('-Xmx"$SPARK_EXECUTOR_MEMORY"', r"-Xmx\"?\$\{?SPARK_EXECUTOR_MEMORY\b"),
                ('-cp "$SPARK_CLASSPATH"', r"-cp \"\$\{?SPARK_CLASSPATH\b"),
                ("org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend",
                 r"org\.apache\.spark\.scheduler\.cluster\.k8s\.KubernetesExecutorBackend")]
    expected += [(f'{flag} "${var}"', rf"{re.escape(flag)}\s+\"?\$\{{?{var}\}}?\"?(\s|$)")
                 for flag, var in EXECUTOR_ARGS]
    return [f"{script.name}: the executor branch lacks {what}" for what, pattern in expected
            if not re.search(pattern, text, re.M)]


def rule_driver_branch(script: Path) -> Problems:
    text = branch(script.read_text(), "driver")
    want = [r"spark-submit",
            r"spark\.driver\.bindAddress=\$\{?SPARK_DRIVER_BIND_ADDRESS\}?",
            r"--deploy-mode client", r"\"\$@\""]
    if text is None:
        return [f"{script.name}: no `driver)` branch"]
    return [f"{script.name}: the driver branch lacks {p}" for p in want
            if not re.search(p, text)]


def rule_bash_syntax(script: Path) -> Problems:
    got = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    return [f"{script.name}: bash -n: {got.stderr.strip()}"] if got.returncode else []


def rule_executable(script: Path) -> Problems:
    mode = script.stat().st_mode & 0o777
    return [] if mode & 0o111 == 0o111 else [f"{script.name}: mode {mode:o}, want 755"]


def rule_pom_spark_version(pom: Path) -> Problems:
    """spark/pom.xml resolves the Kafka connector for pyspark's Spark: same version."""
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    version = ET.parse(pom).getroot().findtext("m:properties/m:spark.version", namespaces=ns)
    if version != PIN:
        return [f"{pom.name}: spark.version {version}, pyproject.toml pins pyspark=={PIN}"]
    return []


SCRIPT_RULES = [rule_executor_branch, rule_driver_branch, rule_bash_syntax, rule_executable]
