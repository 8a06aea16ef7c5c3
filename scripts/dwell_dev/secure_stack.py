"""The secured local stack (`devstack.py up --secure`): a CA and certificates made at
start with openssl, Kafka with SASL_SSL listeners only (the controller's too) and KRaft's
StandardAuthorizer: the broker's own PLAIN login is its only super-user, each dwell
component has its own SCRAM-SHA-512 principal and example users have theirs
(dwell_dev.kafka_acls holds their ACLs and creates them); OAUTHBEARER tokens signed by
the stack's OIDC key are accepted too, checked against `jwks.json`. Redis on a TLS port
with an ACL user and the default user off, HTTPS on the services' and the Spark app's
ports, token authentication and authorization on the services (an HS256 key made at
start, super-user role `admin`), and the DWELL_* settings that point every dwell process
and client at them.

Everything lives under `.dwell/<profile>/secure/` (mode 0700), never in the repository.
Passwords are random per state directory and stored in files that the settings read as
`file:<path>`; no password goes on a command line or into the environment.

Standard library only, like devstack.py.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import shutil
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

KAFKA_MECHANISM = "SCRAM-SHA-512"
# One Kafka principal per dwell process (dwell_dev.kafka_acls COMPONENTS).
KAFKA_COMPONENTS = {"policy": "dwell-policy", "admission": "dwell-admission",
                    "tracker": "dwell-tracker", "spark": "dwell-spark"}
# Example users' principals and their tenants, made with the stack: what `devstack env`
# hands a client is the first one's (the demo's tenant).
KAFKA_USERS = {"app-demo": "demo", "app-dwell-smoke": "dwellsmoke"}
REDIS_USER = "dwell"
SUPER_USER = "admin"
# Kafka's own login (PLAIN, in server.properties) between broker and controller and the
# only super-user; devstack creates users, ACLs and dwell's topics with it.
BROKER_USER = "broker"
_CERT_DAYS = 30
# OAUTHBEARER: what the broker expects of a token (tests/secure/oidc.py issues them).
OIDC_ISSUER = "dwell-local-oidc"
OIDC_AUDIENCE = "dwell-kafka"
OIDC_KEY_ID = "dwell-local"


def folder(state: Path) -> Path:
    return state / "secure"


def enabled(state: Path) -> bool:
    """Whether the profile's stack was last started with --secure."""
    return (folder(state) / "enabled").exists()


def mark(state: Path, on: bool) -> None:
    flag = folder(state) / "enabled"
    if on:
        flag.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        flag.touch()
    else:
        flag.unlink(missing_ok=True)


def prepare(stack: Any, secure: bool) -> None:
    """Before `up`/`run` of a devstack.Stack: a profile with processes running keeps its
    mode (`up spark` joins a secured stack), else `secure` decides and is recorded, so
    that `env`, `status` and the test suites see the same stack."""
    if any(stack.pid(n) for n in stack.available()):
        if secure and not stack.secure:
            sys.exit(f"dwell: the {stack.profile} stack runs without --secure; stop it first")
        return
    stack.secure = secure
    if secure:
        ensure_pki(stack.state)
    mark(stack.state, secure)


def openssl_bin() -> str:
    found = shutil.which("openssl")
    if not found:
        sys.exit("dwell: openssl is needed for --secure (Debian's openssl package)")
    return found


def _secret(path: Path) -> str:
    if not path.exists():
        path.write_text(secrets.token_urlsafe(24))
        path.chmod(0o600)
    return path.read_text()


def kafka_principals() -> list[str]:
    """Every SCRAM user of the stack: the components' and the example users'."""
    return [*KAFKA_COMPONENTS.values(), *KAFKA_USERS]


def kafka_password_file(d: Path, user: str) -> Path:
    return d / f"kafka-{user}-password"


def kafka_password(d: Path, user: str) -> str:
    """A SCRAM user's password, made on first use."""
    return _secret(kafka_password_file(d, user))


def ensure_pki(state: Path) -> Path:
    """The CA, the server certificate (127.0.0.1 and localhost) and the passwords of the
    profile, made once per state directory; returns the folder."""
    d = folder(state)
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    d.chmod(0o700)
    for name in ("kafka-broker-password", "redis-password",
                 *(kafka_password_file(d, u).name for u in kafka_principals())):
        _secret(d / name)
    key = d / "token-secret.key"
    if not key.exists():
        key.write_bytes(secrets.token_bytes(32))  # raw HS256 key, as Pulsar's file: form
        key.chmod(0o600)
    ossl = openssl_bin()

    def run(*args: str) -> str:
        return subprocess.run([ossl, *args], check=True, cwd=d, capture_output=True,
                              text=True).stdout

    if not (d / "jwks.json").exists():
        _oidc_key(d, run)
    if (d / "server.pem").exists() and (d / "ca.pem").exists():
        return d

    run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", "ca.key", "-out", "ca.pem", "-days", str(_CERT_DAYS),
        "-subj", "/CN=dwell local CA", "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    # PKCS#8 (openssl's default), which Kafka's PEM keystore reads unencrypted.
    run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1")
    (d / "server.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
        "extendedKeyUsage=serverAuth,clientAuth\nbasicConstraints=CA:FALSE\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "server.pem", "-days", str(_CERT_DAYS),
        "-extfile", "server.ext")
    (d / "kafka-keystore.pem").write_text((d / "server.key").read_text()
                                          + (d / "server.pem").read_text())
    for f in d.iterdir():
        f.chmod(0o600)
    return d


