"""The docs' settings tables (docs/cli.md, docs/profiler.md, the README's) and the exporter's own settings in
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


def _full_table(doc: str, command: str) -> list[list[str]]:
    """The cells of each row of ``doc``'s table of every ``command`` setting."""
    text = (settings_docs.ROOT / "docs" / doc).read_text()
    table = text.split(f"<!-- settings:{command} -->\n", 1)[1].split("<!-- /settings -->", 1)[0]
    assert table.splitlines()[0] == "| flag | env | config key | default | |"
    return [[c.strip() for c in line.strip("|").split(" | ")] for line in table.splitlines()[2:]]


def test_every_profiler_setting_is_in_its_table() -> None:
    rows = _full_table("profiler.md", "profile")
    assert [cells[0].strip("`") for cells in rows] == [r.flag for r in profiler.ROWS]


def test_every_serve_setting_is_in_cli_md_with_its_env_key_and_default() -> None:
    """docs/cli.md's table has every serve setting, the backends' own among them, in the rows' order: its env
    twin, a config key the loader takes as that setting, its default and its description."""
    from exporter import backends
    from exporter.platform.settings import _flatten

    specs = serve.described_rows()
    rows = _full_table("cli.md", "serve")
    assert [cells[0].strip("`") for cells in rows] == [r.flag for r in specs]
    assert {s.flag for s in backends.settings()} <= {cells[0].strip("`") for cells in rows}
    for spec, (flag, env, key, default, doc) in zip(specs, rows, strict=True):
        assert env.split(", ")[0] == f"`{spec.env}`", flag
        assert _flatten({key.strip("`"): "x"}, specs, "f.yaml", ("fields",)) == {spec.name: (key.strip("`"), "x")}
        assert (default != "") is (spec.default not in (None, "", (), [], {})), flag
        assert doc and "{backends}" not in doc, flag
    assert "| `--backend` | `EXPORTER_BACKEND` | `backend` | `auto` | auto \\| " + " \\| ".join(backends.ordered()) \
        in (settings_docs.ROOT / "docs" / "cli.md").read_text()


def test_a_row_shows_its_flag_env_default_and_doc(monkeypatch: pytest.MonkeyPatch) -> None:
    """A new profiler row (its env twin is implied by PROFILER_, its older name shown) and a changed default
    appear in the regenerated table; a serve row named in a partial table shows its env."""
    row = dataclasses.replace(profiler.ROWS[0], name="widget_limit", flag="--widget-limit", env="PROFILER_WIDGET_LIMIT",
                              kind="integer", default=7, twins=("WIDGETS",), doc="how many `widgets`", shown="",
                              parse=None)
    monkeypatch.setattr(profiler, "ROWS", (*profiler.ROWS, row))
    text = render_tables("<!-- settings:profile -->\n<!-- /settings -->\n", settings_docs.commands())
    assert "| `--widget-limit` | `WIDGETS` | `widget-limit` | `7` | how many `widgets` |\n<!-- /settings -->" in text
    text = render_tables("<!-- settings:serve port -->\nold\n<!-- /settings -->", settings_docs.commands())
    assert text == ("<!-- settings:serve port -->\n| flag | env | config key | default | |\n|---|---|---|---|---|\n"
                    "| `--port` | `EXPORTER_PORT` | `port` | `9400` | listen port |\n<!-- /settings -->")
    with pytest.raises(ValueError, match="no setting 'prot'"):
        render_tables("<!-- settings:serve prot -->\n<!-- /settings -->", settings_docs.commands())


def test_the_example_lists_each_setting_not_set_above() -> None:
    text = "port: 1\nfields:\n  exclude: [a]\n# settings:begin\nstale\n# settings:end\n"
    out = render_example(text, settings_docs.example_rows())
    block = out.split("# settings:begin\n", 1)[1].split("# settings:end", 1)[0]
    keys = [line[2:].split(":", 1)[0] for line in block.splitlines()]
    own = {r.name for r in serve.SPECS} - set(serve._BACKEND_NAMES)
    assert {k.replace("-", "_").replace(".", "_") for k in keys} == own - {"port", "fields_exclude"}
    assert "# web.config.file: /etc/gpu-exporter/web-config.yml\n" in block  # no default: its example
    assert "# collection-timeout: 5\n" in block
    # switched on, the block loads as YAML with the defaults
    doc = yaml.safe_load("\n".join(line[2:].split("  #")[0] for line in block.splitlines()))
    assert doc["collection-timeout"] == 5 and doc["fields-include"] == []
