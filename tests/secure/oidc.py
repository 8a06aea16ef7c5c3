"""A local OIDC token endpoint for the OAUTHBEARER tests: the OAuth 2.0 client-credentials
grant (RFC 6749 §4.4) as Kafka's clients use it, issuing RS256 JWTs signed with the secured
stack's `oidc.key`, whose public half the broker reads from `jwks.json`.

The client authenticates with HTTP Basic (librdkafka, Kafka's Java login handler) or with
`client_id`/`client_secret` form fields. `forge = True` signs with a key the broker does
not know and `audience` names whom tokens are for, to check that the broker refuses tokens
it should."""

from __future__ import annotations

import base64
import json
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa

from dwell_dev import secure_stack

TOKEN_LIFETIME_S = 300


class TokenEndpoint:
    def __init__(self, pki: Path, client_id: str, client_secret: str) -> None:
        self.client_id = client_id
        self.client_secret = client_secret
        self.key = (pki / "oidc.key").read_bytes()
        self.forge = False
        self.audience = secure_stack.OIDC_AUDIENCE
        self.issued: list[dict[str, object]] = []  # claims of every token handed out
        self.refused = 0
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status, answer = endpoint.answer(self.headers.get("Authorization"), body)
                raw = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *_args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/token"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def answer(self, authorization: str | None, body: bytes) -> tuple[int, dict[str, object]]:
        form = {k: v[-1] for k, v in urllib.parse.parse_qs(body.decode()).items()}
        cid, secret = form.get("client_id"), form.get("client_secret")
        if authorization and authorization.startswith("Basic "):
            pair = base64.b64decode(authorization[6:]).decode()
            cid, _, secret = (urllib.parse.unquote_plus(x) for x in pair.partition(":"))
        if form.get("grant_type") != "client_credentials":
            self.refused += 1
            return 400, {"error": "unsupported_grant_type"}
        if (cid, secret) != (self.client_id, self.client_secret):
            self.refused += 1
            return 401, {"error": "invalid_client"}
        now = int(time.time())
        claims: dict[str, object] = {
            "iss": secure_stack.OIDC_ISSUER, "aud": self.audience, "sub": cid,
            "iat": now, "exp": now + TOKEN_LIFETIME_S}
        if form.get("scope"):
            claims["scope"] = form["scope"]
        key: object = self.key
        if self.forge:
            key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        token = jwt.encode(claims, key, algorithm="RS256",  # type: ignore[arg-type]
                           headers={"kid": secure_stack.OIDC_KEY_ID})
        self.issued.append(claims)
        return 200, {"access_token": token, "token_type": "Bearer",
                     "expires_in": TOKEN_LIFETIME_S}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
