"""`make images`: builds the two images from docker/dwell.Dockerfile and
docker/spark.Dockerfile with Debian's podman, on a bookworm base made each run with
mmdebstrap from the machine's own Debian sources, saves them as OCI archives and
records their digests under `.dwell/images/`; `check` runs them against the local
Redis and Kafka.

Nothing machine-wide changes: podman reads the containers.conf and storage.conf written
under `.dwell/podman/` (CONTAINERS_CONF, CONTAINERS_STORAGE_CONF), and its images live
there too. Standard library only, like devstack.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from dwell_dev import ROOT, say

STATE = ROOT / ".dwell"
PODMAN_HOME = STATE / "podman"
OUT = STATE / "images"
DIGESTS = OUT / "digests.json"

BASE_REPO = "localhost/dwell-base"
# (name, Dockerfile, tag): the tags the Tiltfile, skaffold.yaml and the dev values use.
IMAGES = {
    "dwell": (ROOT / "docker" / "dwell.Dockerfile", "localhost/dwell:dev"),
    "dwell-spark": (ROOT / "docker" / "spark.Dockerfile", "localhost/dwell-spark:dev"),
}
# The base holds what every stage installs first; the Dockerfiles still install them, so
# that they work on Docker Hub's debian image too.
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates")
# Debian's packages podman needs here: runc, because crun cannot set RLIMIT_NOFILE in
# this kind of sandbox; uidmap for the user namespaces builds set up.
APT_PACKAGES = {"mmdebstrap": "mmdebstrap", "podman": "podman", "buildah": "buildah",
                "runc": "runc", "newuidmap": "uidmap"}
# The machine's settings for reaching package registries (a proxy's CA, pip's index):
# copied into the base that `make images` makes, as on any machine behind such a proxy.
HOST_CA_DIR = Path("/usr/local/share/ca-certificates")
HOST_PIP_CONF = Path("/etc/pip.conf")
# SOURCE_DATE_EPOCH for mmdebstrap unless the caller sets one (2025-01-01).
BASE_EPOCH = 1735689600

CONTAINERS_CONF = """\
# Written by scripts/images.py for `make images`; podman reads it through CONTAINERS_CONF.
[containers]
# crun and runc both fail without explicit limits here (setrlimit RLIMIT_NOFILE: EPERM).
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
netns = "host"

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "{home}/events.log"
tmp_dir = "{home}/tmp"
volume_path = "{home}/volumes"
"""
STORAGE_CONF = """\
# Written by scripts/images.py; podman reads it through CONTAINERS_STORAGE_CONF.
[storage]
driver = "overlay"
graphroot = "{home}/storage"
runroot = "{home}/run"
"""



def ensure_packages() -> None:
    """Debian's mmdebstrap, podman, buildah, runc and uidmap, installed when missing."""
    missing = sorted({pkg for cmd, pkg in APT_PACKAGES.items() if not shutil.which(cmd)})
    if not missing:
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        sys.exit(f"dwell: install Debian's {' '.join(missing)} packages for `make images`")
    say(f"installing Debian's {' '.join(missing)} (apt-get)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    # Another apt-get on the machine holds the lock for a while: wait for it.
    lock = ["-o", "DPkg::Lock::Timeout=600"]
    subprocess.run(["apt-get", *lock, "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", *lock, "install", "-y", "-qq", "--no-install-recommends",
                    *missing], check=True, env=env, stdout=subprocess.DEVNULL)


def podman_env() -> dict[str, str]:
    """The environment every podman call gets: its configuration under .dwell/podman."""
    for sub in ("tmp", "volumes", "storage", "run"):
        (PODMAN_HOME / sub).mkdir(parents=True, exist_ok=True)
    conf = PODMAN_HOME / "containers.conf"
    storage = PODMAN_HOME / "storage.conf"
    conf.write_text(CONTAINERS_CONF.format(home=PODMAN_HOME))
    storage.write_text(STORAGE_CONF.format(home=PODMAN_HOME))
    return dict(os.environ, CONTAINERS_CONF=str(conf), CONTAINERS_STORAGE_CONF=str(storage))


def podman(*args: str, capture: bool = False, check: bool = True,
           timeout: float | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], check=check, text=True, env=podman_env(),
                          capture_output=capture, timeout=timeout)


def debian_codename() -> str:
    for line in Path("/etc/os-release").read_text().splitlines():
        if line.startswith("VERSION_CODENAME="):
            return line.split("=", 1)[1].strip('"')
    sys.exit("dwell: /etc/os-release names no Debian codename")


def _debian_sources() -> Path:
    """The machine's own apt sources (deb822 or one-line form), which mmdebstrap copies."""
    for path in (Path("/etc/apt/sources.list.d/debian.sources"), Path("/etc/apt/sources.list")):
        if path.exists() and path.read_text().strip():
            return path
    sys.exit("dwell: no Debian apt sources on this machine for mmdebstrap")


def _tar_content_hash(path: Path) -> str:
    """What a root filesystem holds, whatever the time it was made: names, modes, owners,
    links and file contents, not mtimes."""
    h = hashlib.sha256()
    with tarfile.open(path) as tar:
        for m in sorted(tar.getmembers(), key=lambda m: m.name):
            h.update(f"{m.name}\0{m.mode}\0{m.uid}\0{m.gid}\0{m.type!r}\0{m.linkname}\0"
                     .encode())
            if m.isfile():
                f = tar.extractfile(m)
                assert f is not None
                h.update(hashlib.sha256(f.read()).digest())
    return h.hexdigest()


