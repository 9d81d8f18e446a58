"""Where the profiler's GPU series come from: our exporter, dcgm-exporter, or AMD's device-metrics-exporter.

A :class:`Source` names, for one exporter, the metric of each quantity the profiler reads,
the factor that brings it to SI (ratio 0-1, bytes), and the labels that identify a GPU's
node, index and UUID. The queries select raw series by these names and keep every identity
label (``max by``); this module turns an answer's labels into the profiler's (node, gpu, uuid)
and scales its values, so the classification never sees which exporter spoke. The mappings,
with their sources, are in docs/profiler.md ("Sources").

Health (the ``GPUHealthy`` Node condition) reads each source's health fields where they exist
(:class:`Health`); a missing field is never taken for a healthy reading of it.

Trust boundary (issue 36): a node name set by the scraped target (dcgm-exporter's ``Hostname``,
AMD's ``hostname``, ``kubernetes_node``, our ``gpu_host_info{node}``) is what any pod that
Prometheus scrapes can claim. The scrape's own node label (``--node-label``, set by relabelling
from the target's Kubernetes node) always wins: a series carrying it is read under it and never
under a target's label. A target's label is read only where the scrape sets none, and only from
series of the exporters' own jobs and namespaces (:class:`Trust`, ``--source-job`` and
``--source-namespace``), which a tenant's pod cannot take (with ``honor_labels: false``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

MIB = 1024.0 * 1024.0

@dataclass(frozen=True)
class Health:
    """A source's health fields (metric names; empty: the source has none)."""

    up: str = ""  # 1 answered / 0 lost (a gauge)
    xid_counter: str = ""  # a counter per XID code, label ``xid`` (ours)
    xid_last: str = ""  # a gauge holding the last XID code (dcgm)
    ecc_uncorrectable: str = ""  # a counter of uncorrectable errors
    ecc_matcher: str = ""  # extra matcher for ecc_uncorrectable (ours: error_type="uncorrected")
    remap_failed: str = ""  # 1 when a row remap failed
    retire_pending: str = ""  # > 0 when a page retirement is pending
    pcie_width: str = ""  # current PCIe link width (lanes)
    pcie_width_max: str = ""  # its maximum
    state: str = ""  # one series per state, label ``state``, 1 on the GPU's own (ours: gpu_health_state)


# The scrape jobs and namespaces the exporters run under as shipped (ours: deploy/; NVIDIA's GPU
# Operator: nvidia-dcgm-exporter in gpu-operator, nvidia-gpu-operator on OpenShift; dcgm-exporter's
# Helm chart: dcgm-exporter; AMD's GPU Operator: <config>-metrics-exporter in kube-amd-gpu). An
# empty namespace: a scrape config that sets none (then the job, which only the scrape config
# names, is what holds).
DEFAULT_JOBS = "gpu-exporter|nvidia-dcgm-exporter|dcgm-exporter|.*metrics-exporter"
DEFAULT_NAMESPACES = "gpu-exporter|gpu-operator|nvidia-gpu-operator|kube-amd-gpu|"


def check_regex(flag: str, value: str) -> str:
    """``value`` if it can be a PromQL regex matcher value (RE2, sent backquoted); else ValueError."""
    if "`" in value or not value.isprintable():
        raise ValueError(f"{flag} {value!r}: a regular expression without backquotes or control characters")
    try:
        re.compile(value)
    except re.error as exc:
        raise ValueError(f"{flag} {value!r}: not a regular expression ({exc})") from None
    return value


@dataclass(frozen=True)
class Trust:
    """The series whose target-set node label is believed: those of these scrape jobs and
    namespaces (fully anchored regular expressions, as PromQL matches them)."""

    job: str = DEFAULT_JOBS
    namespace: str = DEFAULT_NAMESPACES

    def __post_init__(self) -> None:
        check_regex("--source-job", self.job)
        check_regex("--source-namespace", self.namespace)

    def matchers(self) -> str:
        """PromQL matchers selecting only the trusted series."""
        return f"job=~`{self.job}`, namespace=~`{self.namespace}`"

    def admits(self, labels: dict[str, str]) -> bool:
        """Whether a raw series (all its labels) is of the trusted jobs and namespaces, as
        :meth:`matchers` selects (fully anchored; a missing label is the empty string)."""
        return (re.fullmatch(self.job, labels.get("job", "")) is not None
                and re.fullmatch(self.namespace, labels.get("namespace", "")) is not None)


