"""`dwell-admin`'s HTTP client for the policy service: one call per request, and every
failure (refused connection, 4xx/5xx) turned into one readable AdminError."""

from __future__ import annotations

import ssl
from typing import Any
from urllib.parse import quote

import httpx


class AdminError(Exception):
    """A failed call, already worded for the user (`404 Namespace does not exist`)."""


def path(*segments: str) -> str:
    """`/admin/v2/<segments...>` with each segment percent-encoded (names may hold ':' etc.)."""
    return "/admin/v2/" + "/".join(quote(s, safe="") for s in segments)


class PolicyClient:
    def __init__(self, url: str, timeout: float = 30.0, token: str | None = None,
                 verify: ssl.SSLContext | bool = True) -> None:
        self.url = url.rstrip("/")
        self._timeout = timeout
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._verify = verify

    def call(self, method: str, url_path: str, *, body: Any = None,
             params: dict[str, str] | None = None) -> Any:
        """The decoded JSON answer, or None for an empty one (204)."""
        try:
            with httpx.Client(base_url=self.url, timeout=self._timeout,
                              headers=self._headers, verify=self._verify) as http:
                resp = http.request(method, url_path, json=body, params=params)
        except httpx.HTTPError as exc:
            raise AdminError(f"cannot reach the policy service at {self.url}: "
                             f"{exc or type(exc).__name__}") from exc
        if resp.status_code >= 400:
            raise AdminError(f"{resp.status_code} {_reason(resp)}")
        if resp.status_code == 204 or not resp.content:
            return None
        try:
            return resp.json()
        except ValueError as exc:
            raise AdminError(f"unexpected answer from {self.url}: {resp.text[:200]!r}") from exc


def _reason(resp: httpx.Response) -> str:
    try:
        reason = resp.json().get("reason")
    except (ValueError, AttributeError):
        reason = None
    text = str(reason) if reason else (resp.text.strip() or resp.reason_phrase)
    return " ".join(text.split())  # one line, whatever the server sent
