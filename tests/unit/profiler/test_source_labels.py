"""exporter/profiler/sources.py on its own: which label names a GPU's node and GPU, and the matchers
that keep a target's own node label from outranking the scrape's (issue 36)."""

from __future__ import annotations

import pytest

from exporter.profiler import sources
from exporter.profiler.sources import Trust


def test_trust_matchers_and_defaults() -> None:
    t = Trust()
    assert t.job == sources.DEFAULT_JOBS and t.namespace == sources.DEFAULT_NAMESPACES
    assert Trust("a|b", "ns").matchers() == "job=~`a|b`, namespace=~`ns`"
    for job in ("gpu-exporter", "nvidia-dcgm-exporter", "dcgm-exporter", "default-metrics-exporter"):
        assert sources.re.fullmatch(t.job, job), job
    for job in ("kubernetes-pods", "tenant", "dcgm-exporter-x"):
        assert not sources.re.fullmatch(t.job, job), job
    for ns in ("gpu-exporter", "gpu-operator", "nvidia-gpu-operator", "kube-amd-gpu", ""):
        assert sources.re.fullmatch(t.namespace, ns), ns
    assert not sources.re.fullmatch(t.namespace, "tenant-a")


@pytest.mark.parametrize(("flag", "value", "why"), [
    ("--source-job", "a(", "not a regular expression"), ("--source-job", "a`b", "without backquotes"),
    ("--source-namespace", "x\ny", "control characters"), ("--source-namespace", "[", "not a regular expression"),
])
def test_bad_trust_values_name_the_flag(flag: str, value: str, why: str) -> None:
    kw = {"job": value} if flag == "--source-job" else {"namespace": value}
    with pytest.raises(ValueError) as exc:
        Trust(**kw)
    msg = str(exc.value)
    assert msg.startswith(f"{flag} {value!r}: ") and why in msg and "\n" not in msg.replace(repr(value), "")
    assert sources.check_regex(flag, "ok|fine") == "ok|fine"


def test_the_scrapes_label_is_first_and_matched_alone() -> None:
    t = Trust("j", "n")
    d = sources.make(sources.DCGM, "kubernetes_node", t)
    assert d.node_labels == ("kubernetes_node", "Hostname", "hostname") and d.scrape_label == "kubernetes_node"
    assert d.trust is t
    assert d.node_matcher("kubernetes_node") == 'kubernetes_node!=""'
    assert d.node_matcher("kubernetes_node", "`a|b`") == 'kubernetes_node=~`a|b`, kubernetes_node!=""'
    # whatever the regex: `.*` would match the series without the label (the target's own name)
    assert d.node_matcher("kubernetes_node", "`.*`") == 'kubernetes_node=~`.*`, kubernetes_node!=""'
    assert d.node_matcher("Hostname") == 'Hostname!="", kubernetes_node="", job=~`j`, namespace=~`n`'
    assert d.node_matcher("hostname", "`x`") == ('hostname=~`x`, hostname!="", kubernetes_node="", job=~`j`, '
                                                 'namespace=~`n`')
    a = sources.make(sources.AMD, "node", t)
    assert a.node_labels == ("node", "hostname", "kubernetes_node") and a.trust is t
    o = sources.make(sources.OURS, "node", t)
    assert o.node_labels == ("node",) and o.scrape_label == "node" and o.trust is t
    assert sources.make(sources.DCGM).trust == Trust()


def test_key_takes_the_scrapes_node_whatever_the_target_says() -> None:
    d = sources.dcgm()
    assert d.key({"node": "n1", "Hostname": "victim", "gpu": "0", "UUID": "U"}) == ("n1", "0", "U")
    assert d.key({"node": "", "Hostname": "h", "hostname": "x", "gpu": "1"}) == ("h", "1", "")
    assert d.key({"hostname": "h2", "gpu": "1"}) == ("h2", "1", "")
    assert d.key({"kubernetes_node": "k", "gpu": "2"}) == ("k", "2", "")
    assert d.key({"node": "n1"}) is None and d.key({"gpu": "0"}) is None and d.key({}) is None
    assert d.uuid_label({"UUID": "U"}) == "UUID" and d.uuid_label({"UUID": ""}) == ""


