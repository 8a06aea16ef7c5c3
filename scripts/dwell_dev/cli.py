"""The local stack's command line: `python3 scripts/devstack.py` (what `make install|run|up|
down|status|acls|kube-up|kube-down` call) runs `run` here. Standard library only, so it
runs before the venv exists.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

from dwell_dev import devstack, kubenode, kubestack, promserver
from dwell_dev.devinstall import ROOT, VENV_PY, helm_bin, install, promtool_bin, say
from dwell_dev.devstack import PROFILES, SERVICES, Stack
from dwell_dev.devstack import kafka_acls as kafka_acls_run
from dwell_dev.secure_stack import prepare as prepare_secure


def install_chart_tools() -> None:
    """helm, promtool and the Prometheus server of tests/e2e/test_prometheus.py."""
    helm_bin()
    promtool_bin()
    promserver.prometheus_bin()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="devstack", description=devstack.__doc__)
    ap.add_argument("--profile", default=os.environ.get("DWELL_PROFILE", "dev"),
                    choices=sorted(PROFILES))
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("install", help="install what is missing (venv, redis-server, Kafka jars)")
    sub.add_parser("install-chart-tools", help="build helm, install promtool and Prometheus "
                   "(tests/chart, tests/e2e/test_prometheus.py)")
    secure_help = ("SASL_SSL Kafka, TLS Redis with an ACL user, HTTPS services with token "
                   "auth; certificates, passwords and keys made under .dwell/<profile>/secure/")
    up = sub.add_parser("up", help="start the stack in the background")
    up.add_argument("names", nargs="*", help="only these processes")
    up.add_argument("--secure", action="store_true", help=secure_help)
    up.add_argument("--for-pods", action="store_true",
                    help="Redis and Kafka also listen on the kube tier's pod bridge "
                         f"({kubenode.NODE_IP}; Kafka on its kafka_pods port), for a chart "
                         "installed on the real node with them as external servers")
    down = sub.add_parser("down", help="stop what `up` started")
    down.add_argument("names", nargs="*")
    sub.add_parser("status", help="what runs where")
    sub.add_parser("env", help="print the environment dwell processes get, as JSON")
    sub.add_parser("acls", help="the ACLs the secured stack's Kafka holds, as a table")
    fg = sub.add_parser("run", help="start the stack in the foreground; Ctrl-C stops it")
    fg.add_argument("--demo", action="store_true", help="run the demo once the stack is up")
    fg.add_argument("--secure", action="store_true", help=secure_help)
    for cmd, what in (("kube-build", "build and cache etcd, Kubernetes, CoreDNS and kwok (Go)"),
                      ("kube-up", "start the kube tier: a local API server and a node"),
                      ("kube-down", "stop what kube-up started, and put the host back"),
                      ("kube-images", "import `make images`' archives into the node's "
                                      "containerd"),
                      ("kube-status", "what of the kube tier runs where")):
        kp = sub.add_parser(cmd, help=what)
        if cmd in ("kube-up", "kube-build"):
            kp.add_argument("--node", choices=kubestack.NODES, default="real",
                            help="real: containerd, a kubelet, kube-proxy and CoreDNS run the "
                                 "pods (root, Linux); kwok: pods are reported Running and "
                                 "nothing runs (fast dry runs)")
    args = ap.parse_args(argv)
    if args.cmd.startswith("kube-"):
        return kubestack.main(args.profile, args.cmd, getattr(args, "node", "real"))
    stack = Stack(args.profile, pods=getattr(args, "for_pods", False))
    if args.cmd in ("up", "run"):
        prepare_secure(stack, args.secure)

    if args.cmd == "install":
        install()
    elif args.cmd == "install-chart-tools":
        install_chart_tools()
    elif args.cmd == "up":
        t0 = time.monotonic()
        install()
        stack.up(args.names or None)
        say(f"stack up in {time.monotonic() - t0:.1f}s (logs in "
            f"{stack.log_dir.relative_to(ROOT)}, `make down` stops it)")
    elif args.cmd == "down":
        stack.down(args.names or None)
    elif args.cmd == "status":
        for name, pid, port in stack.status():
            state = f"running (pid {pid})" if pid else "stopped"
            say(f"{name:<9} {state:<22} 127.0.0.1:{port}")
    elif args.cmd == "env":
        print(json.dumps(stack.service_env(), indent=2))
    elif args.cmd == "acls":
        if not stack.secure or not stack.pid("kafka"):
            sys.exit(f"dwell: the {stack.profile} stack's Kafka does not run with --secure")
        print(kafka_acls_run(stack, "show"), end="")
    elif args.cmd == "run":
        return _run_foreground(stack, args.demo)
    return 0


def _run_foreground(stack: Stack, demo: bool) -> int:
    started_before = {n for n in stack.available() if stack.pid(n)}
    stopping = False

    def _stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, _stop)
    try:
        install()
        t0 = time.monotonic()
        stack.up()
        say(f"stack up in {time.monotonic() - t0:.1f}s; logs in {stack.log_dir.relative_to(ROOT)}")
        if demo and (ROOT / "services" / "dwell" / "demo.py").exists():
            subprocess.run([str(VENV_PY), "-m", "dwell.demo"], env=dict(os.environ)
                           | stack.service_env(), check=False)
        say("running; press Ctrl-C to stop")
        while not stopping:
            time.sleep(0.5)
            for name in stack.available():
                if name not in started_before and not stack.pid(name):
                    say(f"{name} exited; see {stack.log_dir.relative_to(ROOT)}/{name}.log")
                    stopping = True
    except KeyboardInterrupt:
        pass
    finally:
        print()
        stack.down([n for n in ["spark", *reversed(SERVICES), "kafka", "redis"]
                    if n not in started_before])
    return 0
