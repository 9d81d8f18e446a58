"""Adding a vendor is one file: a minimal backend dropped into a copy of the package, and nothing else
changed, is detected by ``--backend auto``, served, listed in ``--help``, in the start-up banner and in the
generated docs, and contract-tested; the pods holding its device-plugin resource are attributed to its GPUs,
and its own setting is a flag, an env variable and a config key, listed, checked and applied.

The copy is the real package (``exporter/`` and ``docs/metrics.md``) in a temporary directory; the new
module is the only file added, and no file of the copy is edited.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.exporter import REPO, ExporterProcess, parse_samples
from tests.harness.tree import package_copy

ACME = '''\
"""A minimal vendor: two GPUs that report temperature and power."""

from __future__ import annotations

from typing import ClassVar

from exporter.backends.base import Backend
from exporter.core.k8s_names import DevicePluginResource, DraAttributes, KubernetesNames
from exporter.core.options import BackendSetting
from exporter.core.readings import Collection, GpuReading


class AcmeBackend(Backend):
    name: ClassVar[str] = "acme"
    vendor: ClassVar[str] = "acme"
    auto_priority: ClassVar[int | None] = 1  # tried before every other backend
    runtime: ClassVar[str] = "AcmeRT"  # what gpu_info's cuda_version is the version of, on its GPUs
    floor: ClassVar[str] = "Acme driver 2.1 (its symbols are all it needs)"
    below_floor: ClassVar[str] = "The backend is unavailable, with one line."
    families: ClassVar[frozenset[str]] = frozenset({"gpu_temperature_celsius", "gpu_power_watts"})
    kubernetes: ClassVar[KubernetesNames] = KubernetesNames(
        resources=(DevicePluginResource(r"acme\\.com/gpu"),
                   DevicePluginResource(r"acme\\.com/slice-\\w+", slices=True)),
        index_prefix="acme", dra_drivers=("gpu.acme.example",),
        # its DRA driver's devices say which GPU they are by these attributes (not NVIDIA's uuid)
        dra_attributes=DraAttributes(uuid=("serialNumber",), pci=("busAddress",)))
    settings: ClassVar[tuple[BackendSetting, ...]] = (
        BackendSetting("acme_boost", "--acme-boost", "ACME_BOOST", "integer",
                       "watts the card adds to each power reading (default 0)", default=0, low=0, high=50),)

    def init(self) -> None:
        pass

    def collect(self, out: Collection) -> None:
        for i in range(2):
            out.gpus.append(GpuReading(index=i, uuid=f"ACME-{i}", vendor=self.vendor, name="Acme A1",
                                       temperature_celsius={"gpu": 40.0 + i},
                                       power_watts=100.0 + i + self.setting("acme_boost")))


BACKEND = AcmeBackend
'''


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the package with ``exporter/backends/acme.py`` added, and nothing else changed."""
    root = package_copy(tmp_path_factory.mktemp("tree"))
    (root / "exporter" / "backends" / "acme.py").write_text(ACME)
    return root


