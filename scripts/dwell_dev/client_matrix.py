"""dwell-client on every Python it supports, 3.9 to 3.13, against a running dwell.

Builds the client's wheel and sdist (or takes them from ``--dist``, as `make dist` leaves
them) and, for each version, makes a fresh virtualenv and installs the wheel into it (the
sdist on Python 3.9, so that the sdist is proven too), letting pip pick the dependencies'
versions for that Python. In each, it runs scripts/client_matrix_e2e.py against the stack
(one message published with a 2 s delay, received on time, nacked, received again and
acked) while only dwell-client is installed, then installs the ``admin`` extra and pytest
and runs the client's unit tests (tests/unit/client). Prints the matrix; with ``--sizes``
also the packages and sizes that ``pip install <wheel>`` brought into the Python 3.13
virtualenv, next to those of the services' full install (the image's
``pip install -c constraints.txt``, wheels of both distributions) in a fresh Python 3.11
virtualenv. Exits 1 if any cell fails.

    .venv/bin/python -m dwell_dev.client_matrix [--sizes] [--dist dist] \\
        [--policy-url URL --admission-url URL --tracker-url URL --bootstrap HOST:PORT]

The addresses default to the DWELL_POLICY_URL, DWELL_ADMISSION_URL, DWELL_TRACKER_URL and
DWELL_KAFKA_BOOTSTRAP variables, then to the local stack's (`make up`). `make
client-matrix` runs it through tests/e2e/test_client_matrix.py on the test stack.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar
from xml.etree import ElementTree

import httpx

from dwell import endpoints
from dwell_dev.devinstall import ROOT

VERSIONS = ("3.9", "3.10", "3.11", "3.12", "3.13")
# The oldest Python installs from the sdist: it builds there with whatever setuptools pip
# picks for it.
SDIST_VERSION = "3.9"
# The newest Python, where the sizes of the client's install are measured; the services'
# full install goes where the services run (pyproject.toml's requires-python).
SIZES_VERSION = "3.13"
FULL_VERSION = "3.11"
E2E_SCRIPT = ROOT / "scripts" / "client_matrix_e2e.py"
CLIENT_TESTS = ROOT / "tests" / "unit" / "client"
DELAY_MS = 2000
NACK_DELAY_MS = 1000
# How late a delivery may come beyond deliverAt + tickTime: Pulsar's 1 s, plus one drain
# trigger and one drain round of the Spark app (the e2e suite's SPARK_MARGIN_MS).
LATE_MS = 1000 + 1500
# How late a redelivery may come beyond the nack + its delay: one redelivery tick, the
# drain's trigger and round, and the backoff micro-batches that outlast the delay (the e2e
# suite's redelivery_margin_ms for a 1 s delay).
REDELIVERY_LATE_MS = 100 + 1500 + 2 * 3000 - NACK_DELAY_MS
# How long a pip install or a test run may take before its cell fails; the end to end
# gets E2E_TIMEOUT_S for its message, and a minute more to start and stop.
STEP_TIMEOUT_S = 600
E2E_TIMEOUT_S = 60

T = TypeVar("T")


class MatrixError(RuntimeError):
    """Something the whole matrix needs is missing: a Python, a build, the stack."""


@dataclass(frozen=True)
class Endpoints:
    """Where the stack under test listens."""

    policy: str
    admission: str
    tracker: str
    bootstrap: str

    def client_env(self) -> dict[str, str]:
        """The variables dwell-client reads its addresses from."""
        return {endpoints.POLICY_URL_ENV: self.policy,
                endpoints.ADMISSION_URL_ENV: self.admission,
                endpoints.TRACKER_URL_ENV: self.tracker,
                endpoints.KAFKA_BOOTSTRAP_ENV: self.bootstrap}


@dataclass(frozen=True)
class Dists:
    """The built distributions: dwell-client's wheel and sdist, and dwell's wheel (only
    needed for the sizes)."""

    client_wheel: Path
    client_sdist: Path
    services_wheel: Path | None


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    size: int  # bytes: the files its RECORD lists, as installed


@dataclass
class Cell:
    """One step's outcome for one Python: ``ok`` and what to print in the table."""

    ok: bool = False
    text: str = "not run"