def _oidc_key(d: Path, run: Any) -> None:
    """The local OIDC issuer's RSA key (`oidc.key`) and the JWKS the broker checks
    OAUTHBEARER tokens against (`jwks.json`, its public half)."""
    run("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out",
        "oidc.key")
    modulus = run("rsa", "-in", "oidc.key", "-noout", "-modulus").strip().split("=", 1)[1]

    def b64(raw: bytes) -> str:
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    jwk = {"kty": "RSA", "use": "sig", "alg": "RS256", "kid": OIDC_KEY_ID,
           "n": b64(bytes.fromhex(modulus)), "e": b64((65537).to_bytes(3, "big"))}
    (d / "jwks.json").write_text(json.dumps({"keys": [jwk]}))
    for name in ("oidc.key", "jwks.json"):
        (d / name).chmod(0o600)


def kafka_jvm_args(d: Path) -> list[str]:
    """The broker JVM's system properties: Kafka 4 reads an OAUTHBEARER JWKS only from
    the URLs (and files) allowed here."""
    jwks = d / "jwks.json"
    return [f"-Dorg.apache.kafka.sasl.oauthbearer.allowed.urls={jwks.as_uri()}",
            f"-Dorg.apache.kafka.sasl.oauthbearer.allowed.files={jwks}"]


def kafka_properties(d: Path, port: int, controller_port: int) -> str:
    """Lines appended to server.properties (Java's Properties: the last value wins), which
    turn both listeners into SASL_SSL and switch the authorizer on."""
    pw = (d / "kafka-broker-password").read_text()
    plain = ("org.apache.kafka.common.security.plain.PlainLoginModule required "
             f'username="{BROKER_USER}" password="{pw}" user_{BROKER_USER}="{pw}";')
    scram = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
    oauth = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;"
    return "\n".join([
        "", "# --secure (dwell_dev.secure_stack)",
        f"listeners=SASL_SSL://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        f"advertised.listeners=SASL_SSL://127.0.0.1:{port}",
        # The controller's listener authenticates too: an anonymous principal there would
        # have to be a super-user for the broker to reach its own controller.
        "listener.security.protocol.map=SASL_SSL:SASL_SSL,CONTROLLER:SASL_SSL",
        "inter.broker.listener.name=SASL_SSL",
        "sasl.enabled.mechanisms=SCRAM-SHA-256,SCRAM-SHA-512,PLAIN,OAUTHBEARER",
        "sasl.mechanism.inter.broker.protocol=PLAIN",
        "sasl.mechanism.controller.protocol=PLAIN",
        "listener.name.controller.sasl.enabled.mechanisms=PLAIN",
        f"listener.name.controller.plain.sasl.jaas.config={plain}",
        "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        f"super.users=User:{BROKER_USER}",
        "allow.everyone.if.no.acl.found=false",
        f"listener.name.sasl_ssl.plain.sasl.jaas.config={plain}",
        f"listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config={scram}",
        f"listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config={scram}",
        f"listener.name.sasl_ssl.oauthbearer.sasl.jaas.config={oauth}",
        "listener.name.sasl_ssl.oauthbearer.sasl.server.callback.handler.class="
        "org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler",
        # Kafka 4.1's default validator (DefaultJwtValidator, made without a key
        # resolver) checks neither a token's signature nor its audience or issuer:
        # tests/secure/test_oauthbearer.py showed a forged token accepted. The broker's
        # own validator reads the JWKS. (Unprefixed: a listener-prefixed validator
        # class was not applied.)
        "sasl.oauthbearer.jwt.validator.class="
        "org.apache.kafka.common.security.oauthbearer.BrokerJwtValidator",
        f"sasl.oauthbearer.jwks.endpoint.url={(d / 'jwks.json').as_uri()}",
        f"sasl.oauthbearer.expected.audience={OIDC_AUDIENCE}",
        f"sasl.oauthbearer.expected.issuer={OIDC_ISSUER}",
        "ssl.keystore.type=PEM",
        f"ssl.keystore.location={d / 'kafka-keystore.pem'}",
        "ssl.truststore.type=PEM",
        f"ssl.truststore.location={d / 'ca.pem'}",
        "ssl.client.auth=none", ""])


def acl_spec(d: Path, bootstrap: str) -> dict[str, Any]:
    """What dwell_dev.kafka_acls applies: the broker's login to connect with, the SCRAM
    users and their passwords, the example users' tenants."""
    return {"admin": broker_librdkafka_config(d, bootstrap),
            "passwords": {u: kafka_password_file(d, u).read_text()
                          for u in kafka_principals()},
            "users": dict(KAFKA_USERS)}