@dataclass(frozen=True)
class Source:
    """The names one exporter gives to what the profiler reads (see the module docstring)."""

    name: str
    util: str  # utilisation gauge
    util_scale: float  # to a ratio 0-1
    mem_used: str
    mem_free: str  # "" where the exporter has none
    mem_total: str  # "": total = used + free
    mem_scale: float  # to bytes
    node_labels: tuple[str, ...]  # the scrape's label first, then the target's: the first non-empty names the node
    gpu_labels: tuple[str, ...]
    uuid_labels: tuple[str, ...]  # the first non-empty one identifies the GPU (falls back to node/gpu)
    sm: str = ""  # whole-GPU SM activity ratio, where the exporter publishes one
    sm_whole: str = ""  # matcher keeping whole GPUs only (MIG instances have their own series)
    any_prefix: bool = False  # the exporter may prefix every name (AMD's MetricsFieldPrefix)
    # a node is this source's only by its utilisation series (another form shares its memory names)
    present_by_util: bool = False
    health: Health = field(default_factory=Health)
    trust: Trust = field(default_factory=Trust)

    @property
    def scrape_label(self) -> str:
        """The node label the scrape sets (``--node-label``): always first, always believed."""
        return self.node_labels[0]

    def node_matcher(self, label: str, nodes: str | None = None) -> str:
        """The matchers selecting series whose node is named by ``label`` (``nodes``: a regex of
        node names; None: any): the scrape's label as is; a target's label only on series
        without the scrape's one, from the trusted jobs and namespaces."""
        # never only the regex: one that matches "" (``.*``) would select, under the scrape's
        # label, the series that lack it, whose node the target names; ``!=""`` says so whatever
        # the regex (the trust boundary does not rest on how shards are named)
        value = f'=~{nodes}, {label}!=""' if nodes else '!=""'
        if label == self.scrape_label:
            return f"{label}{value}"
        return f'{label}{value}, {self.scrape_label}="", {self.trust.matchers()}'

    def believed(self, labels: dict[str, str]) -> bool:
        """Whether a raw series' node may be read from it: the scrape set its node label, or it
        comes from the trusted jobs and namespaces (the rule :meth:`node_matcher` puts in the
        aggregates; the range queries select by UUID, which any pod can copy, and are checked
        here instead, where a PromQL ``node!=""`` would cost the store a scan of every node)."""
        return bool(labels.get(self.scrape_label)) or self.trust.admits(labels)

    def selector(self, metric: str, matchers: str) -> str:
        """``metric{matchers}``; with ``any_prefix`` the name is matched as a suffix, so
        ``amd_gpu_gfx_activity`` is found as well as ``gpu_gfx_activity``."""
        if self.any_prefix:
            return f'{{__name__=~".*{metric}", {matchers}}}' if matchers else f'{{__name__=~".*{metric}"}}'
        return f"{metric}{{{matchers}}}"

    @property
    def identity(self) -> tuple[str, ...]:
        """Every label that identifies a GPU, kept by the queries' ``max by``."""
        return tuple(dict.fromkeys((*self.node_labels, *self.gpu_labels, *self.uuid_labels)))

    def key(self, labels: dict[str, str]) -> tuple[str, str, str] | None:
        """(node, gpu, uuid) of an answer's series, or None without a node or a GPU index."""
        node = next((labels[n] for n in self.node_labels if labels.get(n)), "")
        gpu = next((labels[n] for n in self.gpu_labels if labels.get(n)), "")
        if not node or not gpu:
            return None
        uuid = next((labels[n] for n in self.uuid_labels if labels.get(n)), "")
        return node, gpu, uuid

    def uuid_label(self, labels: dict[str, str]) -> str:
        """The label that gave this series its UUID ("" when none did)."""
        return next((n for n in self.uuid_labels if labels.get(n)), "")


OURS = "gpu-exporter"
DCGM = "dcgm"
AMD = "amd"
AUTO = "auto"
CHOICES = (AUTO, OURS, DCGM, AMD)


def gpu_exporter(node_label: str = "node", trust: Trust | None = None) -> Source:
    """Our exporter: SI units already; the node label is ``--node-label`` (joined on ``instance``
    with ``gpu_host_info`` where missing, see promql.py: only a trusted ``gpu_host_info``)."""
    return Source(
        name=OURS, util="gpu_utilization_ratio", util_scale=1.0, mem_used="gpu_memory_used_bytes",
        mem_free="gpu_memory_free_bytes", mem_total="gpu_memory_total_bytes", mem_scale=1.0,
        node_labels=(node_label,), gpu_labels=("gpu",), uuid_labels=("uuid",),
        sm="gpu_sm_active_ratio", sm_whole='gpu_instance=""',
        health=Health(up="gpu_up", xid_counter="gpu_xid_errors_total", ecc_uncorrectable="gpu_ecc_errors_total",
                      ecc_matcher='error_type="uncorrected"', remap_failed="gpu_remapped_rows_failed",
                      retire_pending="gpu_retired_pages_pending", pcie_width="gpu_pcie_link_width",
                      pcie_width_max="gpu_pcie_link_width_max", state="gpu_health_state"),
        trust=trust or Trust(),
    )


