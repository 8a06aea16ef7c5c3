"""Pulsar-style token authentication and authorization for dwell's HTTP services: keys
read as Pulsar's `tokenSecretKey` / `tokenPublicKey` are (`keys`), JWTs verified and
their roles cached (`tokens`), and the FastAPI dependency that answers 401 / 403
(`guard`). The rules of who may do what are pure functions in `dwell.core.authz`."""
