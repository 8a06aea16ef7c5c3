"""dwell-admin's command line without a server: usage errors come before any request."""

from __future__ import annotations

from typer.testing import CliRunner

from dwell.cli.main import app

# Port 1 refuses connections: a command that got as far as a request would say so.
NO_SERVER = ["--url", "http://127.0.0.1:1"]


def test_enable_and_disable_together_is_refused_before_any_request() -> None:
    for flags in (["-e", "-d"], ["-t", "1s"]):
        result = CliRunner().invoke(app, [*NO_SERVER, "namespaces", "set-delayed-delivery",
                                          "t/ns", *flags])
        assert result.exit_code == 1
        assert result.stderr.strip() == "Need to specify either --enable or --disable"
        assert result.stdout == ""


def test_connection_error_is_one_line() -> None:
    result = CliRunner().invoke(app, [*NO_SERVER, "tenants", "list"])
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("error: cannot reach the policy service at http://127.0.0.1:1")


def test_pulsar_short_options_parse() -> None:
    # -md and -fd are multi-letter short options in pulsar-admin; a bad value proves that
    # each reached its own parser.
    for flag, name in (("-md", "--maxDelay"), ("-fd", "--fixed-delay"), ("-t", "--time")):
        result = CliRunner().invoke(app, [*NO_SERVER, "topic-policies",
                                          "set-delayed-delivery", "t/ns/x", "-e", flag, "7q"])
        assert result.exit_code == 1
        assert result.stderr.startswith(f"{name}: invalid duration '7q'")


def test_applied_has_pulsar_admins_short_option() -> None:
    # Parsed, the option lets the command go as far as its request, which port 1 refuses.
    for group, target in (("namespaces", "t/ns"), ("topic-policies", "t/ns/x")):
        result = CliRunner().invoke(app, [*NO_SERVER, group, "get-delayed-delivery", target,
                                          "-ap"])
        assert result.exit_code == 1
        assert result.stderr.startswith("error: cannot reach the policy service"), result.stderr


def test_every_command_has_help() -> None:
    groups = {"tenants": ["create", "list", "get", "delete"],
              "namespaces": ["create", "list", "delete", "set-delayed-delivery",
                             "get-delayed-delivery", "remove-delayed-delivery"],
              "topic-policies": ["set-delayed-delivery", "get-delayed-delivery",
                                 "remove-delayed-delivery"]}
    for group, commands in groups.items():
        for cmd in commands:
            result = CliRunner().invoke(app, [group, cmd, "--help"])
            assert result.exit_code == 0, (group, cmd, result.output)
            assert "Usage:" in result.stdout