def dcgm(node_label: str = "node", trust: Trust | None = None) -> Source:
    """NVIDIA dcgm-exporter (etc/default-counters.csv): utilisation in percent, framebuffer in
    MiB. The node is the scrape's node label; without it (and only from a trusted job and
    namespace) the exporter's own ``Hostname`` (every release to date), ``hostname`` (main
    renames it, NVIDIA/dcgm-exporter#655) or ``kubernetes_node``."""
    return Source(
        name=DCGM, util="DCGM_FI_DEV_GPU_UTIL", util_scale=0.01, mem_used="DCGM_FI_DEV_FB_USED",
        mem_free="DCGM_FI_DEV_FB_FREE", mem_total="", mem_scale=MIB,
        node_labels=tuple(dict.fromkeys((node_label, "Hostname", "hostname", "kubernetes_node"))),
        gpu_labels=("gpu",), uuid_labels=("UUID",), trust=trust or Trust(),
        sm="DCGM_FI_PROF_SM_ACTIVE", sm_whole='GPU_I_ID=""',
        health=Health(xid_last="DCGM_FI_DEV_XID_ERRORS", ecc_uncorrectable="DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
                      remap_failed="DCGM_FI_DEV_ROW_REMAP_FAILURE", retire_pending="DCGM_FI_DEV_RETIRED_PENDING"),
    )


# --source dcgm reads both forms of dcgm-exporter's names: the legacy fields and DCGM 4.7's renamed ones
DCGM_47 = "dcgm-4.7"


def dcgm_47(node_label: str = "node", trust: Trust | None = None) -> Source:
    """dcgm-exporter with DCGM 4.7's field names (its 4.9.0 default): NVIDIA/DCGM
    dcgmlib/dcgm_fields.h, "Deprecated: renamed per DCGM Field Naming Standard", maps GPU_UTIL to
    GPU_UTIL_RATIO (a 0-1 ratio, dcgm-exporter 4.9.0's release notes), PROF_SM_ACTIVE to
    PROF_SM_UTIL_RATIO, XID_ERRORS to XID_ERROR, ROW_REMAP_FAILURE to ROW_REMAP_FAILED and
    RETIRED_PENDING to PAGE_RETIRED_PENDING; the framebuffer fields keep their names (MiB)."""
    return replace(dcgm(node_label, trust), name=DCGM_47, util="DCGM_FI_DEV_GPU_UTIL_RATIO", util_scale=1.0,
                   sm="DCGM_FI_PROF_SM_UTIL_RATIO", present_by_util=True,
                   health=Health(xid_last="DCGM_FI_DEV_XID_ERROR", ecc_uncorrectable="DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
                                 remap_failed="DCGM_FI_DEV_ROW_REMAP_FAILED",
                                 retire_pending="DCGM_FI_DEV_PAGE_RETIRED_PENDING"))


def expand(name: str) -> tuple[str, ...]:
    """The sources one --source name reads (dcgm: both forms of its names; the renamed form first,
    since only its utilisation name tells the two apart)."""
    return (DCGM_47, DCGM) if name == DCGM else (name,)


def amd(node_label: str = "node", trust: Trust | None = None) -> Source:
    """ROCm device-metrics-exporter (pkg/amdgpu/gpuagent/gpuagent_gpu_metrics.go): graphics
    activity in percent, VRAM in "MB" that are MiB, any configured name prefix. The node is the
    scrape's node label; without it (and only from a trusted job and namespace) the exporter's
    own ``hostname`` (a mandatory label) or ``kubernetes_node``; the GPU is ``gpu_id``;
    ``gpu_uuid`` is opt-in, so the mandatory ``serial_number`` identifies a GPU without it."""
    return Source(
        name=AMD, util="gpu_gfx_activity", util_scale=0.01, mem_used="gpu_used_vram", mem_free="gpu_free_vram",
        mem_total="gpu_total_vram", mem_scale=MIB,
        node_labels=tuple(dict.fromkeys((node_label, "hostname", "kubernetes_node"))),
        gpu_labels=("gpu_id",), uuid_labels=("gpu_uuid", "serial_number"), any_prefix=True, trust=trust or Trust(),
        health=Health(ecc_uncorrectable="gpu_ecc_uncorrect_total"),
    )


def make(name: str, node_label: str = "node", trust: Trust | None = None) -> Source:
    return {OURS: gpu_exporter, DCGM: dcgm, DCGM_47: dcgm_47, AMD: amd}[name](node_label, trust)