def _run(tree: Path, *args: str) -> str:
    done = subprocess.run([sys.executable, *args], cwd=tree, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_auto_detects_and_serves_it(tree: Path, tmp_path: Path) -> None:
    with ExporterProcess(["--backend", "auto", "--sysfs-root", str(tmp_path)], cwd=tree) as ex:
        text = ex.scrape_text()
        log = ex.log()
    assert "backend auto: using acme" in log
    samples = parse_samples(text)
    assert samples[("gpu_temperature_celsius", frozenset({("gpu", "1"), ("uuid", "ACME-1"), ("sensor", "gpu")}))] == 41
    assert samples[("gpu_exporter_collector_success", frozenset({("backend", "acme")}))] == 1
    assert 'vendor="acme"' in text and 'backend="acme"' in text
    # its declaration is what it serves: the declared families, and those the exporter adds for every backend
    # (besides its self-metrics: gpu_exporter_*, process_*)
    served = {name for name, _ in samples if name.startswith("gpu_") and not name.startswith("gpu_exporter_")}
    assert served == {"gpu_info", "gpu_up", "gpu_health_state", "gpu_host_info", "gpu_temperature_celsius",
                      "gpu_power_watts"}


def test_its_pods_are_attributed(tree: Path, tmp_path: Path) -> None:
    """The kubelet's pod-resources answer (a real gRPC fake kubelet) names acme's resource: its pods get their
    GPU, by UUID and by acme's own index form (acme0); a slice of its slice resource shares the GPU."""
    from tests.fakes.kubelet import FakeKubelet, pod, response
    from tests.harness.poll import wait_until

    with FakeKubelet() as kubelet:
        kubelet.set_response(response([
            pod("ml", "train", {"c": [("acme.com/gpu", ["ACME-1"])]}),
            pod("ml", "infer", {"c": [("acme.com/gpu", ["acme0"])]}),
            pod("ml", "part", {"c": [("acme.com/slice-1g", ["acme0/1"])]}),
            pod("ml", "other", {"c": [("example.com/nic", ["eth0"])]}),
        ]))
        with ExporterProcess(["--backend", "acme", "--sysfs-root", str(tmp_path), "--cache-ttl", "0",
                              "--pod-attribution", "on", "--pod-resources-socket", kubelet.path,
                              "--pod-resources-interval", "1"], cwd=tree) as ex:
            samples = wait_until(lambda: (s := parse_samples(ex.scrape_text())) and any(
                n == "gpu_allocation_info" for n, _ in s) and s, 20, what="acme allocations")
    power = {dict(ls)["gpu"]: dict(ls).get("pod") for (n, ls), _ in samples.items() if n == "gpu_power_watts"}
    assert power == {"1": "train", "0": None}  # GPU 0 is shared with a slice: no pod labels on it
    alloc = {(dict(ls)["gpu"], dict(ls)["pod"], dict(ls)["resource"])
             for (n, ls), _ in samples.items() if n == "gpu_allocation_info"}
    assert alloc == {("1", "train", "acme.com/gpu"), ("0", "infer", "acme.com/gpu"), ("0", "part", "acme.com/slice-1g")}
    devices = {dict(ls)["status"]: v for (n, ls), v in samples.items() if n == "gpu_exporter_pod_resources_devices"}
    assert devices == {"allocated": 3, "unmapped": 0, "ignored": 1}


def test_its_dra_driver_is_a_gpu_driver(tree: Path) -> None:
    """Acme's DRA driver joins the others' (this checkout's registry's), and acme is the first vendor (auto order)."""
    from exporter import backends

    real = backends.gpu_resources()
    out = _run(tree, "-c", "from exporter import backends; r = backends.gpu_resources(); "
                           "print(sorted(r.dra_drivers), r.vendors)")
    assert out.strip() == f"{sorted({*real.dra_drivers, 'gpu.acme.example'})} {('acme', *real.vendors)}"
    # the attributes it declares identify its DRA devices, as serve's ResourceSlice reader gets them
    out = _run(tree, "-c", "from exporter import backends; from exporter.k8s.resourceslices import index_slice\n"
                           "dev = lambda n, **a: {'name': n, 'attributes': {k: {'string': v} for k, v in a.items()}}\n"
                           "spec = {'driver': 'gpu.acme.example', 'nodeName': 'n', 'pool': {'name': 'n'}, 'devices': "
                           "[dev('d0', serialNumber='ACME-1'), dev('d1', busAddress='0000:41:00.0'), "
                           "dev('d2', uuid='ACME-1')]}\n"
                           "got = index_slice({'spec': spec}, backends.gpu_resources().dra_attributes)\n"
                           "print(*(got[('gpu.acme.example', 'n', d)] and got[('gpu.acme.example', 'n', d)].keys "
                           "for d in ('d0', 'd1', 'd2')), sep='|')")
    assert out.strip() == "(('uuid', 'acme-1'),)|(('pci', '0000:41:00.0'),)|None"


def test_its_runtime_labels_the_hosts_runtime_version(tree: Path) -> None:
    """The live page and snapshot label the host's cuda_version with the registry's runtimes, acme's first."""
    out = _run(tree, "-c", "import sys; from exporter import backends; from exporter.serve.api import live_page\n"
                           "print(backends.runtime_label()); sys.stdout.write(live_page('/metrics').decode())")
    assert out.split("\n", 1)[0] == "AcmeRT/CUDA/ROCm"
    assert '· AcmeRT/CUDA/ROCm <b data-host="cuda_version">' in out


def test_its_floor_is_a_row_of_the_readmes_floors(tree: Path) -> None:
    """The README's "Supported versions (floors)" table is generated: acme's declared floor is a row of it,
    first (auto order), the real backends' rows kept."""
    from exporter import backends

    out = _run(tree, "-c", "from exporter import backends; print(backends.floors_table(), end='')").splitlines()
    assert out[2] == ("| `acme` | Acme driver 2.1 (its symbols are all it needs) | The backend is unavailable, with "
                      "one line. |")
    assert out[:2] + out[3:] == backends.floors_table().splitlines()
    readme = (REPO / "README.md").read_text()
    assert backends.floors_table() in readme and backends.render_names(readme) == readme


def test_help_lists_it(tree: Path) -> None:
    out = _run(tree, "-m", "exporter", "serve", "--help")
    assert "acme" in out.split("--backend BACKEND", 2)[2].split("--", 1)[0]
    assert "watts the card adds to each power reading (default 0) (env ACME_BOOST)" in " ".join(
        out.split("--acme-boost ACME_BOOST", 1)[1].split())


def test_its_setting_is_applied_from_flag_env_and_file(tree: Path, tmp_path: Path) -> None:
    config = tmp_path / "exporter.yaml"
    config.write_text("acme-boost: 5\n")
    for args, env, boost in (([], {}, 0), (["--config", str(config)], {}, 5), ([], {"ACME_BOOST": "7"}, 7),
                             (["--config", str(config), "--acme-boost", "9"], {"ACME_BOOST": "7"}, 9)):
        with ExporterProcess(["--backend", "acme", "--sysfs-root", str(tmp_path), *args], env=env, cwd=tree) as ex:
            samples = parse_samples(ex.scrape_text())
        assert samples[("gpu_power_watts", frozenset({("gpu", "0"), ("uuid", "ACME-0")}))] == 100 + boost, args
    shown = _run(tree, "-m", "exporter", "serve", "--backend", "acme", "--acme-boost", "3", "--check-config")
    assert '"acme_boost": 3' in shown


@pytest.mark.parametrize(("args", "env", "message"), [
    (["--acme-boost", "51"], {}, "invalid acme_boost (--acme-boost) = '51': expected an integer in 0..50"),
    ([], {"ACME_BOOST": "lots"}, "invalid acme_boost (ACME_BOOST) = 'lots': expected an integer in 0..50"),
])
def test_its_setting_is_checked(tree: Path, args: list[str], env: dict[str, str], message: str) -> None:
    done = subprocess.run([sys.executable, "-m", "exporter", "serve", "--backend", "acme", *args], cwd=tree,
                          env={**os.environ, **env}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr == f"gpu-exporter serve: error: {message}\n"


def test_the_simulated_banner_names_it(tree: Path, tmp_path: Path) -> None:
    """Serving simulated GPUs says which real backends to use instead: the registry's, acme first."""
    with ExporterProcess(["--backend", "simulated", "--sysfs-root", str(tmp_path)], cwd=tree) as ex:
        log = ex.log()
    hint = log.split("Use --backend ", 1)[1].split(" in production", 1)[0].split("|")
    assert hint[0] == "acme" and "nvml" in hint and "simulated" not in hint, hint


def test_generated_docs_list_it(tree: Path) -> None:
    _run(tree, "-m", "exporter.backends", "--write-docs")
    docs = (tree / "docs" / "metrics.md").read_text()
    table = docs.split("<!-- support-table:begin -->")[1].split("<!-- support-table:end -->")[0]
    header = [c.strip() for c in table.strip().splitlines()[0].strip("|").split("|")]
    assert header[1] == "acme", header  # --backend auto tries it first, so it comes first
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.strip("|").split("|")]
            for line in table.strip().splitlines()[2:]}
    assert rows["`gpu_power_watts`"][1] == "yes"
    assert rows["`gpu_memory_used_bytes`"][1] == "no"
    assert rows["`gpu_memory_used_bytes`"][header.index("nvml")] == "yes"  # the others' columns are kept
    # its Kubernetes names are enough for the pod attribution's families (not listed in its families)
    assert rows["`gpu_allocation_info`"][1] == "yes"
    # the real checkout's docs are untouched
    assert "| acme |" not in (REPO / "docs" / "metrics.md").read_text()