def test_selectors_and_identity() -> None:
    d, a, o = sources.dcgm(), sources.amd(), sources.gpu_exporter()
    assert d.selector("DCGM_FI_DEV_GPU_UTIL", 'gpu="0"') == 'DCGM_FI_DEV_GPU_UTIL{gpu="0"}'
    assert d.selector("M", "") == "M{}"
    assert a.selector("gpu_gfx_activity", "") == '{__name__=~".*gpu_gfx_activity"}'
    assert a.selector("gpu_gfx_activity", 'x="1"') == '{__name__=~".*gpu_gfx_activity", x="1"}'
    assert d.identity == ("node", "Hostname", "hostname", "kubernetes_node", "gpu", "UUID")
    assert a.identity == ("node", "hostname", "kubernetes_node", "gpu_id", "gpu_uuid", "serial_number")
    assert o.identity == ("node", "gpu", "uuid")
    assert (o.util, o.util_scale, o.mem_scale, o.mem_total) == ("gpu_utilization_ratio", 1.0, 1.0,
                                                                "gpu_memory_total_bytes")
    assert d.mem_total == "" and d.health.xid_last == "DCGM_FI_DEV_XID_ERRORS" and a.any_prefix and not d.any_prefix


def _names(src: sources.Source) -> dict[str, object]:
    """Every metric name and matcher a source's queries select, and its scales."""
    import dataclasses

    out = {k: v for k, v in dataclasses.asdict(src).items() if k not in ("health", "trust")}
    out.update({f"health.{k}": v for k, v in dataclasses.asdict(src.health).items()})
    return out


def test_every_name_ours_queries_is_a_family_we_publish() -> None:
    from exporter.core import schema

    o = sources.make(sources.OURS)
    assert o.name == sources.OURS and sources.make(sources.DCGM).name == sources.DCGM
    assert sources.make(sources.AMD).name == sources.AMD
    names = _names(o)
    metrics = [v for k, v in names.items() if isinstance(v, str) and v and k not in
               ("name", "sm_whole", "health.ecc_matcher")]
    assert len(metrics) == 13
    from exporter.profiler.promql import JOINED_METRICS  # what the range queries read of ours, allocation included
    for m in (*metrics, *JOINED_METRICS):
        assert schema.family(m).name == m, m  # raises for a name the exporter does not publish
    assert names["sm_whole"] == 'gpu_instance=""' and names["health.ecc_matcher"] == 'error_type="uncorrected"'
    assert (names["gpu_labels"], names["uuid_labels"], names["any_prefix"]) == (("gpu",), ("uuid",), False)
    assert names["node_labels"] == ("node",)  # make()'s default node label
    assert (names["util_scale"], names["mem_scale"]) == (1.0, 1.0)
    assert "gpu_instance" in schema.family("gpu_sm_active_ratio").all_labels
    assert "error_type" in schema.family("gpu_ecc_errors_total").all_labels


