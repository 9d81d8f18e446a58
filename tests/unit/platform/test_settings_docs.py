"""The docs' settings tables (docs/cli.md, docs/profiler.md) and the exporter's own settings in
docs/exporter.example.yaml are generated from the settings rows (exporter/settings_docs.py over
exporter/platform/settings_docs.py): a file
that differs from what the rows give is stale, and a row's flag, env twin, default or docs text shows there."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from exporter import settings_docs
from exporter.platform.settings_docs import render_example, render_tables
from exporter.profiler import main as profiler
from exporter.serve import config as serve

FIX = "python -m exporter.settings_docs --write-docs (make docs)"


@pytest.mark.parametrize("path", [*settings_docs.TABLES, settings_docs.EXAMPLE], ids=lambda p: p.name)
def test_generated_settings_docs_are_fresh(path: Path) -> None:
    assert path.read_text() == settings_docs.fresh(path), f"{path.name} is stale: {FIX}"


def test_every_profiler_setting_is_in_its_table() -> None:
    text = (settings_docs.ROOT / "docs" / "profiler.md").read_text()
    table = text.split("<!-- settings:profile -->", 1)[1].split("<!-- /settings -->", 1)[0]
    assert [line.split("`")[1] for line in table.splitlines()[3:]] == [r.flag for r in profiler.ROWS]


def test_a_row_shows_its_flag_env_default_and_doc(monkeypatch: pytest.MonkeyPatch) -> None:
    """A new profiler row (its env twin is implied by PROFILER_, its older name shown) and a changed default
    appear in the regenerated table; a serve row named in a partial table shows its env."""
    row = dataclasses.replace(profiler.ROWS[0], name="widget_limit", flag="--widget-limit", env="PROFILER_WIDGET_LIMIT",
                              kind="integer", default=7, twins=("WIDGETS",), doc="how many `widgets`", shown="",
                              parse=None)
    monkeypatch.setattr(profiler, "ROWS", (*profiler.ROWS, row))
    text = render_tables("<!-- settings:profile -->\n<!-- /settings -->\n", settings_docs.commands())
    assert "| `--widget-limit` | `WIDGETS` | `7` | how many `widgets` |\n<!-- /settings -->" in text
    text = render_tables("<!-- settings:serve port -->\nold\n<!-- /settings -->", settings_docs.commands())
    assert text == ("<!-- settings:serve port -->\n| flag | env | default | |\n|---|---|---|---|\n"
                    "| `--port` | `EXPORTER_PORT` | `9400` | listen port |\n<!-- /settings -->")
    with pytest.raises(ValueError, match="no setting 'prot'"):
        render_tables("<!-- settings:serve prot -->\n<!-- /settings -->", settings_docs.commands())


def test_the_example_lists_each_setting_not_set_above() -> None:
    text = "port: 1\nfields:\n  exclude: [a]\n# settings:begin\nstale\n# settings:end\n"
    out = render_example(text, settings_docs.commands()["serve"][0])
    block = out.split("# settings:begin\n", 1)[1].split("# settings:end", 1)[0]
    keys = [line[2:].split(":", 1)[0] for line in block.splitlines()]
    own = {r.name for r in serve.SPECS} - set(serve._BACKEND_NAMES)
    assert {k.replace("-", "_").replace(".", "_") for k in keys} == own - {"port", "fields_exclude"}
    assert "# web.config.file: /etc/gpu-exporter/web-config.yml\n" in block  # no default: its example
    assert "# collection-timeout: 5\n" in block
    # switched on, the block loads as YAML with the defaults
    doc = yaml.safe_load("\n".join(line[2:].split("  #")[0] for line in block.splitlines()))
    assert doc["collection-timeout"] == 5 and doc["fields-include"] == []
