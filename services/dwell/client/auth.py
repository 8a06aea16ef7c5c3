"""A client's token given as Pulsar's AuthenticationToken authParams (pulsar-admin's
`--auth-params`, client.conf's `authParams`): `token:<jwt>`, or `file:<path>` of a file
holding it. dwell-admin, `python -m dwell.smoke` and the demo read it from
DWELL_AUTH_PARAMS."""

from __future__ import annotations

import os
from urllib.parse import unquote

ENV: str = "DWELL_AUTH_PARAMS"


def token_from_auth_params(params: str) -> str:
    """The token in ``params``; ValueError, worded for the user, when there is none."""
    if params.startswith("token:"):
        return params[len("token:"):].strip()
    if params.startswith("file:"):
        where = params[len("file:"):]
        where = where[2:] if where.startswith("//") else where
        try:
            with open(unquote(where), encoding="utf-8") as f:
                return f.read().strip()
        except OSError as exc:
            raise ValueError(f"cannot read {where}: {exc.strerror}") from None
    raise ValueError("expected token:<jwt> or file:<path>")


def token_from_env() -> str | None:
    """The token DWELL_AUTH_PARAMS gives (None when it is unset or empty)."""
    params = os.environ.get(ENV)
    return token_from_auth_params(params) if params else None