def make_base() -> str:
    """A Debian base made now with mmdebstrap from the machine's Debian sources, with the
    machine's CA certificates and pip configuration; imported into podman when its
    contents differ from the last one, so that an unchanged base keeps the build cache."""
    codename = debian_codename()
    work = PODMAN_HOME / "base"
    work.mkdir(parents=True, exist_ok=True)
    tar = work / f"{codename}.tar"
    hooks: list[str] = []
    if HOST_CA_DIR.is_dir() and any(HOST_CA_DIR.glob("*.crt")):
        hooks += ["--customize-hook=mkdir -p \"$1/usr/local/share/ca-certificates\"",
                  f"--customize-hook=cp {HOST_CA_DIR}/*.crt \"$1/usr/local/share/"
                  "ca-certificates/\"",
                  "--customize-hook=chroot \"$1\" update-ca-certificates"]
    if HOST_PIP_CONF.is_file():
        hooks.append(f"--customize-hook=cp {HOST_PIP_CONF} \"$1/etc/pip.conf\"")
    # What differs between two runs on the same packages: the install logs.
    hooks.append("--customize-hook=rm -f \"$1\"/var/log/dpkg.log \"$1\"/var/log/alternatives.log "
                 "\"$1\"/var/log/apt/*.log \"$1\"/var/cache/ldconfig/aux-cache")
    t0 = time.monotonic()
    say(f"mmdebstrap {codename} (minbase + {', '.join(BASE_PACKAGES)})")
    subprocess.run(["mmdebstrap", "--quiet", "--variant=minbase",
                    f"--include={','.join(BASE_PACKAGES)}", *hooks, codename, str(tar),
                    str(_debian_sources())], check=True,
                   # A fixed time: mmdebstrap then makes the same tree from the same packages.
                   env=dict(os.environ, SOURCE_DATE_EPOCH=os.environ.get(
                       "SOURCE_DATE_EPOCH", str(BASE_EPOCH))))
    content = _tar_content_hash(tar)
    tag = f"{BASE_REPO}:{codename}"
    labels = podman("image", "inspect", "--format", "{{json .Labels}}", tag, capture=True,
                    check=False)
    current = json.loads(labels.stdout or "null") or {} if labels.returncode == 0 else {}
    if current.get("dev.dwell.rootfs-sha256") == content:
        say(f"base unchanged ({content[:12]}), {tag} kept "
            f"({time.monotonic() - t0:.0f}s)")
    else:
        podman("import", "--quiet", "--change", f"LABEL dev.dwell.rootfs-sha256={content}",
               "--change", 'CMD ["/bin/bash"]', str(tar), tag, capture=True)
        say(f"base imported as {tag} ({time.monotonic() - t0:.0f}s)")
    tar.unlink()
    return tag


def build(name: str, base: str) -> float:
    dockerfile, tag = IMAGES[name]
    t0 = time.monotonic()
    say(f"podman build {dockerfile.relative_to(ROOT)} -> {tag}")
    # --network host: the build reaches PyPI, Maven Central and Debian as this machine does.
    podman("build", "--network", "host", "--pull=never", "--build-arg", f"BASE_IMAGE={base}",
           "--layers", "-f", str(dockerfile), "-t", tag, str(ROOT))
    took = time.monotonic() - t0
    say(f"{tag} built in {took:.0f}s")
    return took


def inspect(ref: str) -> dict[str, str]:
    got = podman("image", "inspect", "--format",
                 '{"id": "{{.Id}}", "digest": "{{.Digest}}", "created": "{{.Created}}"}',
                 ref, capture=True)
    out: dict[str, str] = json.loads(got.stdout.strip())
    return out


def save(name: str) -> Path:
    """The image as an OCI archive (`podman load` or `skopeo copy oci-archive:` read it)."""
    tag = IMAGES[name][1]
    OUT.mkdir(parents=True, exist_ok=True)
    dest = OUT / f"{name}.oci.tar"
    partial = dest.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    podman("save", "--quiet", "--format", "oci-archive", "-o", str(partial), tag)
    partial.replace(dest)
    return dest


def archive_digest(archive: Path) -> str:
    """The manifest digest an OCI archive's index.json names (what a registry gets when
    the archive is copied to it unchanged)."""
    with tarfile.open(archive) as tar:
        index = tar.extractfile("index.json")
        if index is None:
            raise RuntimeError(f"{archive} has no index.json")
        manifests = json.loads(index.read())["manifests"]
    if len(manifests) != 1:
        raise RuntimeError(f"{archive}: {len(manifests)} manifests, want 1")
    digest: str = manifests[0]["digest"]
    return digest


def record(names: list[str], base: str) -> dict[str, object]:
    """Save the images as OCI archives and write their ids and digests, and the base's,
    to .dwell/images/digests.json (entries of images not named here are kept)."""
    out: dict[str, object] = {"base": {"image": base, **inspect(base)}}
    for name in names:
        archive = save(name)
        out[name] = {"image": IMAGES[name][1], **inspect(IMAGES[name][1]),
                     "archive": str(archive.relative_to(ROOT)),
                     "archive_digest": archive_digest(archive),
                     "archive_bytes": archive.stat().st_size}
    previous = json.loads(DIGESTS.read_text()) if DIGESTS.exists() else {}
    DIGESTS.write_text(json.dumps(previous | out, indent=2) + "\n")
    return out


def build_all(names: list[str]) -> dict[str, object]:
    ensure_packages()
    t0 = time.monotonic()
    base = make_base()
    base_seconds = round(time.monotonic() - t0)
    times = {name: round(build(name, base)) for name in names}
    out = record(names, base)
    out["seconds"] = {"base": base_seconds, **times, "total": round(time.monotonic() - t0)}
    DIGESTS.write_text(json.dumps(json.loads(DIGESTS.read_text()) | out, indent=2) + "\n")
    say(f"images ready in {out['seconds']}; digests in {DIGESTS.relative_to(ROOT)}")
    return out
