"""A GPM family is its schema row (issue 27): nvml_gpm.py takes the metric ids, the family, its labels and
its unit from the rows' ``gpm`` column, so a row with an NVML_GPM_METRIC_* id, the reading's field and
the backend's declaration are the whole change (docs/extending.md, "A new metric family")."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.backends import nvml_gpm
from exporter.core import schema
from tests.fakes.fakenvml import GPM_DMMA_TENSOR_UTIL, FakeNvml
from tests.harness.exporter import ExporterProcess, sample
from tests.harness.tree import edit, package_copy

# DMMA tensor activity: a GPM metric the fake serves that no row of the schema publishes (yet).
ROW = f'''    _g("gpu_dmma_tensor_active_ratio", GAUGE, "ratio",
       "Fraction of time the DMMA tensor pipe was active over the last collection interval (0-1), by gpu_instance.",
       "activity", "dmma_tensor_active_ratio", "nvmlGpmMetricsGet DMMA_TENSOR_UTIL (%)",
       {{"nvidia-smi": "(dcgmi dmon -e 1004)"}}, labels=("gpu_instance",), when=_GPM,
       gpm=(({GPM_DMMA_TENSOR_UTIL}, ""),)),
'''


def test_the_reader_asks_exactly_the_rows_gpm_ids() -> None:
    rows = [f for f in schema.FAMILIES if f.gpm]
    assert {m[0] for m in nvml_gpm._METRICS} == {metric for f in rows for metric, _ in f.gpm}
    assert set(nvml_gpm.FAMILIES) == {f.name for f in rows}
    ids = [metric for f in rows for metric, _ in f.gpm]
    assert len(ids) == len(set(ids)), "one GPM metric feeds one series"
    for f in rows:  # each label value the row files a metric under is a value of its own label
        assert f.scope == "gpu" and f.unit in ("ratio", "bytes per second"), f.name
        assert all(bool(key) == bool(set(f.labels) - {"gpu_instance"}) for _, key in f.gpm), f.name


def test_a_row_in_a_unit_gpm_cannot_give_fails_loudly() -> None:
    bad = schema.Family("gpu_x_celsius", schema.GAUGE, "celsius", "X.", "activity", attr="x", gpm=((2, ""),))
    with pytest.raises(ValueError, match="gpu_x_celsius: GPM gives percent or MiB/s"):
        nvml_gpm._from_schema((bad,))


def test_a_new_gpm_family_is_its_row(tmp_path: Path) -> None:
    root = package_copy(tmp_path / "tree")
    pkg = root / "exporter"
    edit(pkg / "core" / "schema.py", "    # --- health ----", ROW, before=True)
    edit(pkg / "core" / "readings.py", "    memory_reserved_bytes: float | None = None\n",
          "    dmma_tensor_active_ratio: dict[str, float] = field(default_factory=dict)\n")
    edit(pkg / "backends" / "nvml.py", "    families: ClassVar[frozenset[str]] = frozenset({\n",
          '        "gpu_dmma_tensor_active_ratio",\n')
    fleet = FakeNvml(tmp_path / "fleet.conf", gpus=2)
    with ExporterProcess(["--backend", "nvml", "--cache-ttl", "0", "--sysfs-root", str(tmp_path / "sys")],
                         env=fleet.env(), cwd=root) as ex:
        assert "gpu_dmma_tensor_active_ratio" not in ex.scrape_text()  # one sample: no rate yet
        s = ex.scrape()
        text = ex.scrape_text()
    for gpu in (0, 1):
        want = fleet.gpus[gpu]["gpm"][GPM_DMMA_TENSOR_UTIL] / 100
        assert sample(s, "gpu_dmma_tensor_active_ratio", gpu=str(gpu), gpu_instance="") == pytest.approx(want)
    assert "# HELP gpu_dmma_tensor_active_ratio Fraction of time the DMMA tensor pipe was active" in text