@dataclass
class Row:
    version: str
    source: str  # "wheel" or "sdist"
    python: Path
    venv: Path
    interpreter: str = ""  # the full version, e.g. 3.9.18
    install: Cell = field(default_factory=Cell)
    tests: Cell = field(default_factory=Cell)
    e2e: Cell = field(default_factory=Cell)
    brought: list[Package] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.install.ok and self.tests.ok and self.e2e.ok


@dataclass
class Report:
    rows: list[Row]
    seconds: float
    full_install: list[Package] | None = None

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.rows) and len(self.rows) == len(VERSIONS)

    def client_install(self) -> list[Package]:
        """What ``pip install <client wheel>`` brought into the SIZES_VERSION virtualenv."""
        return next(r.brought for r in self.rows if r.version == SIZES_VERSION)

    def table(self) -> str:
        head = ("Python", "installed from", "client unit tests", "end to end")
        lines = [(r.interpreter or r.version, r.source,
                  r.tests.text if r.install.ok else r.install.text, r.e2e.text)
                 for r in self.rows]
        out = columns([head, *lines], "llll")
        verdict = "ok" if self.ok else "FAILED"
        out.append(f"matrix {verdict} in {self.seconds:.0f} s")
        return "\n".join(out)

    def sizes_table(self) -> str:
        """The client's install next to the full install: one row per package either
        brought, largest first, and the totals."""
        client = {p.name: p for p in self.client_install()}
        full = {p.name: p for p in self.full_install or []}
        names = sorted(client.keys() | full.keys(),
                       key=lambda n: (-max(client[n].size if n in client else 0,
                                           full[n].size if n in full else 0), n))
        head = ("package", f"dwell-client wheel, Python {SIZES_VERSION}",
                f"full install (dwell + dwell-client[admin]), Python {FULL_VERSION}")

        def cell(p: Package | None) -> str:
            return f"{p.version:>12} {mib(p.size):>10}" if p else ""

        rows = [(n, cell(client.get(n)), cell(full.get(n))) for n in names]
        out = columns([head, *rows], "lrr")
        out.append(out[1])
        out += columns([("total", f"{len(client)} packages {mib(sum_size(client.values()))}",
                         f"{len(full)} packages {mib(sum_size(full.values()))}")], "lrr",
                       widths=[len(x) for x in out[1].split("  ")])
        return "\n".join(out)


def columns(rows: list[tuple[str, ...]], align: str,
            widths: list[int] | None = None) -> list[str]:
    """``rows`` as text columns, ``align`` saying l(eft) or r(ight) for each; with no
    ``widths`` the first row is a heading, underlined."""
    heading = widths is None
    widths = widths or [max(len(r[i]) for r in rows) for i in range(len(align))]
    out = ["  ".join(c.rjust(w) if a == "r" else c.ljust(w)
                     for c, w, a in zip(r, widths, align, strict=True)).rstrip()
           for r in rows]
    if heading:
        out.insert(1, "  ".join("-" * w for w in widths))
    return out


def mib(size: int) -> str:
    return f"{size / 2**20:.2f} MiB"


def sum_size(packages: Iterable[Package]) -> int:
    return sum(p.size for p in packages)


