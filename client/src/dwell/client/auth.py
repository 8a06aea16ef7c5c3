"""A client's token given as Pulsar's AuthenticationToken authParams (pulsar-admin's
`--auth-params`, client.conf's `authParams`): `token:<jwt>`, or `file:<path>` of a file
holding it. dwell-admin, `python -m dwell.smoke` and the demo read it from
DWELL_AUTH_PARAMS. `KafkaTokens` turns that token into the short-lived Kafka tokens a
client sends on Kafka."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from urllib.parse import unquote

import httpx
import jwt

from dwell.security import http_verify

log = logging.getLogger("dwell.client.auth")

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


KAFKA_TOKENS_PATH: str = "/admin/v2/kafka-tokens"
# Between two failed fetches of a Kafka token: the message loop calls `header` often.
RETRY_S: float = 2.0


class KafkaTokens:
    """The Kafka token (dwell.auth.tokens) a client puts in `dwell-authorization` on
    Kafka, fetched from the policy service with its long-lived token, and fetched again at
    half its life. A failed fetch is logged and retried later, never raised: until one
    succeeds `header` gives the last token while it is valid, else None (and the caller
    keeps its records, as when Kafka is away)."""

    def __init__(self, policy_url: str, token: str, *, timeout_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._url = policy_url.rstrip("/") + KAFKA_TOKENS_PATH
        self._auth = {"Authorization": f"Bearer {token}"}
        self._timeout_s = timeout_s
        self._clock = clock
        self._token: str | None = None
        self._refresh_at = 0.0  # on the clock
        self._expires_at = 0.0
        self._next_try = 0.0
        # With authentication off the policy service has no Kafka tokens to give (404):
        # nothing on Kafka asks for one then.
        self.disabled = False

    def header(self) -> str | None:
        """`Bearer <Kafka token>`, or None when there is no valid one (or none is needed:
        see ``disabled``)."""
        now = self._clock()
        if not self.disabled and now >= self._refresh_at and now >= self._next_try:
            self._fetch(now)
        if self._token is None or self._clock() >= self._expires_at:
            return None
        return f"Bearer {self._token}"

    def _fetch(self, now: float) -> None:
        try:
            resp = httpx.post(self._url, headers=self._auth, timeout=self._timeout_s,
                              verify=http_verify())
        except httpx.HTTPError as exc:
            self._failed(now, f"policy service unreachable at {self._url}: {exc}")
            return
        if resp.status_code == 404:
            log.info("no Kafka tokens from %s (authentication is off there): Kafka "
                     "records go without one", self._url)
            self.disabled = True
            return
        try:
            body = resp.json()
            token = body["token"]
            claims = jwt.decode(token, options={"verify_signature": False})
            life_s = float(claims["exp"]) - float(claims["iat"])
        except (ValueError, KeyError, TypeError, jwt.InvalidTokenError):
            self._failed(now, f"HTTP {resp.status_code}: {resp.text[:200]}")
            return
        if resp.status_code != 200 or not isinstance(token, str) or life_s <= 0:
            self._failed(now, f"HTTP {resp.status_code}: {resp.text[:200]}")
            return
        # On this process's clock: a client whose wall clock is off still refreshes in time.
        self._token = token
        self._expires_at = now + life_s
        self._refresh_at = now + life_s / 2

    def _failed(self, now: float, reason: str) -> None:
        self._next_try = now + RETRY_S
        log.warning("Kafka token not fetched (%s); retrying in %.0fs", reason, RETRY_S)
