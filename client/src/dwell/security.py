"""Encryption and credentials of every connection dwell makes or serves: TLS on the HTTP
ports (Pulsar's broker.conf `tls*` names), Kafka's SASL and TLS settings, Redis ACL users
and TLS. Each settings group is read from `DWELL_*` variables and mapped here, once, into
the options of each client library (librdkafka, Spark's Kafka connector, kafka-python,
redis-py, httpx, uvicorn); nothing else spells those options.

A secret setting takes a value or `file:<path>` (a mounted Kubernetes Secret), as
Pulsar's `tokenSecretKey` does, and is a `SecretStr`: no repr, log or error prints it."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

_CONFIG = SettingsConfigDict(env_prefix="DWELL_", extra="ignore")


def reveal(secret: SecretStr | None) -> str:
    """A secret setting's value: its text, or the contents of the file `file:<path>`
    names (one trailing newline dropped, as `kubectl create secret --from-file` keeps it)."""
    if secret is None:
        return ""
    value = secret.get_secret_value()
    if value.startswith("file:"):
        path = Path(value[len("file:"):])
        try:
            text = path.read_text()
        except OSError as exc:
            # The path is not secret; the file's contents are.
            raise ValueError(f"cannot read the secret file {path}: {exc.strerror}") from None
        return text[:-1] if text.endswith("\n") else text
    return value


# ---------------------------------------------------------------- HTTP (TLS)


class TlsSettings(BaseSettings):
    """TLS of the HTTP ports (the three services and the Spark app's metrics port), and
    the CA that dwell's HTTP clients trust (Pulsar's client.conf `tlsTrustCertsFilePath`)."""

    model_config = _CONFIG

    tls_enabled: bool = Field(False, description=(
        "Pulsar's `tlsEnabled`: HTTPS on the process's port (and the Spark app's metrics "
        "port)."))
    tls_certificate_file_path: str = Field("", description=(
        "Pulsar's `tlsCertificateFilePath`: the PEM certificate chain."))
    tls_key_file_path: str = Field("", description=(
        "Pulsar's `tlsKeyFilePath`: the PEM private key."))
    tls_trust_certs_file_path: str = Field("", description=(
        "Pulsar's `tlsTrustCertsFilePath`: the CA dwell's HTTP clients trust for `https://` "
        "URLs (empty: the system's); `dwell-admin --tls-trust-certs-file-path`."))

    @model_validator(mode="after")
    def _cert_and_key(self) -> TlsSettings:
        if self.tls_enabled and not (self.tls_certificate_file_path and self.tls_key_file_path):
            raise ValueError("DWELL_TLS_ENABLED needs DWELL_TLS_CERTIFICATE_FILE_PATH and "
                             "DWELL_TLS_KEY_FILE_PATH")
        return self


def uvicorn_ssl(tls: TlsSettings) -> dict[str, Any]:
    """uvicorn.run's `ssl_*` options for a service's port (empty with TLS off)."""
    if not tls.tls_enabled:
        return {}
    return {"ssl_certfile": tls.tls_certificate_file_path,
            "ssl_keyfile": tls.tls_key_file_path}


def server_context(tls: TlsSettings) -> ssl.SSLContext | None:
    """An SSL context for a plain `http.server` port (the Spark app's), or None with TLS off."""
    if not tls.tls_enabled:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(tls.tls_certificate_file_path, tls.tls_key_file_path)
    return ctx


def http_verify(tls: TlsSettings | None = None) -> ssl.SSLContext | bool:
    """httpx's `verify=` for calls to dwell's services: the configured CA, else the
    system's trust store (an `https://` URL is always verified)."""
    tls = tls or TlsSettings()
    if tls.tls_trust_certs_file_path:
        return ssl.create_default_context(cafile=tls.tls_trust_certs_file_path)
    return True


# ---------------------------------------------------------------- Kafka

KafkaProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"]

_JAAS_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "OAUTHBEARER": "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule",
}


