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
    with pytest.raises(ValueError, match=flag) as exc:
        Trust(**kw)
    assert why in str(exc.value) and "\n" not in str(exc.value).replace(repr(value), "")
    assert sources.check_regex(flag, "ok|fine") == "ok|fine"


def test_the_scrapes_label_is_first_and_matched_alone() -> None:
    t = Trust("j", "n")
    d = sources.make(sources.DCGM, "kubernetes_node", t)
    assert d.node_labels == ("kubernetes_node", "Hostname", "hostname") and d.scrape_label == "kubernetes_node"
    assert d.trust is t
    assert d.node_matcher("kubernetes_node") == 'kubernetes_node!=""'
    assert d.node_matcher("kubernetes_node", "`a|b`") == "kubernetes_node=~`a|b`"
    assert d.node_matcher("Hostname") == 'Hostname!="", kubernetes_node="", job=~`j`, namespace=~`n`'
    assert d.node_matcher("hostname", "`x`") == 'hostname=~`x`, kubernetes_node="", job=~`j`, namespace=~`n`'
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
