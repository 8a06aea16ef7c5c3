"""`dwell-admin tokens`: Pulsar's `pulsar tokens` for dwell's token authentication, with
its options and outputs: `create-secret-key` (raw bytes, or base64 with --base64, on
stdout or to --output), `create-key-pair` (DER files), `create` (the token on stdout).
Keys are given as Pulsar takes them: data:;base64,..., file:/path, or base64."""

from __future__ import annotations

import base64
import os
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from dwell.auth.keys import HMAC_ALGORITHMS, InvalidKey, algorithms_of, load_private_key, read_key
from dwell.auth.tokens import SECRET_KEY_BYTES, create_key_pair, create_secret_key, create_token
from dwell.core.durations import parse_duration_ms

tokens = typer.Typer(no_args_is_help=True,
                     help="Make keys and tokens for token authentication (pulsar tokens).")

AlgorithmOpt = Annotated[Optional[str], typer.Option(
    "--signature-algorithm", "-a", help="HS256/HS384/HS512 for a secret key; RS256/RS384/"
                                        "RS512 or ES256/ES384/ES512 for a key pair.")]


def _fail(message: str) -> typer.Exit:
    typer.echo(message, err=True)
    return typer.Exit(1)


def write_key_file(path: Path, data: bytes) -> None:
    """Write a key readable by its owner alone (0600), whatever the umask, and an existing
    file's wider mode narrowed before the key goes in."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, data)
    finally:
        os.close(fd)


@tokens.command("create-secret-key", help="Create a new secret key.")
def create_secret_key_cmd(
    algorithm: AlgorithmOpt = None,
    output: Annotated[Optional[Path], typer.Option(
        "--output", "-o", help="Write the secret key to a file instead of stdout.")] = None,
    b64: Annotated[bool, typer.Option("--base64", "-b",
                                      help="Encode the key in base64.")] = False,
) -> None:
    alg = algorithm or "HS256"
    if alg not in SECRET_KEY_BYTES:
        raise _fail(f"{alg} is not a secret-key algorithm ({', '.join(SECRET_KEY_BYTES)})")
    key = create_secret_key(alg)
    encoded = base64.b64encode(key) if b64 else key
    if output is not None:
        write_key_file(output, encoded)
    else:
        sys.stdout.buffer.write(encoded)
        sys.stdout.flush()


@tokens.command("create-key-pair", help="Create a new pair of keys, private and public "
                                        "(DER: PKCS#8 and X.509).")
def create_key_pair_cmd(
    output_private_key: Annotated[Path, typer.Option(
        "--output-private-key", help="File where to write the private key.")],
    output_public_key: Annotated[Path, typer.Option(
        "--output-public-key", help="File where to write the public key.")],
    algorithm: AlgorithmOpt = None,
) -> None:
    try:
        private, public = create_key_pair(algorithm or "RS256")
    except (ValueError, KeyError):
        raise _fail(f"{algorithm} does not use a key pair (RS256, ES256, ...)") from None
    write_key_file(output_public_key, public)
    write_key_file(output_private_key, private)


@tokens.command("create", help="Create a new token.")
def create_cmd(
    subject: Annotated[str, typer.Option(
        "--subject", "-s", help="The 'subject' or 'principal' (the role) of the token.")],
    expiry_time: Annotated[Optional[str], typer.Option(
        "--expiry-time", "-e", help="Relative expiry time for the token (eg: 1h, 3d, 10y). "
                                    "(m=minutes) Default: no expiration")] = None,
    secret_key: Annotated[Optional[str], typer.Option(
        "--secret-key", "-sk", help="The secret key for signing the token: data:, file:, "
                                    "or base64.")] = None,
    private_key: Annotated[Optional[str], typer.Option(
        "--private-key", "-pk", help="The private key for signing the token: data:, file:, "
                                     "or base64.")] = None,
    algorithm: AlgorithmOpt = None,
) -> None:
    if (secret_key is None) == (private_key is None):
        raise _fail("Either --secret-key or --private-key needs to be passed for signing a "
                    "token" if secret_key is None else
                    "Only one of --secret-key and --private-key needs to be passed for "
                    "signing a token")
    try:
        expires_at = (time.time() + parse_duration_ms(expiry_time) / 1000
                      if expiry_time is not None else None)
    except ValueError as exc:
        raise _fail(f"--expiry-time: {exc}") from None
    try:
        if secret_key is not None:
            key = read_key(secret_key, "--secret-key")
            allowed = HMAC_ALGORITHMS
            # jjwt picks the HMAC strength from the key's length, as `pulsar tokens` does.
            alg = algorithm or ("HS512" if len(key) >= 64 else
                                "HS384" if len(key) >= 48 else "HS256")
            signing: object = key
        else:
            signing = load_private_key(read_key(private_key or "", "--private-key"),
                                       "--private-key")
            allowed = algorithms_of(signing)
            alg = algorithm or allowed[0]
    except InvalidKey as exc:
        raise _fail(str(exc)) from None
    if alg not in allowed:
        raise _fail(f"{alg} does not fit the key given ({', '.join(allowed)})")
    typer.echo(create_token(signing, alg, subject, expires_at))
