"""The published dashboards of dcgm-exporter and nvidia_gpu_exporter, unedited, on our exporter.

``tests/fixtures/dashboards/`` holds Grafana.com dashboards 12239 (dcgm-exporter's), 14574 (in
its long-published revision and its current one) and 25547, byte for byte, with their sources
in ``NOTICE``. A real Prometheus scrapes our exporter and evaluates dashboards/rules/compat-*.yaml;
:mod:`tests.harness.grafana` resolves each dashboard's variables from their own queries as Grafana
does (label_values, query_result with its regex, "All" and allValue, multi-value, built-ins), with
Grafana's default selection and with "All"/the last option, and runs every target as Grafana runs
it. Every target must return data, and every series it reads must exist, except the panels and
series listed below, each with the reason it cannot have data in that scenario.

Scenarios: ``nvml``: the NVML backend over the fake libnvidia-ml (two H100s, GPM, processes with
``--per-process``, an XID on each, fans reported). ``mig``: the simulated backend's ``mig``
scenario, and the NVML fake with MIG devices (two compute instances in one GPU instance), for the
panels that read MIG series.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.fakenvml import GPM_ANY_TENSOR_UTIL, FakeNvml
from tests.harness.exporter import ExporterProcess
from tests.harness.grafana import ALL, Grafana, panels, selectors, targets
from tests.harness.poll import wait_until
from tests.harness.prom import Prometheus

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "dashboards"
RULES = [ROOT / "dashboards" / "rules" / "compat-dcgm.yaml",
         ROOT / "dashboards" / "rules" / "compat-nvidia-gpu-exporter.yaml"]

# file -> (Grafana.com id, git blob id of the published file, panels, exporter)
DASHBOARDS = {
    "dcgm-12239.json": (12239, "f4fdd174d10a65b1f09b0975aa18ecd481c15353", 8, "dcgm"),
    "dcgm-12239-current.json": (12239, "c16810412c8f80d23eaea572fd1cfccb82f5977c", 8, "dcgm"),
    "nvidia-gpu-exporter-14574-2024.json": (14574, "a5d821e7a5a2a61c4e6cb7ebfe1d101fb966fc43", 23, "nvidia_smi"),
    "nvidia-gpu-exporter-14574-current.json": (14574, "4cdb58432f63d17517ccb41b3d8da6b2eec7cad1", 40, "nvidia_smi"),
    "nvidia-gpu-exporter-25547.json": (25547, "258f49bb7397a6781106d5874297e72dbd194720", 22, "nvidia_smi"),
}
NVIDIA_SMI = [n for n, d in DASHBOARDS.items() if d[3] == "nvidia_smi"]

# Series a dashboard reads that cannot exist on our exporter, in any scenario.
SERIES_NEVER = {
    r"nvidia_smi_clocks_throttle_reasons_\w+": "the pre-R535 names of the clocks_event_reasons series; the "
    "dashboards read them only as the `or` fallback of nvidia_smi_clocks_event_reasons_*, which we publish",
    r"nvidia_smi_power_limit_watts": "read only as the fallback of nvidia_smi_enforced_power_limit_watts "
    "(published) when a driver lacks the enforced limit",
}
# MIG series: absent while MIG is off (the nvml scenario); the mig scenario shows them.
MIG_SERIES = r"nvidia_smi_mig_(?!mode)\w+"
# Panels without data in the nvml scenario (dashboard, panel title) -> why.
NVML_EMPTY_PANELS = {
    (name, title): "MIG is off on these GPUs (the mig scenario shows this panel)"
    for name, title in [("nvidia-gpu-exporter-14574-current.json", "MIG Memory Used"),
                        ("nvidia-gpu-exporter-14574-current.json", "MIG SM Activity"),
                        ("nvidia-gpu-exporter-14574-current.json", "MIG Tensor Activity"),
                        ("nvidia-gpu-exporter-25547.json", "MIG Instances"),
                        ("nvidia-gpu-exporter-25547.json", "MIG SM Activity"),
                        ("nvidia-gpu-exporter-25547.json", "MIG Memory Used")]
}


def load(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / name).read_bytes())


def _git_blob(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@pytest.mark.parametrize("name", DASHBOARDS)
def test_fixture_is_the_published_file(name: str) -> None:
    gnet, blob, n_panels, _ = DASHBOARDS[name]
    data = (FIXTURES / name).read_bytes()
    assert _git_blob(data) == blob, f"{name} differs from the published file (git blob {blob})"
    d = json.loads(data)
    assert d["gnetId"] == gnet
    assert len(panels(d)) == n_panels
    notice = (FIXTURES / "NOTICE").read_text()
    assert name in notice and blob in notice and "License" in notice


def _doc_patterns() -> list[str]:
    """Series names as docs/migration.md writes them (`a_{x,y}_b`, `a_*`, `a_total` / `_max`) as regexes."""
    text = (ROOT / "docs" / "migration.md").read_text()
    out = []
    for name in re.findall(r"`((?:nvidia_smi|DCGM_FI)_[\w{},*]+)", text):
        out.append(re.sub(r"\{([^}]*)\}", lambda m: "(" + m.group(1).replace(",", "|") + ")",
                          name.replace("*", r"\w+")))
    return out


def test_migration_doc_lists_every_series_the_dashboards_read() -> None:
    patterns = _doc_patterns()
    read = {n for name in DASHBOARDS for p in panels(load(name)) for t in targets(p)
            for n in re.findall(r"\b(?:nvidia_smi|DCGM_FI)_\w+", t["expr"])}
    missing = sorted(n for n in read if not any(re.fullmatch(p, n) for p in patterns))
    assert not missing, f"docs/migration.md does not name: {missing}"


def test_selectors_reads_every_vector_selector() -> None:
    expr = ('sum by(uuid) (a_total{x="}", y=~"b.+"}) or sum by (uuid, instance) ({__name__=~"c_.+", z="1"}) * on(uuid) '
            'group_left(index, name) rate(d[$__rate_interval]) / 3.6e6 + time() - e offset 5m')
    assert selectors(expr) == ['a_total{x="}", y=~"b.+"}', '{__name__=~"c_.+", z="1"}', "d", "e"]


def _mig_panel(panel: dict[str, Any]) -> bool:
    return any(re.search(MIG_SERIES, t["expr"]) for t in targets(panel))


def _never(selector: str) -> bool:
    name = re.match(r"[a-zA-Z_:][\w:]*", selector)
    return bool(name) and any(re.fullmatch(p, name.group(0)) for p in SERIES_NEVER)  # type: ignore[union-attr]


def findings(graf: Grafana, name: str, only: Any = None, skip_series: str = "$^") -> set[str]:
    """What a dashboard shows empty: 'title' for a target without data, 'title: selector' for a
    series it reads that does not exist, '$var' for a variable without options."""
    out = {f"${v.name}" for v in graf.variables.values() if v.type == "query" and not v.options}
    if out:
        return out
    for panel in panels(load(name)):
        if only and not only(panel):
            continue
        for t in targets(panel):
            if not graf.run(t):
                out.add(panel["title"])
            for sel in selectors(graf.interpolate(t["expr"])):
                if _never(sel) or re.match(skip_series, sel):
                    continue
                if not graf.prom.query(f"count({sel})", time=graf.now):
                    out.add(f"{panel['title']}: {sel}")
    return out


def expected(name: str, table: dict[tuple[str, str], str]) -> set[str]:
    return {title for (n, title) in table if n == name}


def _check(prom: Prometheus, name: str, choices: list[Any], table: dict[tuple[str, str], str],
           only: Any = None, skip_series: str = "$^", timeout: float = 40.0) -> None:
    for choose in choices:
        def settled(choose: Any = choose) -> bool:
            return findings(Grafana(prom, load(name), choose=choose), name, only, skip_series) == expected(name, table)

        try:
            wait_until(settled, timeout=timeout, interval=1.0, what=f"{name} ({choose}) as expected")
        except AssertionError:
            got = findings(Grafana(prom, load(name), choose=choose), name, only, skip_series)
            exp = expected(name, table)
            raise AssertionError(f"{name} with variables {choose}: empty but not listed: {sorted(got - exp)}; "
                                 f"listed but not empty: {sorted(exp - got)}") from None


@pytest.mark.prometheus
def test_published_dashboards_show_data_on_nvml(tmp_path: Path) -> None:
    fleet = FakeNvml(tmp_path / "fleet.conf", gpus=2, fans=1)
    for i in range(2):
        fleet.set(i, procs=[(4000 + i, (i + 1) * 2**30), (5000 + i, 2**29)])
        fleet.queue_xid(i, 79 if i else 48)
    with ExporterProcess(["--backend", "nvml", "--per-process"], env={**fleet.env(), "NODE_NAME": "nv-node"}) as ex:
        scrape = [{"job_name": "gpu-exporter", "static_configs": [
            {"targets": [f"127.0.0.1:{ex.port}"], "labels": {"node": "nv-node"}}]}]
        with Prometheus(tmp_path / "prom", extra_scrape_configs=scrape, rule_files=RULES) as prom:
            # GPM needs two samples; rate() two recorded points
            prom.wait_for('DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{Hostname="nv-node", gpu="1"}', timeout=30)
            for name in DASHBOARDS:
                _check(prom, name, ["default", "all"], NVML_EMPTY_PANELS, skip_series=MIG_SERIES)
            # Variables as Grafana resolves them: the job and node pick our target, the GPU picker
            # names each GPU as the dashboard builds it (name #index (first 8 of the uuid)).
            g = Grafana(prom, load("nvidia-gpu-exporter-25547.json"))
            assert g.variables["job"].values() == ["gpu-exporter"]
            assert g.variables["node"].values() == [f"127.0.0.1:{ex.port}"]
            assert g.variables["gpu"].selected == ALL and g.interpolate("$gpu") == ".*"
            uuid0 = fleet.gpus[0]["uuid"].removeprefix("GPU-")
            assert g.variables["gpu"].options[0] == (f"NVIDIA H100 80GB HBM3 #0 ({uuid0[:8]})", uuid0)
            # The values are ours, in each exporter's units.
            g1 = fleet.gpus[1]
            uuid1 = g1["uuid"].removeprefix("GPU-")
            assert prom.value(f'nvidia_smi_index{{uuid="{uuid1}"}}') == 1
            assert prom.value('max(DCGM_FI_DEV_GPU_TEMP{Hostname="nv-node", gpu="1"}) by (Hostname, gpu, uuid)') \
                == g1["temp_gpu"]
            used = prom.value('DCGM_FI_DEV_FB_USED{Hostname="nv-node", gpu="1"}')
            assert used == pytest.approx(g1["mem_used"] / 2**20)
            assert prom.value('DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{Hostname="nv-node", gpu="1"}') \
                == pytest.approx(g1["gpm"][GPM_ANY_TENSOR_UTIL] / 100)
            assert prom.value(f'nvidia_smi_compute_app_used_memory_bytes{{uuid="{uuid1}", pid="4001"}}') == 2 * 2**30
            assert prom.value("nvidia_smi_compute_apps_last_collect_success") == 1


@pytest.mark.prometheus
def test_published_mig_panels_show_data_on_the_mig_scenario(tmp_path: Path) -> None:
    with ExporterProcess(["--backend", "simulated", "--simulated-scenario", "mig"]) as ex, \
            Prometheus(tmp_path / "prom", scrape_targets=[f"127.0.0.1:{ex.port}"], job_name="gpu-exporter",
                       rule_files=RULES) as prom:
        prom.wait_for("nvidia_smi_mig_sm_activity_ratio", timeout=30)
        mig_gpu = "5140a7ed-0000-4000-8000-000000000000"  # GPU 0 of the scenario has MIG on
        for name in NVIDIA_SMI:
            choices: list[Any] = ["default", "all"] if name.endswith("25547.json") else [{"gpu": mig_gpu}]
            _check(prom, name, choices, {}, only=_mig_panel)
        # MIG panels join the profile on (uuid, gpu_instance_id): one series per GPU instance
        g = Grafana(prom, load("nvidia-gpu-exporter-25547.json"))
        mem = next(p for p in panels(load("nvidia-gpu-exporter-25547.json")) if p["title"] == "MIG Memory Used")
        got = g.run(targets(mem)[0])
        assert sorted(s["metric"]["profile"] for s in got) == ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"]


@pytest.mark.prometheus
def test_published_mig_panels_show_data_on_nvml_mig(tmp_path: Path) -> None:
    """The same panels over the NVML backend: MIG devices named as NVML names them (compute-instance
    profiles "1c.2g.20gb" where a GPU instance holds several compute instances), GPM per GPU instance."""
    fleet = FakeNvml(tmp_path / "fleet.conf", gpus=2)
    fleet.add_mig(0, 0, "3g.40gb", gi=1, mem_total=40 * 2**30, mem_used=5 * 2**30)
    fleet.add_mig(0, 1, "1c.2g.20gb", gi=2, ci=0, mem_total=20 * 2**30, mem_used=2**30)
    fleet.add_mig(0, 2, "1c.2g.20gb", gi=2, ci=1, mem_total=20 * 2**30, mem_used=2**30)
    with ExporterProcess(["--backend", "nvml"], env=fleet.env()) as ex, \
            Prometheus(tmp_path / "prom", scrape_targets=[f"127.0.0.1:{ex.port}"], job_name="gpu-exporter",
                       rule_files=RULES) as prom:
        prom.wait_for("nvidia_smi_mig_tensor_activity_ratio", timeout=30)
        mig_gpu = fleet.gpus[0]["uuid"].removeprefix("GPU-")
        for name in NVIDIA_SMI:
            choices: list[Any] = ["default", "all"] if name.endswith("25547.json") else [{"gpu": mig_gpu}]
            _check(prom, name, choices, {}, only=_mig_panel)
        used = {s["metric"]["gpu_instance_id"]: float(s["value"][1])
                for s in prom.query(f'nvidia_smi_mig_memory_used_bytes{{uuid="{mig_gpu}"}}')}
        assert used == {"1": 5 * 2**30, "2": 2**30}  # per GPU instance, as nvidia_gpu_exporter reports it

