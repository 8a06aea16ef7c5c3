"""dwell.security: each settings group mapped into each client library's options, secrets
read from `file:` paths and never printed."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError

from dwell.security import (
    KafkaSecurity,
    RedisSecurity,
    TlsSettings,
    http_verify,
    java_kafka_config,
    java_oauth_system_properties,
    kafka_python_config,
    librdkafka_config,
    redis_options,
    reveal,
    spark_kafka_options,
    uvicorn_ssl,
)


def scram(**kw: object) -> KafkaSecurity:
    return KafkaSecurity(kafka_security_protocol="SASL_SSL",
                         kafka_sasl_mechanism="SCRAM-SHA-512", kafka_sasl_username="u",
                         kafka_sasl_password=SecretStr('p"w\\d'),
                         kafka_ssl_ca_location="/ca.pem", **kw)


def oauth() -> KafkaSecurity:
    return KafkaSecurity(kafka_security_protocol="SASL_SSL", kafka_sasl_mechanism="OAUTHBEARER",
                         kafka_sasl_oauthbearer_token_endpoint_url="https://idp/token",
                         kafka_sasl_oauthbearer_client_id="dwell",
                         kafka_sasl_oauthbearer_client_secret=SecretStr("cs"),
                         kafka_sasl_oauthbearer_scope="kafka")


def test_plaintext_is_the_default_everywhere() -> None:
    sec = KafkaSecurity()
    assert librdkafka_config(sec) == {"security.protocol": "plaintext"}
    assert java_kafka_config(sec) == {"security.protocol": "PLAINTEXT"}
    assert kafka_python_config(sec) == {"security_protocol": "PLAINTEXT"}
    assert uvicorn_ssl(TlsSettings()) == {}
    assert redis_options("redis://h:6379/0", RedisSecurity()) == {}


def test_scram_over_tls_in_each_kafka_client() -> None:
    assert librdkafka_config(scram()) == {
        "security.protocol": "sasl_ssl", "ssl.ca.location": "/ca.pem",
        "ssl.endpoint.identification.algorithm": "https", "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "u", "sasl.password": 'p"w\\d'}
    java = java_kafka_config(scram())
    assert java["ssl.truststore.type"] == "PEM"
    assert java["ssl.truststore.location"] == "/ca.pem"
    # The JAAS value quotes what the password holds.
    assert java["sasl.jaas.config"] == (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="u" password="p\\"w\\\\d";')
    assert spark_kafka_options(scram())["kafka.sasl.mechanism"] == "SCRAM-SHA-512"
    assert kafka_python_config(scram(kafka_ssl_endpoint_identification=False)) == {
        "security_protocol": "SASL_SSL", "ssl_check_hostname": False, "ssl_cafile": "/ca.pem",
        "sasl_mechanism": "SCRAM-SHA-512", "sasl_plain_username": "u",
        "sasl_plain_password": 'p"w\\d'}


def test_oauthbearer_by_oidc_client_credentials() -> None:
    conf = librdkafka_config(oauth())
    assert conf["sasl.oauthbearer.method"] == "oidc"
    assert conf["sasl.oauthbearer.client.secret"] == "cs"
    assert conf["sasl.oauthbearer.scope"] == "kafka"
    java = java_kafka_config(oauth())
    assert java["sasl.oauthbearer.token.endpoint.url"] == "https://idp/token"
    assert java["sasl.jaas.config"].startswith(
        "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
        'clientId="dwell" clientSecret="cs"')
    with pytest.raises(ValueError, match="kafka-python"):
        kafka_python_config(oauth())


@pytest.mark.parametrize("kw, names", [
    ({"kafka_security_protocol": "SASL_SSL"}, "DWELL_KAFKA_SASL_USERNAME"),
    ({"kafka_security_protocol": "SASL_PLAINTEXT", "kafka_sasl_mechanism": "OAUTHBEARER"},
     "TOKEN_ENDPOINT_URL"),
])
def test_incomplete_sasl_is_refused_naming_the_settings(kw: dict[str, str], names: str) -> None:
    with pytest.raises(ValidationError, match=names):
        KafkaSecurity(**kw)


def test_tls_needs_certificate_and_key() -> None:
    with pytest.raises(ValidationError, match="DWELL_TLS_CERTIFICATE_FILE_PATH"):
        TlsSettings(tls_enabled=True)
    tls = TlsSettings(tls_enabled=True, tls_certificate_file_path="/c", tls_key_file_path="/k")
    assert uvicorn_ssl(tls) == {"ssl_certfile": "/c", "ssl_keyfile": "/k"}
    assert http_verify(TlsSettings()) is True


def test_secrets_from_files_and_never_in_reprs(tmp_path: Path) -> None:
    (tmp_path / "pw").write_text("from-a-file\n")
    sec = RedisSecurity(redis_username="dwell", redis_password=SecretStr(f"file:{tmp_path}/pw"),
                        redis_tls_ca_cert_file="/ca.pem")
    assert reveal(sec.redis_password) == "from-a-file"
    assert redis_options("rediss://h:6380/0", sec) == {
        "username": "dwell", "password": "from-a-file", "ssl_cert_reqs": "required",
        "ssl_ca_certs": "/ca.pem"}
    # No TLS options on a plain URL: redis-py's plain connection would refuse them.
    assert "ssl_ca_certs" not in redis_options("redis://h:6379/0", sec)
    assert "from-a-file" not in repr(sec) and "file:" not in repr(sec)
    assert 'p"w' not in repr(scram())
    with pytest.raises(ValueError, match="cannot read the secret file") as err:
        reveal(SecretStr(f"file:{tmp_path}/missing"))
    assert "from-a-file" not in str(err.value)


def test_redis_url_is_not_in_the_settings_repr() -> None:
    from dwell.settings import CommonSettings

    s = CommonSettings(redis_url="redis://:hunter22@h:6379/0")
    assert "hunter22" not in repr(s) and "hunter22" not in str(s)


def test_java_clients_get_the_oauthbearer_token_endpoint_allowed() -> None:
    oauth = KafkaSecurity(kafka_security_protocol="SASL_SSL",
                          kafka_sasl_mechanism="OAUTHBEARER",
                          kafka_sasl_oauthbearer_token_endpoint_url="https://idp/token",
                          kafka_sasl_oauthbearer_client_id="c")
    assert java_oauth_system_properties(oauth) == [
        "-Dorg.apache.kafka.sasl.oauthbearer.allowed.urls=https://idp/token"]
    scram = KafkaSecurity(kafka_security_protocol="SASL_SSL",
                          kafka_sasl_mechanism="SCRAM-SHA-512", kafka_sasl_username="u",
                          kafka_sasl_password="p")
    assert java_oauth_system_properties(scram) == []
