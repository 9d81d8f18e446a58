"""Contract: every backend emits the same families with the same labels, as docs/metrics.md says."""

from __future__ import annotations

import re

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.core.schema import GPU_FAMILIES
from tests.fakes.contract_fleets import BACKENDS, exporter_for
from tests.harness.exporter import REPO
from tests.harness.prom import check_metrics

DOCS = REPO / "docs" / "metrics.md"


def support_table() -> dict[str, dict[str, bool]]:
    text = DOCS.read_text()
    block = text.split("<!-- support-table:begin -->", 1)[1].split("<!-- support-table:end -->", 1)[0]
    rows = [r for r in block.strip().splitlines() if r.startswith("| `")]
    table: dict[str, dict[str, bool]] = {}
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        fam = cells[0].strip("`")
        assert all(c in ("yes", "no") for c in cells[1:]), row
        table[fam] = dict(zip(BACKENDS, (c == "yes" for c in cells[1:]), strict=True))
    return table


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
    table = support_table()
    documented = set(table)
    per_gpu = {f.name for f in GPU_FAMILIES} | {"gpu_info", "gpu_up", "gpu_p2p_supported", "gpu_topology_level"}
    opt_in = {"gpu_process_memory_used_bytes", "gpu_pcie_throughput_bytes_per_second"}
    assert per_gpu - opt_in == documented, "docs/metrics.md support table must list every per-GPU family"
    for backend, text in expositions.items():
        emitted = set(families(text))
        for fam, support in table.items():
            assert (fam in emitted) == support[backend], (
                f"{fam} on {backend}: docs say {'yes' if support[backend] else 'no'}")


def test_every_family_is_documented() -> None:
    text = DOCS.read_text()
    from exporter.core.schema import all_family_names

    missing = [n for n in all_family_names() if not re.search(rf"`{re.escape(n)}`", text)]
    assert missing == []




def test_family_table_matches_the_schema() -> None:
    from exporter.core.schema import markdown_table

    text = DOCS.read_text()
    block = text.split("<!-- families:begin -->\n", 1)[1].split("<!-- families:end -->", 1)[0]
    assert block == markdown_table(), "docs/metrics.md family table is stale: python -m exporter.core.schema"
