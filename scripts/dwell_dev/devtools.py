"""Tools built from their Go modules into `.dwell/cache/dev-tools/` (one folder per
version): the inner-loop tools, skaffold and tilt, for `make dev-tools` and the test that
checks the top-level `skaffold.yaml` and `Tiltfile`; and kms, the Go Kafka scheduler
(github.com/etf1/kafka-message-scheduler) that `bench/delivery.py --only 6` runs the
burst through beside dwell.

skaffold's and tilt's go.mod files carry `replace` directives, which
`go install mod@version` refuses, and the proxy lists no versions of kms, which
`go install` asks for. The build therefore runs inside the module's own source as the Go
module proxy serves it (`go mod download`), where its go.mod, replaces and go.sum apply
as they do upstream. Standard library only, like devstack.py.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from dwell_dev import ROOT, say

DEV_TOOLS = ROOT / ".dwell" / "cache" / "dev-tools"


@dataclass(frozen=True)
class Tool:
    name: str
    module: str
    version: str
    package: str  # the main package, relative to the module root
    ldflags: str
    # Tilt parses Python with go-tree-sitter, a cgo package: without cgo its files are
    # excluded and the build fails ("undefined: Node").
    cgo: bool = False

    @property
    def home(self) -> Path:
        return DEV_TOOLS / f"{self.name}-{self.version}"

    @property
    def binary(self) -> Path:
        return self.home / self.name


SKAFFOLD = Tool(
    "skaffold", "github.com/GoogleContainerTools/skaffold/v2", "v2.16.1", "./cmd/skaffold",
    "-s -w -X github.com/GoogleContainerTools/skaffold/v2/pkg/skaffold/version.version=v2.16.1")
TILT = Tool("tilt", "github.com/tilt-dev/tilt", "v0.33.21", "./cmd/tilt",
            "-s -w -X main.version=0.33.21", cgo=True)
# confluent-kafka-go links its bundled librdkafka through cgo.
KMS = Tool("kms", "github.com/etf1/kafka-message-scheduler", "v0.0.9", "./cmd/kafka",
           "-s -w -X main.version=v0.0.9", cgo=True)
TOOLS = {t.name: t for t in (SKAFFOLD, TILT, KMS)}



def build(tool: Tool) -> Path:
    """The tool's binary, built once per version (a `.built` stamp marks a finished build)."""
    stamp = tool.home / ".built"
    if tool.binary.exists() and stamp.exists() and stamp.read_text() == tool.ldflags:
        return tool.binary
    if not shutil.which("go"):
        sys.exit(f"dwell: go is needed to build {tool.name} ({tool.module})")
    if tool.cgo and not shutil.which("cc"):
        from dwell_dev.devinstall import apt_install  # scripts/: Debian packages, as root
        apt_install("gcc", f"{tool.name}'s cgo packages")
    t0 = time.monotonic()
    say(f"building {tool.name} {tool.version} from {tool.module} (once; several minutes)")
    info = json.loads(subprocess.run(
        ["go", "mod", "download", "-json", f"{tool.module}@{tool.version}"],
        check=True, capture_output=True, text=True, cwd=ROOT).stdout)
    src = Path(info["Dir"])
    tool.home.mkdir(parents=True, exist_ok=True)
    partial = tool.home / f".{tool.name}.partial"
    # -mod=readonly: the module's go.sum must already name every dependency, as upstream's
    # CI checks; GOFLAGS from the caller (e.g. -mod=vendor) would not fit this tree.
    env = dict(os.environ, CGO_ENABLED="1" if tool.cgo else "0",
               GOFLAGS="-mod=readonly -buildvcs=false",
               GOWORK="off")
    subprocess.run(["go", "build", "-trimpath", "-ldflags", tool.ldflags, "-o", str(partial),
                    tool.package], check=True, cwd=src, env=env)
    partial.replace(tool.binary)
    stamp.write_text(tool.ldflags)
    say(f"{tool.name} {tool.version} ready in {time.monotonic() - t0:.0f}s: "
        f"{tool.binary.relative_to(ROOT)}")
    return tool.binary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="devtools", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build the tools that are missing (default: all)")
    b.add_argument("names", nargs="*", metavar="|".join(TOOLS))
    p = sub.add_parser("path", help="print a tool's binary path (building it if missing)")
    p.add_argument("name", choices=sorted(TOOLS))
    args = ap.parse_args(argv)
    if args.cmd == "build":
        unknown = set(args.names) - set(TOOLS)
        if unknown:
            ap.error(f"unknown tools: {', '.join(sorted(unknown))} (have {', '.join(TOOLS)})")
        for name in args.names or TOOLS:
            build(TOOLS[name])
    else:
        print(build(TOOLS[args.name]))
    return 0