def broker_librdkafka_config(d: Path, bootstrap: str) -> dict[str, str]:
    """A librdkafka client logged in as the broker's super-user."""
    return {"bootstrap.servers": bootstrap, "security.protocol": "SASL_SSL",
            "sasl.mechanism": "PLAIN", "sasl.username": BROKER_USER,
            "sasl.password": (d / "kafka-broker-password").read_text(),
            "ssl.ca.location": str(d / "ca.pem")}


def broker_env(d: Path) -> dict[str, str]:
    """dwell's Kafka settings logged in as the broker's super-user: devstack's readiness
    check and its creation of dwell's topics, before any other user exists."""
    return {"DWELL_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "DWELL_KAFKA_SASL_MECHANISM": "PLAIN",
            "DWELL_KAFKA_SASL_USERNAME": BROKER_USER,
            "DWELL_KAFKA_SASL_PASSWORD": f"file:{d / 'kafka-broker-password'}",
            "DWELL_KAFKA_SSL_CA_LOCATION": str(d / "ca.pem")}


def kafka_user_env(d: Path, user: str) -> dict[str, str]:
    """The Kafka login of one SCRAM user."""
    return {"DWELL_KAFKA_SASL_USERNAME": user,
            "DWELL_KAFKA_SASL_PASSWORD": f"file:{kafka_password_file(d, user)}"}


def component_env(d: Path, component: str) -> dict[str, str]:
    """What a dwell process adds to client_env: its own Kafka principal."""
    return kafka_user_env(d, KAFKA_COMPONENTS[component])


def redis_args(d: Path, port: int) -> list[str]:
    """redis-server arguments: TLS only (no plain port), an ACL file whose `dwell` user
    has a hashed password and whose default user is off."""
    digest = hashlib.sha256((d / "redis-password").read_bytes()).hexdigest()
    acl = d / "redis-users.acl"
    acl.write_text(f"user default off\nuser {REDIS_USER} on #{digest} ~* &* +@all\n")
    acl.chmod(0o600)
    return ["--port", "0", "--tls-port", str(port),
            "--tls-cert-file", str(d / "server.pem"), "--tls-key-file", str(d / "server.key"),
            "--tls-ca-cert-file", str(d / "ca.pem"), "--tls-auth-clients", "no",
            "--aclfile", str(acl)]


def admin_token(d: Path, dwell_admin: Path) -> Path:
    """A super-user token (`dwell-admin tokens create`), made once when the venv has it;
    clients on the stack send it through DWELL_AUTH_PARAMS=file:<path>."""
    path = d / "admin.token"
    if not path.exists() and dwell_admin.exists() and (d / "token-secret.key").exists():
        token = subprocess.run([str(dwell_admin), "tokens", "create", "--secret-key",
                                f"file:{d / 'token-secret.key'}", "--subject", SUPER_USER],
                               check=True, capture_output=True, text=True).stdout.strip()
        path.write_text(token)
        path.chmod(0o600)
    return path


def client_env(d: Path) -> dict[str, str]:
    """The settings every dwell process (and client) gets on the secured stack; Kafka as
    the first example user (a process adds component_env)."""
    ca = str(d / "ca.pem")
    return {
        "DWELL_AUTH_PARAMS": f"file:{d / 'admin.token'}",
        "DWELL_TLS_TRUST_CERTS_FILE_PATH": ca,
        "DWELL_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "DWELL_KAFKA_SASL_MECHANISM": KAFKA_MECHANISM,
        **kafka_user_env(d, next(iter(KAFKA_USERS))),
        "DWELL_KAFKA_SSL_CA_LOCATION": ca,
        "DWELL_REDIS_USERNAME": REDIS_USER,
        "DWELL_REDIS_PASSWORD": f"file:{d / 'redis-password'}",
        "DWELL_REDIS_TLS_CA_CERT_FILE": ca,
    }


def server_env(d: Path) -> dict[str, str]:
    """What a process serving HTTP (a service, the Spark app) adds: its certificate and
    token authentication."""
    return {"DWELL_TLS_ENABLED": "true",
            "DWELL_TLS_CERTIFICATE_FILE_PATH": str(d / "server.pem"),
            "DWELL_TLS_KEY_FILE_PATH": str(d / "server.key"),
            "DWELL_AUTHENTICATION_ENABLED": "true", "DWELL_AUTHORIZATION_ENABLED": "true",
            "DWELL_SUPER_USER_ROLES": SUPER_USER,
            "DWELL_TOKEN_SECRET_KEY": f"file:{d / 'token-secret.key'}"}


def client_context(d: Path) -> ssl.SSLContext:
    """An SSL context trusting the profile's CA, for devstack's health checks."""
    return ssl.create_default_context(cafile=str(d / "ca.pem"))
