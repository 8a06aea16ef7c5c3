"""`python -m dwell.policy`: the policy service on DWELL_HTTP_PORT (8081)."""

from __future__ import annotations

from dwell.http import serve
from dwell.policy.app import build_app
from dwell.policy.settings import PolicySettings


def main() -> None:
    settings = PolicySettings()
    serve(build_app(settings), settings)


if __name__ == "__main__":
    main()
