"""Hostile input, fuzzed with hypothesis: every input is either accepted or rejected with a clear error.

Each target runs a few hundred cases in ``make test`` and a few thousand in ``make reliability``
(the ``reliability_long`` variant of the same test). Runs are derandomized (the same cases on
every machine) with no example database and no deadline (a loaded 2-core machine is slow).

Targets: exporter settings (flags, environment, YAML file), rocm-smi JSON, kubelet
pod-resources messages, the profiler's reading of annotations it finds on Nodes, the
profiler's parsing of Prometheus API answers, and the exporter's HTTP endpoints.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import strategies as st

from exporter.backends.rocm_smi import RocmSmiParseError, parse_rocm_smi_json
from exporter.core.readings import GpuReading
from exporter.serve import config as exporter_config
from tests.harness.fuzz import one_line, run, text, values
from tests.harness.prom import FakePrometheus
from tests.reliability.support import Result

FAST, LONG = 300, 3000
BUDGETS = [pytest.param(FAST, id="fast"), pytest.param(LONG, id="long", marks=pytest.mark.reliability_long)]


# ---- exporter settings -------------------------------------------------------------------------------

SPECS = exporter_config.SPECS
FLAGS = [s.flag for s in SPECS] + ["--config", "--check-config"]
ENVS = [s.env for s in SPECS if s.env] + ["EXPORTER_CONFIG"]
KEYS = [s.name for s in SPECS] + [s.name.replace("_", "-") for s in SPECS] + ["fields"]

PLAUSIBLE = ["1", "64", "9400", "0", "0.5", "30s", "250ms", "2m", "auto", "nvml", "simulated", "nvml,rocm-smi",
             "true", "false", "on", "debug", "json", "127.0.0.1", "::1", "/metrics", "gpu_clock_*", "/sys"]
plausible = st.sampled_from(PLAUSIBLE)
setting_value = st.one_of(plausible, plausible, plausible, text.filter(lambda t: t not in ("-h", "--help")))
pair = st.tuples(st.sampled_from(FLAGS), setting_value).map(list)
argv = st.lists(st.one_of(pair, pair, pair, st.tuples(setting_value).map(list)), max_size=4).map(
    lambda xs: [a for x in xs for a in x])
environ = st.dictionaries(st.sampled_from(ENVS), setting_value, max_size=5)
yaml_doc = st.one_of(
    st.dictionaries(st.one_of(st.sampled_from(KEYS), text), st.one_of(st.sampled_from(PLAUSIBLE), values),
                    max_size=6).map(
        lambda d: yaml.safe_dump(d, allow_unicode=True)),
    st.builds(lambda d: yaml.safe_dump({"fields": d}), st.dictionaries(text, values, max_size=3)),
    text,
    st.sampled_from(["[", "{a: 1", "- 1\n- 2", "!!python/object:os.system {}", "a: &x [*x]", "a: b: c", "\t- x",
                     "port: 0x1F90", "port: 1e3", "backend: [nvml, amdsmi]", "? [1, 2]\n: 3"]),
)


@pytest.mark.parametrize("budget", BUDGETS)
def test_settings_from_flags_env_and_file(tmp_path: Path, budget: int, result: Result) -> None:
    cfg = tmp_path / "config.yaml"
    seen = {"accepted": 0, "rejected": 0}
    examples: dict[str, str] = {}

    def check(args: list[str], env: dict[str, str], doc: str | None) -> None:
        env = dict(env)
        if doc is not None:
            cfg.write_text(doc)
            env["EXPORTER_CONFIG"] = str(cfg)
        try:
            s = exporter_config.load(args, env)
        except exporter_config.ConfigError as exc:
            msg = str(exc)
            assert one_line(msg), f"not one line: {msg!r}"
            seen["rejected"] += 1
            examples.setdefault(msg.split(" ", 2)[1] if msg.startswith("invalid") else msg[:25], msg)
        else:
            seen["accepted"] += 1
            assert 1 <= s.port <= 65535 and s.max_connections >= 1 and 0.1 <= s.read_timeout <= 300
            assert all(math.isfinite(x) for x in (s.collection_interval, s.collection_timeout, s.cache_ttl,
                                                  s.ready_max_age, s.command_timeout, s.read_timeout))

    run(budget, check, argv, environ, st.one_of(st.none(), yaml_doc))
    result.scenario = "hostile settings: flags, environment, YAML file"
    result.done = (f"{budget} generated combinations of flags, `EXPORTER_*` variables and config files "
                   "(random text, YAML of random types, broken YAML) into `exporter.serve.config.load(argv, environ)`")
    result.happened = "each one accepted with in-range values, or rejected with a one-line ConfigError naming it"
    result.figures = {"cases": budget, **seen, "exceptions_other_than_ConfigError": 0,
                      "sample_rejection": sorted(examples.values(), key=len)[len(examples) // 2][:160]}
    assert seen["rejected"] > 0 and seen["accepted"] > 0


# ---- rocm-smi JSON -----------------------------------------------------------------------------------

ROCM_KEYS = ["Card Series", "Card series", "Device Name", "Device ID", "GPU ID", "Unique ID", "Serial Number",
             "PCI Bus", "VBIOS version", "GPU use (%)", "GPU Memory Read/Write Activity (%)", "GPU memory use (%)",
             "GPU Memory Allocated (VRAM%)", "VRAM Total Memory (B)", "VRAM Total Used Memory (B)",
             "Temperature (Sensor edge) (C)", "Temperature (Sensor junction) (C)", "Temperature (Sensor memory) (C)",
             "Current Socket Graphics Package Power (W)", "Average Graphics Package Power (W)",
             "Max Graphics Package Power (W)", "Accumulated Energy (uJ)", "sclk clock speed:", "mclk clock speed:",
             "socclk clock speed:", "vclk0 clock speed:", "pcie clock level", "PCIe Replay Count", "Fan speed (%)",
             "Compute Partition", "Memory Partition"]
ROCM_VALUES = st.one_of(
    st.sampled_from(["N/A", "(Secondary die)", "N/A (Secondary die)", "0", "0x738c", "0x79ccd55167a2124a",
                     "0000:1e:00.0", "1e:00.0", "(1402Mhz)", "(96MHz)", "(1.2GHz)", "1 (16.0GT/s x16)",
                     "3 (64.0GT/s x32)", "1e999", "-5", "NaN", "SPX", "CPX", "٣٤", "12.5", ""]),
    text, st.integers(), st.floats(), st.none(), st.lists(st.integers(), max_size=2),
)
card = st.dictionaries(st.one_of(st.sampled_from(ROCM_KEYS), text), ROCM_VALUES, max_size=12)
card_name = st.one_of(st.integers(0, 20).map(lambda i: f"card{i}"), st.sampled_from(["card01", "card", "cardX",
                      "card1 ", "card\u0661", "system"]), text)
rocm_doc = st.dictionaries(card_name, st.one_of(card, values), max_size=5)


def _rocm_text(draw: Callable[[st.SearchStrategy[Any]], Any]) -> str:
    doc = json.dumps(draw(rocm_doc), allow_nan=True)
    how = draw(st.sampled_from(["plain", "warning", "truncate", "trail", "deep", "mangle"]))
    if how == "warning":
        return draw(text) + "\n" + doc
    if how == "truncate":
        return doc[: draw(st.integers(0, len(doc)))]
    if how == "trail":
        return doc + draw(text)
    if how == "deep":
        n = draw(st.integers(1, 100_000))
        return '{"card0": ' + "[" * n + "]" * n + "}"
    if how == "mangle":
        i = draw(st.integers(0, len(doc)))
        return doc[:i] + draw(st.sampled_from(["\x00", "\\", '"', "}", "{", "\ufffd", "NaN", ","])) + doc[i:]
    return doc


rocm_text = st.composite(_rocm_text)()


@pytest.mark.parametrize("budget", BUDGETS)
def test_rocm_smi_json(budget: int, result: Result) -> None:
    seen = {"parsed": 0, "rejected": 0, "gpus": 0}

    def check(out: str) -> None:
        try:
            readings = parse_rocm_smi_json(out)
        except RocmSmiParseError as exc:
            assert one_line(str(exc)), str(exc)
            seen["rejected"] += 1
            return
        seen["parsed"] += 1
        seen["gpus"] += len(readings)
        assert all(isinstance(r, GpuReading) and r.uuid for r in readings)
        assert len({r.uuid for r in readings}) == len(readings), "duplicate GPU identities"
        for r in readings:
            for v in (r.power_watts, r.utilization_ratio, r.memory_used_bytes, r.fan_speed_ratio):
                assert v is None or isinstance(v, float)

    run(budget, check, rocm_text)
    result.scenario = "hostile rocm-smi JSON"
    result.done = (f"{budget} generated rocm-smi outputs: cards with every known key holding random strings, "
                   "numbers, N/A, wrong types; duplicate card numbers; warning lines; truncation; 100,000-deep "
                   "nesting; stray bytes into `parse_rocm_smi_json`")
    result.happened = "readings with unique identities, or RocmSmiParseError with one line; nothing else raised"
    result.figures = {"cases": budget, **seen}
    assert seen["parsed"] > 0 and seen["rejected"] > 0


def test_rocm_smi_duplicate_card_numbers_and_deep_nesting() -> None:
    """Regressions the fuzzer found: "card1" next to "card01" (same index), and nesting past the recursion limit."""
    with pytest.raises(RocmSmiParseError, match=r"^card 1 appears twice$"):
        parse_rocm_smi_json('{"card1": {"PCI Bus": "0000:01:00.0"}, "card01": {"PCI Bus": "0000:02:00.0"}}')
    assert [r.index for r in parse_rocm_smi_json('{"card2": {}, "card10": {}, "card1": {}}')] == [1, 2, 10]
    with pytest.raises(RocmSmiParseError, match="nested too deeply"):
        parse_rocm_smi_json('{"card0": ' + "[" * 100_000 + "]" * 100_000 + "}")


# ---- kubelet pod-resources messages ------------------------------------------------------------------

RESOURCES = ["nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-1g.10gb", "amd.com/gpu", "example.com/vf",
             "nvidia.com/", "NVIDIA.COM/GPU", "nvidia.com/gpu\n", ""]
DEVICES = ["GPU-5140a7ed-0000-4000-8000-000000000000", "GPU-5140a7ed-0000-4000-8000-000000000000::3", "0", "7:1",
           "nvidia0", "nvidia1/vgpu2", "nvidia0/2", "MIG-GPU-5140a7ed-0000-4000-8000-000000000000/1/0",
           "MIG-7c1d2e3f-1111-5a6b-9c8d-0000000000a1", "0000:3b:00.0", "3B:00.0", "00000000:3B:00.0", "::", "",
           "nvidia99999999999999999999", "9" * 50, "0000:zz:00.0"]
pb_text = st.one_of(st.sampled_from(["", "a\nb", 'q"uote', "back\\slash", "☃", "x" * 300]),
                    st.text(st.characters(blacklist_categories=("Cs",)), max_size=30))


def _message(draw: Callable[[st.SearchStrategy[Any]], Any]) -> bytes:
    from exporter.k8s.proto import podresources_pb2 as pb

    pods = []
    for _ in range(draw(st.integers(0, 4))):
        containers = []
        for _ in range(draw(st.integers(0, 3))):
            devices = [pb.ContainerDevices(resource_name=draw(st.one_of(st.sampled_from(RESOURCES), pb_text)),
                                           device_ids=draw(st.lists(st.one_of(st.sampled_from(DEVICES), pb_text),
                                                                    max_size=4)))
                       for _ in range(draw(st.integers(0, 3)))]
            containers.append(pb.ContainerResources(name=draw(pb_text), devices=devices))
        pods.append(pb.PodResources(name=draw(pb_text), namespace=draw(pb_text), containers=containers))
    raw = pb.ListPodResourcesResponse(pod_resources=pods).SerializeToString()
    how = draw(st.sampled_from(["valid", "truncate", "flip", "random", "append"]))
    if how == "truncate":
        return raw[: draw(st.integers(0, len(raw)))]
    if how == "flip" and raw:
        i = draw(st.integers(0, len(raw) - 1))
        return raw[:i] + bytes([raw[i] ^ draw(st.integers(1, 255))]) + raw[i + 1:]
    if how == "random":
        return draw(st.binary(max_size=200))
    if how == "append":
        return raw + draw(st.binary(max_size=20))
    return raw


pod_message = st.composite(_message)()

GPUS = [GpuReading(index=0, uuid="GPU-5140a7ed-0000-4000-8000-000000000000", vendor="nvidia",
                   pci_bus_id="0000:3b:00.0"),
        GpuReading(index=1, uuid="amd-pci-0000:3c:00.0", vendor="amd", pci_bus_id="0000:3c:00.0")]


@pytest.mark.parametrize("budget", BUDGETS)
def test_pod_resources_messages(budget: int, result: Result) -> None:
    from google.protobuf.message import DecodeError

    from exporter.k8s.podresources import PodAttribution
    from exporter.k8s.proto import podresources_pb2 as pb

    seen = {"decoded": 0, "decode_errors": 0, "allocations": 0}
    from exporter.backends import gpu_resources

    # never started: only its mapper is used, with the backends' resource names as serve gives them
    mapper = PodAttribution("/nonexistent/kubelet.sock", resources=gpu_resources())

    def check(data: bytes) -> None:
        try:
            msg = pb.ListPodResourcesResponse.FromString(data)
        except DecodeError:
            seen["decode_errors"] += 1  # the gRPC client reports this as a failed List (kind "error")
            return
        seen["decoded"] += 1
        view = mapper._index(msg)  # the mapper the background thread runs on every answer
        seen["allocations"] += len(view.allocations)
        for allocs in view.by_key.values():
            for a in allocs:
                assert all(isinstance(x, str) for x in (a.namespace, a.pod, a.container, a.resource, a.device))

    run(budget, check, pod_message)
    result.scenario = "hostile pod-resources messages"
    result.done = (f"{budget} generated List answers (valid ones with random pod, container, resource and device "
                   "strings; truncated, bit-flipped, random and padded bytes) through protobuf decoding and the "
                   "GPU mapper of `exporter/k8s/podresources.py`")
    result.happened = "decoded answers were mapped without error; undecodable bytes raised protobuf's DecodeError"
    result.figures = {"cases": budget, **seen}
    assert seen["decoded"] > 0 and seen["decode_errors"] > 0


# ---- annotations the profiler finds on a Node -----------------------------------------------------

PREFIX = "gpu-exporter.io"
OUR_NAMES = ["owned-keys", "pending", "pattern", "idle-gpus", "best-gpu", "best-gpu-score", "gpu-0.pattern",
             "gpu-0.uuid", "gpu-1.pattern", "gpu-1.period-seconds", "gpu-1.memory-growth-bytes-per-second",
             "gpu-7.pattern", "gpu-x.pattern", "gpu-0.pattern.old", "gpu-.pattern"]
ALNUM = "abcxyzABCXYZ0189"
name_part = st.one_of(st.sampled_from(ALNUM), st.builds(lambda a, mid, b: a + mid + b, st.sampled_from(ALNUM),
                                                          st.text(ALNUM + "-_.", max_size=20), st.sampled_from(ALNUM)))
hostile_value = st.one_of(
    st.sampled_from(["", "steady", "idle", "periodic", "growing", "unknown", "bursty", "STEADY", "nan", "inf",
                     "-inf", "1e999", "-0", "0x10", "1,2", "=", ":", "gpu-0.pattern=idle:99999999999999999999",
                     "gpu-0.pattern=bursty:1,,=,:", "best-gpu", "a" * 5000, '{"json": true}', "x\ny", "\u0000"]),
    st.text(max_size=50),
)
owned_list = st.lists(st.one_of(st.sampled_from(OUR_NAMES), name_part, st.sampled_from(
    ["example.com/owner", "../x", " ", "", "gpu-0.pattern "])), max_size=8).map(",".join)


def _node_annotations(draw: Callable[[st.SearchStrategy[Any]], Any]) -> dict[str, str]:
    ann = {f"example.com/{draw(name_part)}": draw(hostile_value) for _ in range(draw(st.integers(0, 2)))}
    ours = []
    for _ in range(draw(st.integers(0, 8))):
        name = draw(st.one_of(st.sampled_from(OUR_NAMES), name_part))
        ann[f"{PREFIX}/{name}"] = draw(hostile_value)
        ours.append(name)
    record = draw(st.sampled_from(["ours", "random", "none"]))
    if record == "ours":  # our record lists what is there (as after our own writes), values then tampered with
        ann[f"{PREFIX}/owned-keys"] = ",".join(n for n in ours if n != "owned-keys")
    elif record == "random":
        ann[f"{PREFIX}/owned-keys"] = draw(owned_list)
    return ann


def _gpus(draw: Callable[[st.SearchStrategy[Any]], Any]) -> dict[str, Any]:
    from exporter.profiler.classify import PATTERNS, GpuProfile
    from exporter.profiler.plan import GpuInput

    ratio = st.one_of(st.none(), st.floats(0, 1))
    out = {}
    for gpu in draw(st.lists(st.one_of(st.sampled_from(["0", "1", "7", "12"]), name_part), max_size=4)):
        pattern = draw(st.sampled_from(PATTERNS))
        uuid = st.one_of(st.just(""), st.text("0123456789abcdef-", min_size=8, max_size=36).map("GPU-".__add__))
        out[gpu] = GpuInput(draw(uuid),
                            GpuProfile(pattern, period_seconds=draw(st.one_of(st.none(), st.floats(1, 1e6))),
                                       growth_bytes_per_second=draw(st.one_of(st.none(), st.floats(1, 1e12))),
                                       util_mean=draw(ratio), mem_used_ratio=draw(ratio), score=draw(ratio)))
    return out


node_annotations = st.composite(_node_annotations)()
gpu_inputs = st.composite(_gpus)()


@pytest.mark.parametrize("value", ["", "x", "STEADY", "unknown "])
def test_garbage_published_pattern_is_replaced(value: str) -> None:
    from exporter.profiler.classify import STEADY, GpuProfile
    from exporter.profiler.plan import GpuInput, PlanConfig, diff, plan_node

    current = {f"{PREFIX}/owned-keys": "gpu-0.pattern", f"{PREFIX}/gpu-0.pattern": value}
    for gpus in ({}, {"0": GpuInput("GPU-a", GpuProfile(STEADY, util_mean=0.7, mem_used_ratio=0.5, score=0.4))}):
        patch = diff(current, plan_node(current, gpus, PlanConfig(prefix=PREFIX)), PREFIX)
        assert patch.get(f"{PREFIX}/gpu-0.pattern") in ("unknown", "steady", None)


@pytest.mark.parametrize("budget", BUDGETS)
def test_annotations_read_back_from_nodes(budget: int, result: Result) -> None:
    from exporter.profiler.classify import PATTERNS
    from exporter.profiler.plan import PlanConfig, diff, plan_node
    from tests.harness.kubeapi import ApiError, validate_node

    cfg = PlanConfig(prefix=PREFIX)
    seen = {"nodes_with_our_keys": 0, "converged_after_max": 0}
    result.scenario = "hostile annotations read back from Nodes"
    result.done = (f"{budget} generated Nodes carrying garbage under our prefix (owned-keys naming foreign or odd "
                   "keys, tampered values of listed keys, pending entries with huge counts, non-numbers, "
                   "5,000-character values) and foreign annotations, planned and diffed repeatedly "
                   "(`plan_node`, `diff`)")
    result.happened = ("no exception; patches touch only our prefix; every intermediate Node passes the API "
                       "server's validation; a fixed point within hysteresis + 1 evaluations; garbage "
                       "patterns replaced")
    result.figures = {"cases": budget, **seen}

    def check(current: dict[str, str], gpus: dict[str, Any]) -> None:
        try:
            validate_node({"metadata": {"name": "n", "annotations": current}})
        except ApiError:
            return  # a Node the API server would never have stored
        seen["nodes_with_our_keys"] += any(k.startswith(PREFIX + "/") for k in current)
        ann = dict(current)
        for step in range(cfg.hysteresis + 3):
            patch = diff(ann, plan_node(ann, gpus, cfg), PREFIX)
            assert all(k.startswith(PREFIX + "/") for k in patch), f"a foreign key in the patch: {patch}"
            if not patch:
                seen["converged_after_max"] = max(seen["converged_after_max"], step)
                break
            ann = {k: v for k, v in {**ann, **patch}.items() if v is not None}
            validate_node({"metadata": {"name": "n", "annotations": ann}})  # the API server would accept it
        else:
            raise AssertionError(f"no fixed point after {cfg.hysteresis + 3} evaluations: {ann}")
        assert {k: v for k, v in ann.items() if not k.startswith(PREFIX + "/")} == \
            {k: v for k, v in current.items() if not k.startswith(PREFIX + "/")}, "a foreign annotation changed"
        for gpu in gpus:
            key = f"{PREFIX}/gpu-{gpu}.pattern"
            assert key not in ann or ann[key] in PATTERNS, f"{key}={ann[key]!r} survived"

    try:
        run(budget, check, node_annotations, gpu_inputs)
    except BaseException as exc:  # hypothesis may group several distinct failures
        first = exc.exceptions[0] if isinstance(exc, BaseExceptionGroup) else exc
        result.happened = f"FAILED: {type(first).__name__} {str(first).splitlines()[0][:200] if str(first) else ''}"
        raise
    finally:
        result.figures = {"cases": budget, **seen}
    assert seen["nodes_with_our_keys"] > 0


# ---- Prometheus API answers (profiler) -------------------------------------------------------------

STATS = ["mean", "std", "p95", "count", "early", "fresh", "used", "free", "total", "deriv", "up"]
# Prometheus sends sample values as Go float strings: hostile but well-formed ones
NUMBERS = ["NaN", "+Inf", "-Inf", "1e308", "-1e308", "1e309", "0", "1", "0.5", "-1", "1e-320", "9" * 400, "120",
           "2100", "85899345920", "-0"]
label_value = st.one_of(st.sampled_from(["n-0", "0", "1", "GPU-abc", "", 'q"uote', "new\nline", "back\\slash",
                                         "x" * 300, "gpu-0.pattern", "a/b", "☃", "`"]), st.text(max_size=20))
prom_number = st.one_of(st.sampled_from(NUMBERS), st.floats().map(repr))
wrong = st.sampled_from([None, 0, 1.5, True, "", "x", "0x10", "1,5", [], {}, [1], ["a", "b", "c"], {"a": 1},
                         {"node": 5}, {"gpu": None, "stat": []}, [[0, "1"]], [0], [0, 1, 2]])


def _labels(draw: Callable[[st.SearchStrategy[Any]], Any]) -> dict[str, Any]:
    full = st.just(["node", "gpu", "uuid"])  # usually a complete series, sometimes any subset
    names = st.one_of(full, full, full, st.lists(st.sampled_from(["node", "gpu", "uuid", "instance"]), unique=True))
    labels = {k: draw(label_value) for k in draw(names)}
    labels["stat"] = draw(st.one_of(st.sampled_from(STATS), label_value))
    if draw(st.integers(0, 9)) == 0:
        labels.pop("stat")
    return labels


def _vector(draw: Callable[[st.SearchStrategy[Any]], Any], typed: bool) -> Any:
    result: list[Any] = [{"metric": _labels(draw), "value": [draw(st.floats(0, 2e9)), draw(prom_number)]}
                         for _ in range(draw(st.integers(0, 8)))]
    doc: dict[str, Any] = {"status": "success", "data": {"resultType": "vector", "result": result}}
    if typed:
        if draw(st.integers(0, 9)) == 0:
            doc = {"status": "error", "errorType": draw(label_value), "error": draw(label_value)}
        return doc
    # exactly one defect, so that the rest of the answer gets as far as it can
    how = draw(st.sampled_from(["label", "labels", "value", "missing", "result", "data", "doc"]))
    if result and how in ("label", "labels", "value", "missing"):
        s = result[draw(st.integers(0, len(result) - 1))]
        if how == "label":
            s["metric"][draw(st.sampled_from(sorted(s["metric"]) or ["node"]))] = draw(wrong)
        elif how == "labels":
            s["metric"] = draw(wrong)
        elif how == "value":
            s["value"] = draw(st.one_of(wrong, st.lists(wrong, max_size=3)))
        else:
            s.pop(draw(st.sampled_from(["metric", "value"])))
    elif how == "result":
        doc["data"]["result"] = draw(wrong)
    elif how == "data":
        doc["data"] = draw(wrong)
    elif how == "doc":
        doc = draw(wrong)
    return doc


def _matrix(draw: Callable[[st.SearchStrategy[Any]], Any], typed: bool) -> Any:
    result = [{"metric": _labels(draw),
               "values": [[t, draw(prom_number)] for t in draw(st.lists(st.floats(0, 2e9), max_size=6))]}
              for _ in range(draw(st.integers(0, 4)))]
    return {"status": "success", "data": {"resultType": "matrix", "result": result}}


def _answers(draw: Callable[[st.SearchStrategy[Any]], Any], typed: bool) -> dict[str, bytes]:
    return {"/api/v1/query": json.dumps(_vector(draw, typed)).encode(),
            "/api/v1/query_range": json.dumps(_matrix(draw, typed)).encode()}


def _prometheus_answers(budget: int, typed: bool, result: Result) -> None:
    import io

    from exporter.profiler import prom as promapi
    from exporter.profiler.queries import EMPTY
    from tests.harness.profiler import build_profiler

    allowed = {*promapi.KINDS, EMPTY}
    what = "well-typed answers with hostile values" if typed else "answers of the wrong shape and types"
    result.scenario = f"Prometheus API {what} (profiler)"
    result.done = (f"{budget} generated answers to the profiler's instant and range queries (NaN, ±Inf, 1e309, "
                   "400-digit numbers, labels with quotes, newlines, backslashes, empty or missing labels, "
                   + ("error statuses" if typed else "one field or label of another JSON type per answer")
                   + ") served on 127.0.0.1 to a dry-run cycle")
    result.happened = "every cycle ended with a classified result or a Prometheus error kind; never `internal`"
    seen: dict[str, int] = {"ok": 0}
    result.figures = {"cases": budget, "outcomes": seen}
    server = FakePrometheus(http11=True)
    try:
        def check(answers: dict[str, bytes]) -> None:
            server.by_path = answers
            out = io.StringIO()
            # a dry run without a cluster, no retry, no GPUHealthy condition (its health fields are not read)
            prof = build_profiler(server.url, "--prometheus-retries", "0", "--health-condition", "off", out=out)
            r = prof.run_cycle(at=2e9)
            for kind in r.errors:
                seen[kind] = seen.get(kind, 0) + 1
            if r.ok:
                seen["ok"] += 1
            assert set(r.errors) <= allowed, f"{r.errors} for {answers!r}"
            for line in out.getvalue().splitlines():
                patch = json.loads(line)["patch"]["metadata"]["annotations"]
                assert all(k.startswith("gpu-exporter.io/") and (v is None or isinstance(v, str))
                           for k, v in patch.items())

        run(budget, check, st.composite(_answers)(typed))
    except BaseException as exc:  # hypothesis may group several distinct failures
        first = exc.exceptions[0] if isinstance(exc, BaseExceptionGroup) else exc
        result.happened = f"FAILED: {str(first).splitlines()[0][:300]}"
        raise
    finally:
        server.close()


def test_deeply_nested_prometheus_answer(result: Result) -> None:
    from exporter.profiler.prom import BAD_RESPONSE
    from tests.harness.profiler import build_profiler

    server = FakePrometheus(http11=True)
    deep = b'{"status": "success", "data": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    server.by_path = {"/api/v1/query": deep, "/api/v1/query_range": deep}
    try:
        # a dry run without a cluster, no retry, no GPUHealthy condition (its queries are not the subject)
        prof = build_profiler(server.url, "--prometheus-retries", "0", "--health-condition", "off")
        r = prof.run_cycle(at=2e9)
    finally:
        server.close()
    result.scenario = "Prometheus answer nested 100,000 deep (profiler)"
    result.done = "both instant queries get a JSON answer whose data is 100,000 nested arrays"
    result.happened = f"the cycle failed with {r.errors}"
    result.figures = {"errors": r.errors}
    assert r.errors == [BAD_RESPONSE]


@pytest.mark.parametrize("budget", BUDGETS)
def test_prometheus_answers_with_hostile_values(budget: int, result: Result) -> None:
    _prometheus_answers(budget, True, result)


@pytest.mark.parametrize("budget", BUDGETS)
def test_prometheus_answers_of_the_wrong_shape(budget: int, result: Result) -> None:
    _prometheus_answers(budget, False, result)


# ---- HTTP requests on every endpoint --------------------------------------------------------------

ENDPOINTS = ["/metrics", "/", "/healthz", "/readyz", "/api/v1/monitoring/gpu-metrics", "/stats"]
METHODS = ["GET", "GET", "GET", "GET", "GET", "HEAD", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "TRACE",
           "CONNECT", "get", "PRI", "G\x00T"]
VERSIONS = ["HTTP/1.1", "HTTP/1.1", "HTTP/1.1", "HTTP/1.1", "HTTP/1.0", "HTTP/2.0", "HTTP/1.1x", "HTTP/", "http/1.1",
            ""]
HEADER_NAMES = ["Accept", "Accept-Encoding", "Authorization", "Connection", "Content-Length", "Transfer-Encoding",
                "Host", "Expect", "Range", "If-None-Match", "X-Forwarded-For", "Cookie", " Accept", "Accept ", "",
                "X-\u00e9"]
HEADER_VALUES = ["application/openmetrics-text; version=1.0.0", "gzip", "gzip, deflate, br", "identity;q=0", "*/*",
                 "close", "keep-alive", "Upgrade", "chunked", "100-continue", "bytes=0-10", "Basic", "Basic !!!",
                 "Basic cHJvbWV0aGV1czp3cm9uZw==", "Basic " + "QQ" * 3000, "Bearer x", "0", "-1", "²", "1e3",
                 "99999999999999999999", "\u00ff\u00fe", ""]
path_chars = st.text(st.characters(min_codepoint=0x21, max_codepoint=0xFF), max_size=30)


def _request(draw: Callable[[st.SearchStrategy[Any]], Any]) -> tuple[bool, bytes]:
    auth = draw(st.booleans())
    wild = draw(st.integers(0, 9)) < 3  # 30 %: anything goes; else a well-formed request with odd parts
    base = draw(st.sampled_from(ENDPOINTS))
    if wild:
        method = draw(st.one_of(st.sampled_from(METHODS), st.text("ABCDEFGHIJKLMNOPQRSTUVWXYZ-", max_size=12)))
        version = draw(st.sampled_from(VERSIONS))
        name, value = st.one_of(st.sampled_from(HEADER_NAMES), path_chars), \
            st.one_of(st.sampled_from(HEADER_VALUES), path_chars)
    else:
        method, version = draw(st.sampled_from(["GET", "GET", "HEAD"])), draw(st.sampled_from(["HTTP/1.1", "HTTP/1.0"]))
        name = st.sampled_from([n for n in HEADER_NAMES[:13] if n not in ("Content-Length", "Transfer-Encoding")])
        value = st.one_of(st.sampled_from(HEADER_VALUES), st.text(st.characters(min_codepoint=0x20,
                                                                                max_codepoint=0xFF), max_size=30))
    target = draw(st.sampled_from([
        base, base + "?" + draw(path_chars), base + "?" + "&".join(draw(st.lists(path_chars, max_size=5))),
        base + "#frag", base + "%00%ff%2F..%2F", "//" + base, base.upper(), "http://127.0.0.1" + base,
        base + draw(path_chars), draw(path_chars), "*", "/" + "a" * 9000,
    ]))
    headers = draw(st.lists(st.tuples(name, value), max_size=6))
    eol = draw(st.sampled_from(["\r\n", "\r\n", "\n"]))
    body = b""
    if wild and draw(st.booleans()):
        body = draw(st.binary(max_size=100))
        headers.append(("Content-Length", draw(st.sampled_from([str(len(body)), "²", "-1", "1e3", "0x10",
                                                                 "99999999999999999999"]))))
    if wild and draw(st.integers(0, 9)) == 0:
        headers += [(f"X-H{i}", "v") for i in range(150)]
    headers.append(("Connection", "close"))  # one request per connection: the test never waits on keep-alive
    line = f"{method} {target} {version}".strip()
    head = eol.join([line, *(f"{k}: {v}" if k or v else ":" for k, v in headers)]) + eol + eol
    return auth, head.encode("utf-8", "surrogateescape") + body


http_request = st.composite(_request)()


def _answer(port: int, data: bytes, timeout: float) -> tuple[int | None, float]:
    """Send ``data``; (status of the answer or None if the server closed without one, seconds)."""
    import socket
    import time

    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        try:
            s.sendall(data)
        except OSError:
            pass  # the server may answer (431, 414) and close before reading everything
        chunks = []
        while True:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            chunks.append(chunk)
    raw = b"".join(chunks)
    status = int(raw[9:12]) if raw.startswith(b"HTTP/1.1 ") and raw[9:12].isdigit() else None
    assert raw == b"" or status is not None, f"not an HTTP answer: {raw[:80]!r}"
    return status, time.monotonic() - t0


@pytest.mark.parametrize("budget", BUDGETS)
def test_http_requests_on_every_endpoint(tmp_path: Path, budget: int, result: Result) -> None:
    import bcrypt

    from tests.harness.exporter import ExporterProcess
    from tests.harness.poll import wait_until

    web = tmp_path / "web.yml"
    web.write_text("basic_auth_users:\n  prometheus: "
                   + bcrypt.hashpw(b"right", bcrypt.gensalt(rounds=4)).decode() + "\n")
    read_timeout = 2.0
    common = ["--backend", "simulated", "--simulated-gpus", "2", "--read-timeout", f"{read_timeout:g}"]
    statuses: dict[str, int] = {}
    slowest = [0.0]
    with ExporterProcess(common) as plain, ExporterProcess([*common, "--web.config.file", str(web)]) as guarded:

        def check(req: tuple[bool, bytes]) -> None:
            auth, data = req
            status, secs = _answer((guarded if auth else plain).port, data, read_timeout + 5)
            key = str(status) if status is not None else "closed"
            statuses[key] = statuses.get(key, 0) + 1
            slowest[0] = max(slowest[0], secs)
            assert status != 500, f"500 for {data[:300]!r}"
            assert secs < read_timeout + 2, f"{secs:.1f}s for {data[:300]!r}"

        run(budget, check, http_request)
        for ex in (plain, guarded):
            assert ex.proc.poll() is None
            wait_until(lambda ex=ex: ex.get("/healthz")[0] == 200, 5, what="healthz after the fuzzing")
            assert "Traceback" not in ex.log() and "error serving" not in ex.log()
    result.scenario = "hostile HTTP requests on every endpoint"
    result.done = (f"{budget} generated requests (methods, request targets with %-escapes, 9,000-character paths, "
                   "random queries, versions, bare-LF line ends, odd and oversized headers, 150 headers, bodies, "
                   "bad Content-Length, garbage Authorization) to each endpoint of two exporters, one with basic "
                   "auth; raw sockets on 127.0.0.1")
    result.happened = "every request got a 2xx/4xx/501 answer or a clean close, quickly; never a 500, never a hang, " \
                      "no traceback in the log"
    result.figures = {"cases": budget, "answers": dict(sorted(statuses.items())),
                      "slowest_s": round(slowest[0], 2)}