def test_the_contract_test_runs_it(tree: Path, tmp_path: Path) -> None:
    """The contract fleets are the registry's backends: in the copy, acme (no fake library needed) is one of
    them, and the contract test's own checks pass on its exposition."""
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from tests.fakes.contract_fleets import BACKENDS, exporter_for\n"
        "from tests.unit.backends import test_contract as c\n"
        "assert BACKENDS[0] == 'acme', BACKENDS\n"
        "with exporter_for('acme', Path(sys.argv[1])) as ex:\n"
        "    text = {'acme': ex.scrape_text()}\n"
        "c.test_support_table_is_true(text)\n"
        "c.test_same_labels_for_the_same_family(text)\n"
        "print('contract ok', ','.join(BACKENDS))\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # the suite's tests/, after the copy's exporter/ (the cwd)
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "fleet")], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "contract ok acme," in done.stdout


def _discovery_error(tree: Path, tmp_path: Path, old: str, new: str) -> str:
    """stderr of the registry's discovery in a copy of ``tree`` whose acme.py has ``old`` replaced by ``new``."""
    bad = tmp_path / "bad"
    shutil.copytree(tree / "exporter", bad / "exporter", ignore=shutil.ignore_patterns("__pycache__"))
    module = bad / "exporter" / "backends" / "acme.py"
    assert old in module.read_text()
    module.write_text(module.read_text().replace(old, new))
    done = subprocess.run([sys.executable, "-c", "from exporter import backends; backends.registry()"], cwd=bad,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    return done.stderr


def test_a_declared_family_must_exist(tree: Path, tmp_path: Path) -> None:
    """A typo in ``families`` fails at discovery, naming the nearest family (it would drop a table cell)."""
    err = _discovery_error(tree, tmp_path, '"gpu_power_watts"', '"gpu_power_wats"')
    assert "'acme' declares unknown metric family 'gpu_power_wats'; did you mean gpu_power_watts?" in err


def test_a_bad_resource_pattern_fails_at_discovery(tree: Path, tmp_path: Path) -> None:
    """A device-plugin resource pattern that is not a regular expression fails at discovery, naming the backend."""
    err = _discovery_error(tree, tmp_path, 'r"acme\\.com/gpu"', 'r"acme\\.com/gpu("')
    assert "backend 'acme' declares a device-plugin resource pattern 'acme\\\\.com/gpu(' that is not" in err


def test_a_bad_setting_fails_at_discovery(tree: Path, tmp_path: Path) -> None:
    """A setting of a kind the exporter cannot parse fails at discovery, naming the backend and the setting."""
    err = _discovery_error(tree, tmp_path, '"ACME_BOOST", "integer"', '"ACME_BOOST", "int"')
    assert "backend 'acme' declares setting 'acme_boost': kind 'int': expected one of path, seconds," in err


# ---- two vendors in a copy of the whole checkout, and the suites that know every backend -----------------------

ZETA = '''\
"""Zeta GPUs through the ``zeta-smi --json`` command line tool (a CLI vendor, over exporter/backends/cli.py); their
UUIDs only in ``zeta-smi --list``, run once (as xpu-smi's discovery beside its dump)."""

from __future__ import annotations

import json
from typing import Any, ClassVar

from exporter.backends.base import BAD_VALUE, BackendError
from exporter.backends.cli import COMMAND_TIMEOUT, CliBackend, Result, path_setting
from exporter.core.k8s_names import DevicePluginResource, KubernetesNames
from exporter.core.options import BackendSetting
from exporter.core.readings import GpuReading

MIB = 2**20


class ZetaSmiBackend(CliBackend):
    name: ClassVar[str] = "zeta-smi"
    vendor: ClassVar[str] = "zeta"
    auto_priority: ClassVar[int | None] = 40
    tool: ClassVar[str] = "zeta-smi"
    directories: ClassVar[tuple[str, ...]] = ("/opt/zeta/bin",)
    arguments: ClassVar[tuple[str, ...]] = ("--json",)
    inventory_arguments: ClassVar[tuple[str, ...]] = ("--list",)
    families: ClassVar[frozenset[str]] = frozenset({
        "gpu_utilization_ratio", "gpu_memory_total_bytes", "gpu_memory_used_bytes", "gpu_temperature_celsius",
        "gpu_power_watts", "gpu_jpeg_utilization_ratio"})
    equivalents: ClassVar[dict[str, str]] = {"gpu_power_watts": "zeta-smi --json: power_w",
                                             "gpu_temperature_celsius": "zeta-smi --json: temperature_c"}
    kubernetes: ClassVar[KubernetesNames] = KubernetesNames(
        resources=(DevicePluginResource(r"zeta\\.example/gpu"),), dra_drivers=("gpu.zeta.example",))
    settings: ClassVar[tuple[BackendSetting, ...]] = (
        path_setting("zeta-smi", "zeta-smi", "PATH, then /opt/zeta/bin/zeta-smi"), COMMAND_TIMEOUT)

    def parse(self, result: Result) -> list[GpuReading]:
        try:
            uuids = dict(line.split() for line in self.inventory.stdout.splitlines()) if self.inventory else {}
            cards: list[dict[str, Any]] = json.loads(result.stdout)["gpus"]
            return [GpuReading(index=int(c["index"]), uuid=uuids[str(c["index"])], vendor=self.vendor,
                               name=c.get("name"),
                               utilization_ratio=c["utilization_pct"] / 100,
                               memory_total_bytes=c["memory_total_mib"] * MIB,
                               memory_used_bytes=c["memory_used_mib"] * MIB,
                               temperature_celsius={"gpu": c["temperature_c"]}, power_watts=c["power_w"],
                               jpeg_utilization_ratio=c["jpeg_pct"] / 100)
                    for c in cards]
        except (ValueError, KeyError, TypeError) as exc:
            raise BackendError(f"zeta-smi output unusable: {type(exc).__name__}: {exc}", kind=BAD_VALUE) from None


BACKEND = ZetaSmiBackend
'''

ZETA_FLEET = '''\
"""The zeta-smi backend's contract fleet: a zeta-smi script printing two GPUs."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from tests.harness.exporter import ExporterProcess

BACKEND = "zeta-smi"
GPUS = [{"index": i, "name": "Zeta Z1", "utilization_pct": 10 * i, "memory_total_mib": 16384,
         "memory_used_mib": 1024, "temperature_c": 40 + i, "power_w": 100.5, "jpeg_pct": 5 * i} for i in range(2)]


def env(tmp: Path) -> dict[str, str]:
    (tmp / "bin").mkdir(parents=True, exist_ok=True)
    script = tmp / "bin" / "zeta-smi"
    script.write_text(f"#!/bin/sh\\ncase \\"$1\\" in --list) printf '0 ZETA-0\\\\n1 ZETA-1\\\\n';;\\n"
                      f"*) echo '{json.dumps({'gpus': GPUS})}';; esac\\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return {"PATH": f"{tmp / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}


def start(tmp: Path, args: list[str]) -> ExporterProcess:
    return ExporterProcess(["--backend", "zeta-smi", *args], env=env(tmp))
'''

# A new family at once (docs/extending.md, "A new metric family"): one row, which zeta-smi fills; readings.py
# is not edited (the value is a GpuReading constructor argument all the same)
FAMILY_ROW = '''    _g("gpu_jpeg_utilization_ratio", GAUGE, "ratio", "JPEG decoder utilisation (0-1).", "utilization",
       "jpeg_utilization_ratio", "nvmlDeviceGetJpgUtilization (%)", {"zeta-smi": "zeta-smi --json: jpeg_pct"},
       views=(Field(digits=4, maximum=1, status=True, column="JPEG"),)),
'''
README_ROWS = ("| `acme` | Acme | a minimal model | itself |\n"
               "| `zeta-smi` | Zeta | the `zeta-smi --json` CLI, run once per collection | a fake CLI |\n")
# What a developer copies to work on the exporter (what the suites below read).
CHECKOUT = ("exporter", "tests", "docs", "deploy", "dashboards", "README.md", "pyproject.toml", "Makefile")
# The suites that name every backend (each reads the registry): the contract test, the Python API on every
# backend, the pod attribution's vendor names, the docs' generated parts and tables, the example config, the
# settings tables, the chart's flags and vendor entries, the folder rules.
SUITES = ("tests/unit/backends/test_contract.py", "tests/unit/tools/test_api.py::test_every_backend",
          "tests/unit/k8s/test_podresources.py", "tests/unit/core/test_docs_tables.py",
          "tests/unit/core/test_gpu_fields.py", "tests/unit/core/test_layout.py::test_no_import_cycle",
          "tests/unit/serve/test_papercuts.py::test_example_config_loads_and_names_every_setting",
          "tests/unit/platform/test_settings_docs.py",
          "tests/e2e/test_helm.py::test_values_schema_is_generated",
          "tests/e2e/test_helm.py::test_each_shipped_vendor_runs_a_backend_the_exporter_has")
# What a developer writes: the two vendors' files and the CLI one's fleet (added), the README's rows and the
# family's row (edited); and what the generators (make docs) rewrite
ADDED = ["exporter/backends/acme.py", "exporter/backends/zeta_smi.py", "tests/fakes/fleets/zeta_smi.py"]
BY_HAND = {"README.md", "exporter/core/schema.py"}
GENERATED = {"docs/metrics.md", "docs/exporter.example.yaml", "README.md", "docs/cli.md", "docs/python-api.md",
             "docs/alerts.md",
             "docs/api.md", "docs/validation.md", "deploy/helm/gpu-exporter/values.schema.json"}


def docs_generators(makefile: Path) -> list[list[str]]:
    """The commands of ``make docs``, as the Makefile lists them (``$(PY) -m ...``)."""
    recipe = makefile.read_text().split("\ndocs:", 1)[1].split("\n\n", 1)[0]
    commands = [line.split("$(PY)", 1)[1].split() for line in recipe.splitlines() if "$(PY)" in line]
    assert commands, "make docs runs no generator"
    return commands


def test_extending_md_lists_every_generator_of_make_docs() -> None:
    """docs/extending.md's "Generated files" names each command ``make docs`` runs."""
    text = (REPO / "docs" / "extending.md").read_text().split("\n## Generated files\n", 1)[1]
    for command in docs_generators(REPO / "Makefile"):
        assert f"`python {' '.join(command)}`" in text, command


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and ".build" not in p.parts}