class KafkaSecurity(BaseSettings):
    """How every Kafka client of dwell authenticates and encrypts (Kafka's
    `security.protocol`, `sasl.mechanism`; OAUTHBEARER by OIDC client credentials)."""

    model_config = _CONFIG

    kafka_security_protocol: KafkaProtocol = Field("PLAINTEXT", description=(
        "Kafka's `security.protocol`: `PLAINTEXT`, `SSL`, `SASL_PLAINTEXT` or `SASL_SSL`."))
    kafka_sasl_mechanism: SaslMechanism = Field("PLAIN", description=(
        "Kafka's `sasl.mechanism`: `PLAIN`, `SCRAM-SHA-256`, `SCRAM-SHA-512` or "
        "`OAUTHBEARER`."))
    kafka_sasl_username: str = Field("", description="SASL user for PLAIN and SCRAM.")
    kafka_sasl_password: SecretStr | None = Field(None, description=(
        "SASL password for PLAIN and SCRAM (a value or `file:<path>`)."))
    kafka_sasl_oauthbearer_token_endpoint_url: str = Field("", description=(
        "OAUTHBEARER by OIDC client credentials (not with kafka-python): the token "
        "endpoint. The Spark app allows it in its JVMs "
        "(`-Dorg.apache.kafka.sasl.oauthbearer.allowed.urls`, needed from Kafka 4.0)."))
    kafka_sasl_oauthbearer_client_id: str = Field("", description="OAUTHBEARER: the client id.")
    kafka_sasl_oauthbearer_client_secret: SecretStr | None = Field(None, description=(
        "OAUTHBEARER: the client secret (a value or `file:<path>`)."))
    kafka_sasl_oauthbearer_scope: str = Field("", description=(
        "OAUTHBEARER: the scope asked for (empty: none)."))
    kafka_ssl_ca_location: str = Field("", description=(
        "PEM bundle of the CAs that sign the brokers' certificates (empty: the system's); "
        "the Spark app passes it as a PEM truststore."))
    kafka_ssl_endpoint_identification: bool = Field(True, description=(
        "Check the broker's host name; `false` for brokers whose certificates lack it."))

    @property
    def sasl(self) -> bool:
        return self.kafka_security_protocol.startswith("SASL_")

    @property
    def ssl(self) -> bool:
        return self.kafka_security_protocol.endswith("SSL")

    @property
    def oauth(self) -> bool:
        return self.sasl and self.kafka_sasl_mechanism == "OAUTHBEARER"

    @model_validator(mode="after")
    def _complete(self) -> KafkaSecurity:
        if self.oauth:
            if not (self.kafka_sasl_oauthbearer_token_endpoint_url
                    and self.kafka_sasl_oauthbearer_client_id):
                raise ValueError("DWELL_KAFKA_SASL_MECHANISM=OAUTHBEARER needs "
                                 "DWELL_KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL and "
                                 "DWELL_KAFKA_SASL_OAUTHBEARER_CLIENT_ID")
        elif self.sasl and not (self.kafka_sasl_username and self.kafka_sasl_password):
            raise ValueError(f"DWELL_KAFKA_SECURITY_PROTOCOL={self.kafka_security_protocol} "
                             "needs DWELL_KAFKA_SASL_USERNAME and DWELL_KAFKA_SASL_PASSWORD")
        return self


def librdkafka_config(sec: KafkaSecurity | None = None) -> dict[str, Any]:
    """confluent-kafka's (librdkafka's) security properties."""
    sec = sec or KafkaSecurity()
    conf: dict[str, Any] = {"security.protocol": sec.kafka_security_protocol.lower()}
    if sec.ssl:
        if sec.kafka_ssl_ca_location:
            conf["ssl.ca.location"] = sec.kafka_ssl_ca_location
        conf["ssl.endpoint.identification.algorithm"] = (
            "https" if sec.kafka_ssl_endpoint_identification else "none")
    if sec.oauth:
        conf |= {"sasl.mechanism": "OAUTHBEARER", "sasl.oauthbearer.method": "oidc",
                 "sasl.oauthbearer.token.endpoint.url":
                     sec.kafka_sasl_oauthbearer_token_endpoint_url,
                 "sasl.oauthbearer.client.id": sec.kafka_sasl_oauthbearer_client_id,
                 "sasl.oauthbearer.client.secret":
                     reveal(sec.kafka_sasl_oauthbearer_client_secret)}
        if sec.kafka_sasl_oauthbearer_scope:
            conf["sasl.oauthbearer.scope"] = sec.kafka_sasl_oauthbearer_scope
    elif sec.sasl:
        conf |= {"sasl.mechanism": sec.kafka_sasl_mechanism,
                 "sasl.username": sec.kafka_sasl_username,
                 "sasl.password": reveal(sec.kafka_sasl_password)}
    return conf