def canonical(name: str) -> str:
    """A distribution's name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


# ---------------------------------------------------------------- finding and building


def find_python(version: str) -> Path:
    """The interpreter for ``version`` (e.g. "3.9"): pyenv's newest of that minor version,
    else ``python3.9`` on PATH; a MatrixError when there is none that runs."""
    home = Path.home() / ".pyenv" / "versions"
    found = sorted(home.glob(f"{version}.*/bin/python"),
                   key=lambda p: [int(x) for x in re.findall(r"\d+", p.parent.parent.name)])
    candidates = [*reversed(found)]
    on_path = shutil.which(f"python{version}")
    if on_path:
        candidates.append(Path(on_path))
    for python in candidates:
        got = subprocess.run([str(python), "-c", "import sys; print('%d.%d' % sys.version_info"
                              "[:2])"], capture_output=True, text=True, check=False)
        if got.returncode == 0 and got.stdout.strip() == version:
            return python
    raise MatrixError(f"no Python {version}: none under {home}/{version}.*, and no working "
                      f"python{version} on PATH")


def build(project: Path, dest: Path) -> None:
    """``python -m build`` of ``project`` (a pyproject.toml's folder): its sdist, and its
    wheel built from that sdist, into ``dest``."""
    got = subprocess.run([sys.executable, "-m", "build", "--outdir", str(dest), str(project)],
                         capture_output=True, text=True, check=False)
    if got.returncode != 0:
        raise MatrixError(f"python -m build {project} failed:\n{got.stdout[-3000:]}"
                          f"{got.stderr[-3000:]}")


def one(folder: Path, pattern: str) -> Path:
    found = sorted(folder.glob(pattern))
    if len(found) != 1:
        raise MatrixError(f"want one {pattern} in {folder}, found {[p.name for p in found]}")
    return found[0]


def dists(folder: Path, services: bool) -> Dists:
    return Dists(one(folder, "dwell_client-*-py3-none-any.whl"),
                 one(folder, "dwell_client-*.tar.gz"),
                 one(folder, "dwell-*-py3-none-any.whl") if services else None)


# ---------------------------------------------------------------- virtualenvs


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment without what would leak its own packages into a
    virtualenv's interpreter."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return env | (extra or {})


def step(argv: list[str], log: Path, timeout: float = STEP_TIMEOUT_S,
         env: dict[str, str] | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """Run ``argv``, its output appended to ``log`` (and returned)."""
    try:
        got = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                             env=child_env(env), cwd=cwd, check=False)
    except subprocess.TimeoutExpired as exc:
        out, err = (x.decode(errors="replace") if isinstance(x, bytes) else x or ""
                    for x in (exc.stdout, exc.stderr))
        got = subprocess.CompletedProcess(argv, -9, out, err + f"\ntimed out after {timeout}s")
    with open(log, "a") as f:
        f.write(f"$ {' '.join(argv)}\n{got.stdout}{got.stderr}exit {got.returncode}\n\n")
    return got


def last_line(got: subprocess.CompletedProcess[str]) -> str:
    lines = (got.stderr or got.stdout).strip().splitlines()
    return lines[-1][:160] if lines else f"exit {got.returncode}"


def make_venv(python: Path, venv: Path, log: Path) -> None:
    shutil.rmtree(venv, ignore_errors=True)
    got = step([str(python), "-m", "venv", str(venv)], log)
    if got.returncode != 0:
        raise MatrixError(f"{python} -m venv {venv}: {last_line(got)}")


def pip_install(venv: Path, log: Path, *requirements: str) -> subprocess.CompletedProcess[str]:
    return step([str(venv / "bin" / "python"), "-m", "pip", "install", "--no-input",
                 "--disable-pip-version-check", *requirements], log)


# Run by a virtualenv's interpreter: each installed distribution, its version and the
# bytes of the files its RECORD lists.
_PACKAGES = """
import json, importlib.metadata as md
out = []
for d in md.distributions():
    size = 0
    for f in d.files or []:
        p = f.locate()
        if p.is_file():
            size += p.stat().st_size
    out.append([d.metadata["Name"], d.version, size])
print(json.dumps(out))
"""


def installed(venv: Path, log: Path) -> dict[str, Package]:
    got = step([str(venv / "bin" / "python"), "-c", _PACKAGES], log)
    if got.returncode != 0:
        raise MatrixError(f"listing {venv}'s packages: {last_line(got)}")
    return {canonical(n): Package(canonical(n), v, s) for n, v, s in json.loads(got.stdout)}


def brought(before: dict[str, Package], after: dict[str, Package]) -> list[Package]:
    """The packages an install added (by name), largest first."""
    return sorted((p for n, p in after.items() if n not in before),
                  key=lambda p: (-p.size, p.name))


# ---------------------------------------------------------------- the matrix's steps


def install_client(row: Row, artifact: Path, log: Path) -> None:
    """A fresh virtualenv with ``artifact`` (the wheel or the sdist) and its dependencies
    only; what it brought is kept on the row."""
    make_venv(row.python, row.venv, log)
    got = step([str(row.venv / "bin" / "python"), "-c",
                "import sys; print('%d.%d.%d' % sys.version_info[:3])"], log)
    row.interpreter = got.stdout.strip()
    before = installed(row.venv, log)
    got = pip_install(row.venv, log, str(artifact))
    if got.returncode != 0:
        row.install = Cell(False, f"FAILED: pip install: {last_line(got)}")
        return
    row.brought = brought(before, installed(row.venv, log))
    row.install = Cell(True, f"{len(row.brought)} packages")


def run_e2e(row: Row, stack: Endpoints, topic: str, tick_ms: int, late_ms: int,
            redelivery_late_ms: int, log: Path) -> None:
    got = step([str(row.venv / "bin" / "python"), str(E2E_SCRIPT), "--topic", topic,
                "--tick-ms", str(tick_ms), "--delay-ms", str(DELAY_MS), "--late-ms",
                str(late_ms), "--nack-delay-ms", str(NACK_DELAY_MS), "--redelivery-late-ms",
                str(redelivery_late_ms), "--timeout-s", str(E2E_TIMEOUT_S)], log,
               timeout=E2E_TIMEOUT_S + 60, env=stack.client_env(), cwd=row.venv)
    try:
        result = json.loads(got.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        result = {"ok": False, "error": last_line(got)}
    if got.returncode == 0 and result.get("ok"):
        row.e2e = Cell(True, f"ok: received {result['late_ms']:+d} ms from deliverAt, "
                             f"redelivered {result['redelivery_late_ms']:+d} ms from due")
    else:
        row.e2e = Cell(False, f"FAILED: {result.get('error')}")


def run_tests(row: Row, artifact: Path, log: Path, junit: Path) -> None:
    """The ``admin`` extra (the tests make tokens with dwell.auth) and pytest, then the
    client's unit tests on the installed package; any test not passed fails the cell."""
    got = pip_install(row.venv, log, f"{artifact}[admin]", "pytest")
    if got.returncode != 0:
        row.tests = Cell(False, f"FAILED: pip install [admin] pytest: {last_line(got)}")
        return
    got = step([str(row.venv / "bin" / "python"), "-m", "pytest", str(CLIENT_TESTS),
                "--noconftest", "-p", "no:cacheprovider", "-c", os.devnull, "--rootdir",
                str(CLIENT_TESTS), "-q", f"--junitxml={junit}"], log)
    try:
        suite = ElementTree.parse(junit).getroot()
        suite = suite if suite.tag == "testsuite" else suite[0]
        total, failed, errors, skipped = (int(suite.get(k, "0"))
                                          for k in ("tests", "failures", "errors", "skipped"))
    except (OSError, ElementTree.ParseError, IndexError):
        row.tests = Cell(False, f"FAILED: {last_line(got)}")
        return
    passed = total - failed - errors - skipped
    ok = got.returncode == 0 and total > 0 and passed == total
    text = f"{passed} passed" + "".join(
        f", {n} {what}" for n, what in ((failed, "failed"), (errors, "errors"),
                                        (skipped, "skipped")) if n)
    row.tests = Cell(ok, text if ok else f"FAILED: {text}")


def full_install(dist: Dists, work: Path) -> list[Package]:
    """The services' install (as the image makes it: the constraints file, both
    distributions) in a fresh FULL_VERSION virtualenv: what it brought."""
    assert dist.services_wheel is not None
    venv, log = work / f"full-{FULL_VERSION}", work / f"full-{FULL_VERSION}.log"
    make_venv(find_python(FULL_VERSION), venv, log)
    before = installed(venv, log)
    got = pip_install(venv, log, "-c", str(ROOT / "constraints.txt"), str(dist.client_wheel),
                      str(dist.services_wheel))
    if got.returncode != 0:
        raise MatrixError(f"the full install failed: {last_line(got)} (see {log})")
    return brought(before, installed(venv, log))


def make_namespace(stack: Endpoints) -> tuple[str, int]:
    """A new tenant and its namespace for this run, with the policy defaults; the
    namespace's name and its tickTime as the policy service applies it."""
    ns = f"matrix{uuid.uuid4().hex[:8]}/py"
    with httpx.Client(base_url=stack.policy, timeout=10) as http:
        for path, body in ((f"/admin/v2/tenants/{ns.split('/')[0]}",
                            {"adminRoles": [], "allowedClusters": []}),
                           (f"/admin/v2/namespaces/{ns}", None)):
            r = http.put(path, json=body)
            if r.status_code >= 300:
                raise MatrixError(f"PUT {stack.policy}{path}: {r.status_code} {r.text}")
        r = http.get(f"/admin/v2/namespaces/{ns}/delayedDelivery", params={"applied": "true"})
        if r.status_code != 200:
            raise MatrixError(f"GET delayedDelivery of {ns}: {r.status_code} {r.text}")
        return ns, int(r.json()["tickTime"])


def each(pool: ThreadPoolExecutor, fn: Callable[[Row], T], rows: list[Row]) -> list[T]:
    """``fn`` on every row at once; raises the first exception any raised."""
    return [f.result() for f in [pool.submit(fn, r) for r in rows]]


def run(stack: Endpoints, work: Path, *, dist_dir: Path | None = None, sizes: bool = False,
        late_ms: int = LATE_MS, redelivery_late_ms: int = REDELIVERY_LATE_MS) -> Report:
    """The matrix in ``work`` (emptied first): builds into ``work/dist`` unless
    ``dist_dir`` holds the distributions already."""
    started = time.monotonic()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    rows = [Row(v, "sdist" if v == SDIST_VERSION else "wheel", find_python(v),
                work / f"venv-{v}") for v in VERSIONS]
    if dist_dir is None:
        dist_dir = work / "dist"
        build(ROOT / "client", dist_dir)
        if sizes:
            build(ROOT, dist_dir)
    dist = dists(dist_dir, services=sizes)
    ns, tick_ms = make_namespace(stack)

    def artifact(row: Row) -> Path:
        return dist.client_sdist if row.source == "sdist" else dist.client_wheel

    def log(row: Row) -> Path:
        return work / f"python-{row.version}.log"

    with ThreadPoolExecutor(max_workers=len(rows) + 1) as pool:
        full = pool.submit(full_install, dist, work) if sizes else None
        each(pool, lambda r: install_client(r, artifact(r), log(r)), rows)
        full_packages = full.result() if full is not None else None
        # The end to end runs while dwell-client alone is installed, every version at once
        # (they mostly wait), after the installs so that they do not share the cores.
        ready = [r for r in rows if r.install.ok]
        each(pool, lambda r: run_e2e(r, stack, f"persistent://{ns}/v{r.version}", tick_ms,
                                     late_ms, redelivery_late_ms, log(r)), ready)
        # The unit tests keep the cores busy: one version after the other, so that their
        # timings are not each other's.
        for r in ready:
            run_tests(r, artifact(r), log(r), work / f"junit-{r.version}.xml")
    return Report(rows, time.monotonic() - started, full_packages)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policy-url", default=endpoints.policy_url())
    ap.add_argument("--admission-url", default=endpoints.admission_url())
    ap.add_argument("--tracker-url", default=endpoints.tracker_url())
    ap.add_argument("--bootstrap", default=endpoints.kafka_bootstrap())
    ap.add_argument("--dist", type=Path, default=None,
                    help="take the distributions from here (make dist: dist/) instead of "
                         "building them")
    ap.add_argument("--sizes", action="store_true",
                    help=f"also the packages of the client's install on Python {SIZES_VERSION}"
                         f" and of the services' full install on Python {FULL_VERSION}")
    ap.add_argument("--late-ms", type=int, default=LATE_MS,
                    help="how much later than deliverAt + tickTime a delivery may come "
                         f"(default {LATE_MS})")
    ap.add_argument("--redelivery-late-ms", type=int, default=REDELIVERY_LATE_MS,
                    help="how much later than the nack + its delay the redelivery may come "
                         f"(default {REDELIVERY_LATE_MS})")
    args = ap.parse_args()
    stack = Endpoints(args.policy_url, args.admission_url, args.tracker_url, args.bootstrap)
    work = Path(tempfile.mkdtemp(prefix="dwell-client-matrix-"))
    try:
        report = run(stack, work, dist_dir=args.dist, sizes=args.sizes, late_ms=args.late_ms,
                     redelivery_late_ms=args.redelivery_late_ms)
    except MatrixError as exc:
        print(f"client matrix: {exc}\n(logs in {work})", file=sys.stderr)
        return 1
    print(report.table())
    if args.sizes:
        print()
        print(report.sizes_table())
    if report.ok:
        shutil.rmtree(work, ignore_errors=True)
        return 0
    print(f"logs kept in {work}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
