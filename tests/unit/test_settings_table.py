"""README.md's and docs/configuration.md's configuration tables are what
dwell_dev.settings_table makes of the settings classes, and every settings field carries
the description they print."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings

from dwell_dev import settings_table


def test_every_setting_has_a_description() -> None:
    assert settings_table.undocumented() == []


def test_no_setting_is_declared_by_two_processes() -> None:
    """A setting two processes read is declared once, in a base both take
    (dwell.settings.ReadyTopicSettings), so its default and description cannot drift."""
    assert settings_table.declared_twice() == {}


def test_the_readme_tables_are_generated_from_the_settings() -> None:
    assert settings_table.stale() is None


@pytest.mark.parametrize("target", ["README", "CONFIG_DOC"])
def test_a_row_that_drifts_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    target: str) -> None:
    for name in ("README", "CONFIG_DOC"):
        copy = tmp_path / f"{name}.md"
        copy.write_text(getattr(settings_table, name).read_text())
        monkeypatch.setattr(settings_table, name, copy)
    path = getattr(settings_table, target)
    text = path.read_text()
    row = "| `DWELL_DELAYED_DELIVERY_TICK_TIME_MS` | `1000` |"
    assert row in text
    path.write_text(text.replace(row, "| `DWELL_DELAYED_DELIVERY_TICK_TIME_MS` | `500` |"))
    why = settings_table.stale()
    assert why is not None and "DWELL_DELAYED_DELIVERY_TICK_TIME_MS" in why
    assert path.name in why
    assert settings_table.main(["--check"]) == 1
    assert settings_table.main([]) == 0
    assert settings_table.stale() is None


def test_a_secret_default_is_never_printed() -> None:
    class Secrets(BaseSettings):
        key: SecretStr = Field(SecretStr("s3cret"), description="k")
        url: str = Field("redis://:pw@redis:6379/0", repr=False, description="u")
        empty: SecretStr | None = Field(None, description="e")

    cells = {name: settings_table.render_default(field)
             for name, field in Secrets.model_fields.items()}
    assert cells == {"key": "(hidden)", "url": "(hidden)", "empty": ""}
