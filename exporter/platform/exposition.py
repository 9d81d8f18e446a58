"""The one ``/metrics`` writer of every daemon: exposition primitives, families written from their
schema rows, and the answer's negotiation (Prometheus text 0.0.4 or OpenMetrics 1.0, gzip or not).

``serve`` renders its snapshot with these primitives (exporter/serve/render.py); the profiler
writes its own families, whose rows are ``schema.PROFILER_FAMILIES``, with :func:`write_metrics`.
Values held in ``prometheus_client`` objects are read through ``collect()`` and written here: the
row gives the name, type, help and unit, and ``*_created`` samples (client_python's creation
times, which no dashboard reads and which double a counter's series) are never written.
"""

from __future__ import annotations

import gzip
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from exporter.core.schema import COUNTER, GAUGE, Family

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

HISTOGRAM = "histogram"
TEXT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"
VARY = {"Vary": "Accept, Accept-Encoding"}  # caches must key on what the answer depends on


def esc(v: str) -> str:
    """Escape a label value (both formats): backslash, double quote, newline."""
    if "\\" in v or '"' in v or "\n" in v:
        v = v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return v


def _esc_help(v: str, om: bool) -> str:
    v = v.replace("\\", "\\\\").replace("\n", "\\n")
    return v.replace('"', '\\"') if om else v


def num(v: float) -> str:
    """Go-compatible float text; integral values without a fraction (``85520809984``)."""
    v = float(v)
    if v.is_integer():  # the common case first (counts, flags, bytes); NaN and the infinities are not
        return str(int(v)) if -1e15 < v < 1e15 else repr(v)
    if v - v == 0.0:  # finite (an infinity or NaN minus itself is NaN): the next most common case
        return repr(v)
    return "NaN" if v != v else "+Inf" if v > 0 else "-Inf"


def labelstr(labels: Mapping[str, str]) -> str:
    return ",".join(f'{k}="{esc(str(v))}"' for k, v in labels.items())


def header(name: str, kind: str, help_: str, unit: str, om: bool) -> str:
    """``# HELP``/``# TYPE`` (and OpenMetrics' ``# UNIT``) lines of a family."""
    if om and kind == COUNTER and name.endswith("_total"):
        name = name[: -len("_total")]  # OpenMetrics names the counter family without _total
    head = f"# HELP {name} {_esc_help(help_, om)}\n# TYPE {name} {kind}\n"
    om_unit = unit.replace(" ", "_")
    if om and unit != "1" and name.endswith("_" + om_unit):  # OpenMetrics: the unit is the name's suffix
        head += f"# UNIT {name} {om_unit}\n"
    return head


def metric_body(m: Metric) -> str:
    """The sample lines of a ``prometheus_client`` Metric, without ``*_created`` samples."""
    return "".join(f"{s.name}{{{labelstr(s.labels)}}} {num(float(s.value))}\n" if s.labels
                   else f"{s.name} {num(float(s.value))}\n" for s in m.samples if not s.name.endswith("_created"))


def row_name(m: Metric) -> str:
    """The schema row's name of a ``prometheus_client`` Metric (a counter's ends in ``_total``)."""
    return m.name + "_total" if m.type == COUNTER and not m.name.endswith("_total") else m.name


def metric_text(m: Metric, row: Family | None, om: bool) -> str:
    """A ``prometheus_client`` Metric in one format, typed and documented by its schema ``row``
    (a metric without a row, a plugin's, keeps its own help; info is a gauge of 1s, other types untyped)."""
    body = metric_body(m)
    if not body:
        return ""
    if row is not None:
        return header(row.name, row.kind, row.help, row.unit, om) + body
    kind = m.type if m.type in (GAUGE, COUNTER, HISTOGRAM) else GAUGE if m.type == "info" else "untyped"
    return header(row_name(m), kind, m.documentation, "1", om) + body


def write_metrics(metrics: Iterable[Metric], rows: Mapping[str, Family], om: bool) -> bytes:
    """A whole exposition of ``metrics``, each written from its row in ``rows`` (by name); OpenMetrics ends in EOF."""
    parts = [metric_text(m, rows[row_name(m)], om) for m in metrics]
    if om:
        parts.append("# EOF\n")
    return utf8("".join(parts))


_SURROGATE = re.compile("[\ud800-\udfff]")


def utf8(text: str) -> bytes:
    """``text`` as valid UTF-8, whatever a vendor library or CLI handed us: a lone surrogate (an
    undecodable byte passed on as a surrogate escape, ``\\udcff`` in rocm-smi's JSON) becomes
    U+FFFD, so one bad string never fails a scrape. Every exposition goes through here, so no
    backend needs to clean its strings; the check costs nothing unless one is there."""
    try:
        return text.encode()
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text).encode()


def encode(raw: bytes, gz: bool) -> bytes:
    return gzip.compress(raw, compresslevel=5) if gz else raw


def answer_headers(om: bool, gz: bool) -> tuple[str, dict[str, str]]:
    """The content type and headers of a metrics answer in the negotiated format and encoding."""
    return (OPENMETRICS_TYPE if om else TEXT_TYPE), ({**VARY, "Content-Encoding": "gzip"} if gz else dict(VARY))