def test_the_suite_passes_with_two_new_vendors(tmp_path: Path) -> None:
    """An in-process vendor (acme) and a CLI one (zeta-smi, over the backends' CLI helper) in a copy of the
    checkout: one file each, the CLI one's fixture and one README row each, and a new family's schema row
    that zeta-smi fills (readings.py untouched): five files written by hand; the generators of ``make docs``
    rewrite only their files; then every suite that names the backends passes there, running both new
    vendors and the new family."""
    root = tmp_path / "checkout"
    for name in CHECKOUT:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, root / name, ignore=shutil.ignore_patterns("__pycache__"), symlinks=True)
        else:
            shutil.copy(src, root / name)
    (root / ".test-tools").symlink_to(REPO / ".test-tools")  # helm and kubectl, as make test installs them
    before = _files(root)
    (root / "exporter" / "backends" / "acme.py").write_text(ACME)
    (root / "exporter" / "backends" / "zeta_smi.py").write_text(ZETA)
    (root / "tests" / "fakes" / "fleets" / "zeta_smi.py").write_text(ZETA_FLEET)
    readme = root / "README.md"
    anchor = "| `simulated` | none |"
    assert readme.read_text().count(anchor) == 1
    readme.write_text(readme.read_text().replace(anchor, README_ROWS + anchor))
    schema = root / "exporter" / "core" / "schema.py"
    assert schema.read_text().count("    # --- memory ---") == 1
    schema.write_text(schema.read_text().replace("    # --- memory ---", FAMILY_ROW + "    # --- memory ---"))
    for generator in docs_generators(root / "Makefile"):
        done = subprocess.run([sys.executable, *generator], cwd=root, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
    after = _files(root)
    added = sorted(set(after) - set(before))
    changed = sorted(k for k in before if after.get(k) != before[k])
    assert added == ADDED
    assert set(changed) <= GENERATED | BY_HAND, changed
    assert len(added) + len(BY_HAND) == 5  # the files a developer writes for two vendors and a family
    metrics = (root / "docs" / "metrics.md").read_text()
    # a column per vendor tool, whichever other vendors the checkout already has (the schema's two first)
    tools = next(line for line in metrics.splitlines() if line.startswith("| name |") and "| help |" in line)
    columns = [c.strip() for c in tools.strip("|").split("|")]
    assert columns[5:7] == ["nvidia-smi", "amd-smi"] and "zeta-smi" in columns[7:-1] and columns[-1] == "help", columns
    assert "zeta-smi --json: power_w" in metrics
    assert "zeta-smi --json: jpeg_pct" in metrics  # the family's row, with its tool's column
    assert "`jpeg_utilization_ratio`" in (root / "docs" / "api.md").read_text()
    assert "# zeta-smi-path: /usr/bin/zeta-smi\n" in (root / "docs" / "exporter.example.yaml").read_text()
    assert "`acme`, then `nvml`" in (root / "docs" / "cli.md").read_text()
    floors = readme.read_text().split("<!-- floors:begin -->", 1)[1]  # a row each, the floor acme declares
    assert "| `acme` | Acme driver 2.1" in floors and "| `zeta-smi` | not declared (Backend.floor) | - |" in floors
    assert "| `--zeta-smi-path` | `ZETA_SMI_PATH` | `zeta-smi-path` |" in (root / "docs" / "cli.md").read_text()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "-n", "2", *SUITES],
                          cwd=root, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "PASSED tests/unit/backends/test_contract.py::test_support_table_is_true" in done.stdout
    for backend in ("acme", "zeta-smi"):  # the Python API ran each new vendor, the contract test's fleets have it
        assert f"PASSED tests/unit/tools/test_api.py::test_every_backend[{backend}]" in done.stdout, backend
    # the new family is served by zeta-smi from its row alone; /api/v1/families gives each family an entry per
    # vendor tool, zeta-smi's among them (its backend's equivalents, and the new row's, which no nvidia-smi shows)
    served, _, listed = _run(root, "-c", "import sys; from pathlib import Path\n"
                                         "from tests.fakes.contract_fleets import exporter_for\n"
                                         "with exporter_for('zeta-smi', Path(sys.argv[1])) as ex:\n"
                                         "    print(ex.scrape_text(), ex.get('/api/v1/families')[1].decode(), "
                                         "sep='\\n@@\\n')", str(tmp_path / "zeta-fleet")).partition("\n@@\n")
    assert 'gpu_jpeg_utilization_ratio{gpu="1",uuid="ZETA-1"} 0.05' in served, served[-2000:]
    families = {f["name"]: f["equivalents"] for f in json.loads(listed)["families"]}
    assert families["gpu_jpeg_utilization_ratio"]["zeta-smi"] == "zeta-smi --json: jpeg_pct"
    assert families["gpu_jpeg_utilization_ratio"]["nvidia-smi"] is None
    assert families["gpu_power_watts"]["zeta-smi"] == "zeta-smi --json: power_w"
    assert families["gpu_power_watts"]["nvidia-smi"] == "power.draw"
    contract, _, with_fleet = _run(root, "-c", "from tests.fakes.contract_fleets import BACKENDS, fleets; "
                                              "print(*BACKENDS, '|', *fleets())").partition("|")
    assert {"acme", "zeta-smi"} <= set(contract.split()) and "zeta-smi" in with_fleet.split(), contract + with_fleet
