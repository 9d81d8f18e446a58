"""Contract: every backend emits the same families with the same labels, as docs/metrics.md says."""

from __future__ import annotations

import fnmatch

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.backends import registry, render_docs
from exporter.core.schema import FAMILIES, FAMILY_BY_NAME
from tests.fakes.contract_fleets import BACKENDS, exporter_for
from tests.harness.exporter import REPO
from tests.harness.prom import check_metrics

DOCS = REPO / "docs" / "metrics.md"


@pytest.fixture(scope="module")
def expositions(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    out = {}
    for backend in BACKENDS:
        with exporter_for(backend, tmp_path_factory.mktemp(backend)) as ex:
            out[backend] = ex.scrape_text()
    return out


def families(text: str) -> dict[str, set[frozenset[str]]]:
    """sample name -> the label-name sets it appears with."""
    out: dict[str, set[frozenset[str]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, set()).add(frozenset(s.labels))
    return out


def test_output_is_clean_for_every_backend(expositions: dict[str, str]) -> None:
    for backend, text in expositions.items():
        assert check_metrics(text) == [], backend
        assert f'backend="{backend}"' in text


def test_same_labels_for_the_same_family(expositions: dict[str, str]) -> None:
    seen: dict[str, tuple[str, set[frozenset[str]]]] = {}
    for backend, text in expositions.items():
        for name, labelsets in families(text).items():
            if name.startswith("gpu_exporter_") or name == "gpu_host_info":
                continue
            if name in seen:
                first, expected = seen[name]
                assert labelsets == expected, f"{name}: {backend} {labelsets} != {first} {expected}"
            else:
                seen[name] = (backend, labelsets)
    for name, (_, labelsets) in seen.items():
        for ls in labelsets:
            if name.startswith("gpu_") and name not in ("gpu_pci_devices", "gpu_visible_devices"):
                assert {"gpu", "uuid"} <= ls, name


def test_support_table_is_true(expositions: dict[str, str]) -> None:
    """Each backend's ``families`` declaration, for every unconditional family on /metrics by default, is
    exactly what the backend emits (docs/metrics.md's support table is generated from it)."""
    for backend, text in expositions.items():
        emitted = set(families(text))
        for f in FAMILIES:
            sample_name = f.name
            if f.when:
                continue  # state-dependent or opt-in: covered by the backend's own tests
            expected = registry()[backend].fills(f.name) and f.default
            assert (sample_name in emitted) == expected, (
                f"{f.name} on {backend}: its declaration says {'yes' if expected else 'no'}")
        unknown = {n for n in emitted if n not in FAMILY_BY_NAME}
        assert not unknown, f"{backend} emits families missing from the schema: {sorted(unknown)}"


def test_docs_are_generated_from_the_schema() -> None:
    text = DOCS.read_text()
    assert render_docs(text) == text, "docs/metrics.md is stale: python -m exporter.backends --write-docs"
    for f in FAMILIES:
        assert f"`{f.name}`" in text


def test_docs_name_the_registrys_backends() -> None:
    """The README, docs/alerts.md, docs/cli.md and docs/python-api.md name the backends in generated spans, no
    other line of the docs lists every real backend by hand, and the README's backend table has one row per
    backend of the registry (a new vendor's one row)."""
    from exporter.backends import EXAMPLE, NAMED_IN, backend_list, ordered, render_example, render_names

    for path in NAMED_IN:
        text = path.read_text()
        assert render_names(text) == text, f"{path.name} is stale: python -m exporter.backends --write-docs"
        assert "<!-- backends:" in text, path.name
    example = EXAMPLE.read_text()
    assert render_example(example) == example, (
        "docs/exporter.example.yaml is stale: python -m exporter.backends --write-docs")
    assert backend_list("auto").split(", then ")[0] == f"`{ordered()[0]}`"  # --backend auto's first first
    import re

    from exporter.backends import auto_order

    span = re.compile(r"<!-- backends:\w+ -->.*?<!-- /backends -->", re.S)
    root = NAMED_IN[0].parent
    hand = [f"{path.relative_to(root)}:{n}" for path in (root / "README.md", *sorted((root / "docs").glob("*.md")))
            for n, line in enumerate(span.sub("", path.read_text()).splitlines(), 1)
            if not line.startswith("|") and all(f"`{b}`" in line for b in auto_order())]
    assert not hand, f"a hand-written list of every backend (use a <!-- backends:real --> span): {hand}"
    readme = NAMED_IN[0].read_text().split("\n## Backends\n", 1)[1].split("\n\n| backend |", 1)[1]
    rows = [line.split("|")[1].strip().strip("`") for line in readme.split("\n\n", 1)[0].splitlines()[2:]]
    assert sorted(rows) == sorted(ordered()), "README.md's backend table: one row per backend of the registry"


SELECTIONS = (
    ("gpu_memory_used_bytes",),
    ("gpu_up", "gpu_temperature_celsius", "gpu_clock_*"),
)


@pytest.mark.parametrize("include", SELECTIONS, ids=lambda s: ",".join(s))
def test_field_selection_is_the_same_on_every_backend(include: tuple[str, ...],
                                                      tmp_path_factory: pytest.TempPathFactory) -> None:
    """``--fields-include`` by exact name or glob: each backend publishes exactly the selected families
    it supports, and the exporter's self-metrics."""
    wanted = {f.name for f in FAMILIES if f.filterable and any(fnmatch.fnmatchcase(f.name, p) for p in include)}
    for backend in BACKENDS:
        with exporter_for(backend, tmp_path_factory.mktemp(backend), "--fields-include", ",".join(include)) as ex:
            emitted = {n for n in families(ex.scrape_text()) if FAMILY_BY_NAME[n].filterable}
        expected = {n for n in wanted if registry()[backend].fills(n) and not FAMILY_BY_NAME[n].when}
        assert emitted == expected, f"{backend} with --fields-include {','.join(include)}"
