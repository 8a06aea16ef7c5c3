"""`python -m dwell.smoke`: one delayed message through a running dwell, end to end. It is
the chart's `helm test` hook, and works against any stack (`make up`) the same way.

It creates the tenant and namespace it publishes to through the policy API, subscribes
with the SDK Consumer, publishes one message with the SDK Producer to be delivered
``--delay-ms`` later, and waits for that message on the topic's ready topic. Exit 0 when it
arrives, and not earlier than Pulsar allows (its due time less the namespace's tickTime:
the tracker's buckets are that wide); 1 otherwise, saying what went wrong.

With authentication on, it needs a super-user's token (it creates a tenant), given as
pulsar-admin's authParams in DWELL_AUTH_PARAMS or ``--auth-params``: `token:<jwt>` or
`file:<path>`; the chart mounts the Secret named by auth.testToken.existingSecret there.
Or it signs a token itself, valid for ten minutes, for ``--role`` (DWELL_SMOKE_ROLE,
default ``admin``) with the HS256 key ``--signing-key`` (DWELL_SMOKE_SIGNING_KEY: `file:`,
`data:` or base64, as the services' key settings): the chart gives it the key it made
with auth.generateKeys.
TLS: DWELL_TLS_TRUST_CERTS_FILE_PATH names the CA the services' certificates are checked
against, as for the SDK.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid

import httpx

from dwell import endpoints
from dwell.auth.keys import InvalidKey, check_secret_key, read_key
from dwell.auth.tokens import create_token
from dwell.client import Consumer, Producer, PublishError
from dwell.client.auth import ENV as AUTH_PARAMS_ENV
from dwell.client.auth import token_from_auth_params
from dwell.security import http_verify

TENANT, NAMESPACE = "dwellsmoke", "helm-test"
SIGNING_KEY_ENV, ROLE_ENV = "DWELL_SMOKE_SIGNING_KEY", "DWELL_SMOKE_ROLE"
SIGNED_TOKEN_TTL_S = 600


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def ensure_namespace(policy_url: str, token: str | None) -> int:
    """The smoke test's tenant and namespace (already there is fine); its tickTime."""
    headers = {"Authorization": f"Bearer {token}"} if token else None
    with httpx.Client(base_url=policy_url, timeout=10, verify=http_verify(),
                      headers=headers) as http:
        for path in (f"/admin/v2/tenants/{TENANT}",
                     f"/admin/v2/namespaces/{TENANT}/{NAMESPACE}"):
            r = http.put(path, json={} if "tenants" in path else None)
            if r.status_code in (401, 403):
                hint = ("give a super-user's token in DWELL_AUTH_PARAMS (the chart: "
                        "auth.testToken.existingSecret, or auth.generateKeys)"
                        if token is None else
                        "the token's role must be a super-user (it creates a tenant)")
                raise RuntimeError(f"PUT {path} answered {r.status_code} {r.text}: {hint}")
            if r.status_code not in (204, 409):
                raise RuntimeError(f"PUT {path} answered {r.status_code} {r.text}")
        path = f"/admin/v2/namespaces/{TENANT}/{NAMESPACE}/delayedDelivery"
        r = http.get(path, params={"applied": "true"})
        if r.status_code != 200:
            raise RuntimeError(f"GET {path} answered {r.status_code} {r.text}")
        return int(r.json()["tickTime"])


def publish(producer: Producer, delay_ms: int, deadline: float) -> str:
    """Send the message, retrying while the namespace has not reached admission through
    the policy feed yet (a 404 naming it)."""
    while True:
        try:
            return producer.send(b"dwell smoke test", deliver_after=delay_ms,
                                 key="smoke")
        except PublishError as exc:
            if "does not exist" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def run(delay_ms: int, timeout_s: float, token: str | None = None) -> int:
    policy_url = endpoints.policy_url()
    topic = f"persistent://{TENANT}/{NAMESPACE}/smoke-{uuid.uuid4().hex[:8]}"
    deadline = time.monotonic() + timeout_s
    tick_ms = ensure_namespace(policy_url, token)
    with Consumer(topic, "smoke", token=token, policy_url=policy_url) as consumer, \
            Producer(topic, producer_name="dwell-smoke", token=token) as producer:
        sent = _now_ms()
        message_id = publish(producer, delay_ms, deadline)
        due = sent + delay_ms
        print(f"smoke: published {message_id} to {topic}, due in {delay_ms} ms", flush=True)
        while time.monotonic() < deadline:
            msg = consumer.receive(timeout=0.5)
            if msg is None:
                continue
            consumer.acknowledge(msg)
            if msg.message_id != message_id:
                continue
            arrived = _now_ms()
            # The time admission set (it counts the delay from when it got the request).
            due = msg.deliver_at or due
            if arrived < due - tick_ms:
                print(f"smoke: FAILED: {message_id} arrived {due - arrived} ms early (more "
                      f"than the namespace's tickTime, {tick_ms} ms)", file=sys.stderr)
                return 1
            print(f"smoke: ok: {message_id} arrived {arrived - sent} ms after publishing "
                  f"({arrived - due} ms after it was due)", flush=True)
            return 0
    print(f"smoke: FAILED: {message_id} did not arrive within {timeout_s:.0f} s",
          file=sys.stderr)
    return 1


def signed_token(key: str, role: str) -> str:
    """A token for ``role`` signed with the HS256 secret key ``key`` (a key setting's
    value), valid for SIGNED_TOKEN_TTL_S."""
    raw = read_key(key, "--signing-key")
    check_secret_key(raw, "--signing-key")
    return create_token(raw, "HS256", role, time.time() + SIGNED_TOKEN_TTL_S)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dwell.smoke", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--delay-ms", type=int, default=3000,
                    help="how much later the message is to be delivered (default 3000)")
    ap.add_argument("--timeout-s", type=float, default=90.0,
                    help="how long to wait for it in all (default 90)")
    ap.add_argument("--auth-params", default=os.environ.get(AUTH_PARAMS_ENV),
                    help="a super-user's token: token:<jwt> or file:<path> (default: "
                         f"${AUTH_PARAMS_ENV}; none: authentication off)")
    ap.add_argument("--signing-key", default=os.environ.get(SIGNING_KEY_ENV),
                    help="with no --auth-params: an HS256 secret key to sign a token for "
                         f"--role with (file:, data: or base64; default: ${SIGNING_KEY_ENV})")
    ap.add_argument("--role", default=os.environ.get(ROLE_ENV) or "admin",
                    help=f"the signed token's role, a super-user (default: ${ROLE_ENV}, "
                         "else admin)")
    args = ap.parse_args(argv)
    try:
        token = token_from_auth_params(args.auth_params) if args.auth_params else None
    except ValueError as exc:
        print(f"smoke: FAILED: --auth-params: {exc}", file=sys.stderr)
        return 1
    if token is None and args.signing_key:
        try:
            token = signed_token(args.signing_key, args.role)
        except InvalidKey as exc:
            print(f"smoke: FAILED: {exc}", file=sys.stderr)
            return 1
    try:
        return run(args.delay_ms, args.timeout_s, token)
    except (httpx.HTTPError, PublishError, RuntimeError) as exc:
        print(f"smoke: FAILED: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