def _jaas_quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def java_kafka_config(sec: KafkaSecurity | None = None) -> dict[str, str]:
    """The Java client's security properties (unprefixed; Spark's Kafka source and sink
    take them with a `kafka.` prefix). The CA goes in as a PEM truststore."""
    sec = sec or KafkaSecurity()
    conf: dict[str, str] = {"security.protocol": sec.kafka_security_protocol}
    if sec.ssl:
        if sec.kafka_ssl_ca_location:
            conf |= {"ssl.truststore.type": "PEM",
                     "ssl.truststore.location": sec.kafka_ssl_ca_location}
        conf["ssl.endpoint.identification.algorithm"] = (
            "https" if sec.kafka_ssl_endpoint_identification else "")
    if not sec.sasl:
        return conf
    module = _JAAS_MODULES[sec.kafka_sasl_mechanism]
    conf["sasl.mechanism"] = sec.kafka_sasl_mechanism
    if sec.oauth:
        opts = {"clientId": sec.kafka_sasl_oauthbearer_client_id,
                "clientSecret": reveal(sec.kafka_sasl_oauthbearer_client_secret)}
        if sec.kafka_sasl_oauthbearer_scope:
            opts["scope"] = sec.kafka_sasl_oauthbearer_scope
        conf |= {"sasl.oauthbearer.token.endpoint.url":
                     sec.kafka_sasl_oauthbearer_token_endpoint_url,
                 "sasl.login.callback.handler.class":
                     "org.apache.kafka.common.security.oauthbearer."
                     "OAuthBearerLoginCallbackHandler"}
    else:
        opts = {"username": sec.kafka_sasl_username,
                "password": reveal(sec.kafka_sasl_password)}
    args = " ".join(f"{k}={_jaas_quote(v)}" for k, v in opts.items())
    conf["sasl.jaas.config"] = f"{module} required {args};"
    return conf


# Kafka's Java clients (4.0 on) fetch OAUTHBEARER tokens only from the URLs this JVM
# system property allows.
OAUTH_ALLOWED_URLS_PROPERTY = "org.apache.kafka.sasl.oauthbearer.allowed.urls"


def java_oauth_system_properties(sec: KafkaSecurity | None = None) -> list[str]:
    """The `-D` options a JVM running Kafka's Java client needs for `sec`: with
    OAUTHBEARER, the token endpoint allowed; else none."""
    sec = sec or KafkaSecurity()
    if not sec.oauth:
        return []
    return [f"-D{OAUTH_ALLOWED_URLS_PROPERTY}={sec.kafka_sasl_oauthbearer_token_endpoint_url}"]


def spark_kafka_options(sec: KafkaSecurity | None = None) -> dict[str, str]:
    """Options of Spark's Kafka source and sink (`kafka.`-prefixed Java client properties)."""
    return {f"kafka.{k}": v for k, v in java_kafka_config(sec).items()}


def kafka_python_config(sec: KafkaSecurity | None = None) -> dict[str, Any]:
    """kafka-python's keyword arguments (PLAIN and SCRAM; kafka-python has no OIDC login,
    so OAUTHBEARER is refused here with the reason)."""
    sec = sec or KafkaSecurity()
    conf: dict[str, Any] = {"security_protocol": sec.kafka_security_protocol}
    if sec.ssl:
        conf["ssl_check_hostname"] = sec.kafka_ssl_endpoint_identification
        if sec.kafka_ssl_ca_location:
            conf["ssl_cafile"] = sec.kafka_ssl_ca_location
    if sec.oauth:
        raise ValueError("kafka-python has no OIDC client-credentials login; use "
                         "confluent-kafka (dwell's clients) for OAUTHBEARER")
    if sec.sasl:
        conf |= {"sasl_mechanism": sec.kafka_sasl_mechanism,
                 "sasl_plain_username": sec.kafka_sasl_username,
                 "sasl_plain_password": reveal(sec.kafka_sasl_password)}
    return conf


# ---------------------------------------------------------------- Redis


class RedisSecurity(BaseSettings):
    """Redis ACL user and TLS beside DWELL_REDIS_URL (`rediss://` turns TLS on). A user
    or password in the URL wins over these."""

    model_config = _CONFIG

    redis_username: str = Field("", description=(
        "Redis ACL user, used when `DWELL_REDIS_URL` has none."))
    redis_password: SecretStr | None = Field(None, description=(
        "Redis password, used when `DWELL_REDIS_URL` has none (a value or `file:<path>`)."))
    redis_tls_ca_cert_file: str = Field("", description=(
        "PEM bundle of the CAs that sign Redis's certificate (empty: the system's)."))


def redis_options(url: str, sec: RedisSecurity | None = None) -> dict[str, Any]:
    """redis-py's connection keyword arguments for `url`."""
    sec = sec or RedisSecurity()
    out: dict[str, Any] = {}
    if sec.redis_username:
        out["username"] = sec.redis_username
    if sec.redis_password is not None:
        out["password"] = reveal(sec.redis_password)
    if url.startswith("rediss://"):
        out["ssl_cert_reqs"] = "required"
        if sec.redis_tls_ca_cert_file:
            out["ssl_ca_certs"] = sec.redis_tls_ca_cert_file
    return out