def test_the_other_exporters_names_are_their_published_ones() -> None:
    # dcgm-exporter: etc/default-counters.csv (and DCGM_FI_PROF_SM_ACTIVE, DCGM_FI_DEV_ROW_REMAP_FAILURE,
    # DCGM_FI_DEV_RETIRED_PENDING from its dcgm-fields list); AMD: pkg/amdgpu/gpuagent/gpuagent_gpu_metrics.go
    assert _names(sources.dcgm()) == {
        "name": "dcgm", "util": "DCGM_FI_DEV_GPU_UTIL", "util_scale": 0.01, "mem_used": "DCGM_FI_DEV_FB_USED",
        "mem_free": "DCGM_FI_DEV_FB_FREE", "mem_total": "", "mem_scale": 1048576.0,
        "node_labels": ("node", "Hostname", "hostname", "kubernetes_node"), "gpu_labels": ("gpu",),
        "uuid_labels": ("UUID",), "sm": "DCGM_FI_PROF_SM_ACTIVE", "sm_whole": 'GPU_I_ID=""',
        "any_prefix": False, "present_by_util": False,
        "health.up": "", "health.xid_counter": "", "health.xid_last": "DCGM_FI_DEV_XID_ERRORS",
        "health.ecc_uncorrectable": "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "health.ecc_matcher": "",
        "health.remap_failed": "DCGM_FI_DEV_ROW_REMAP_FAILURE", "health.retire_pending": "DCGM_FI_DEV_RETIRED_PENDING",
        "health.pcie_width": "", "health.pcie_width_max": "", "health.state": ""}
    assert _names(sources.amd()) == {
        "name": "amd", "util": "gpu_gfx_activity", "util_scale": 0.01, "mem_used": "gpu_used_vram",
        "mem_free": "gpu_free_vram", "mem_total": "gpu_total_vram", "mem_scale": 1048576.0,
        "node_labels": ("node", "hostname", "kubernetes_node"), "gpu_labels": ("gpu_id",),
        "uuid_labels": ("gpu_uuid", "serial_number"), "sm": "", "sm_whole": "", "any_prefix": True,
        "present_by_util": False,
        "health.up": "", "health.xid_counter": "", "health.xid_last": "", "health.ecc_uncorrectable":
        "gpu_ecc_uncorrect_total", "health.ecc_matcher": "", "health.remap_failed": "", "health.retire_pending": "",
        "health.pcie_width": "", "health.pcie_width_max": "", "health.state": ""}
    with pytest.raises(KeyError):
        sources.make("nvidia")


def test_dcgm_47s_renamed_fields_and_the_sources_one_name_reads() -> None:
    # NVIDIA/DCGM dcgmlib/dcgm_fields.h's renames (DCGM 4.7, dcgm-exporter 4.9.0's default)
    t = Trust("j", "n")
    new, old = _names(sources.make(sources.DCGM_47, "k", t)), _names(sources.make(sources.DCGM, "k", t))
    changed = {k: v for k, v in new.items() if old[k] != v}
    assert changed == {"name": "dcgm-4.7", "util": "DCGM_FI_DEV_GPU_UTIL_RATIO", "util_scale": 1.0,
                       "sm": "DCGM_FI_PROF_SM_UTIL_RATIO", "present_by_util": True,
                       "health.xid_last": "DCGM_FI_DEV_XID_ERROR",
                       "health.remap_failed": "DCGM_FI_DEV_ROW_REMAP_FAILED",
                       "health.retire_pending": "DCGM_FI_DEV_PAGE_RETIRED_PENDING"}
    assert new["node_labels"][0] == "k" and sources.make(sources.DCGM_47, "k", t).trust is t
    assert sources.dcgm_47().node_labels[0] == "node" and sources.dcgm_47().trust == Trust()
    assert sources.expand(sources.DCGM) == ("dcgm-4.7", "dcgm")
    assert sources.expand(sources.AMD) == ("amd",) and sources.expand(sources.OURS) == ("gpu-exporter",)


def test_a_raw_series_is_believed_with_the_scrapes_node_label_or_from_the_trusted_jobs() -> None:
    # the range queries' rule (fold.attach_range): the aggregates' node_matcher, on a series' own labels
    trust = sources.Trust(job="dcgm-exporter|gpu-.*", namespace="gpu-operator|")
    for name in (sources.OURS, sources.DCGM, sources.AMD):
        src = sources.make(name, "node", trust)
        assert src.believed({"node": "n1", "job": "tenant", "namespace": "tenant-a"})
        assert src.believed({"job": "dcgm-exporter", "namespace": "gpu-operator"})
        assert src.believed({"job": "gpu-exporter"})  # no namespace label: the empty string, allowed here
        assert not src.believed({"node": "", "job": "tenant", "namespace": "gpu-operator"})
        assert not src.believed({"job": "dcgm-exporter", "namespace": "tenant-a"})
        assert not src.believed({"job": "dcgm-exporter-x", "namespace": "gpu-operator"})  # fully anchored
        assert not src.believed({"job": "xdcgm-exporter", "namespace": "gpu-operator"})
        assert not src.believed({"namespace": "gpu-operator"})  # no job label: the empty string
    assert not sources.Trust(namespace="gpu-operator").admits({"job": "gpu-exporter"})
    assert sources.Trust(job="|gpu-exporter", namespace="").admits({})  # both missing: empty, as PromQL
