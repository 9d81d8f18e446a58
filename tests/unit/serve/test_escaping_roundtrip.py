"""Label escaping, as a property: any string we put in a label comes back exactly from
prometheus_client's parsers, in both formats, and never breaks the line it sits on.

The values go through the real renderer (a GPU's name on ``gpu_info``, a pod's labels from the
label hook on every per-GPU series), not through the escaping function alone.
"""

from __future__ import annotations

import re

from hypothesis import assume, given, settings
from hypothesis import strategies as st
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from exporter.core.options import FieldFilter
from exporter.core.readings import Collection, GpuReading, HostInfo
from exporter.core.snapshot import BackendStats, Snapshot
from exporter.serve.render import render

# any text that UTF-8 can carry (a lone surrogate cannot be encoded at all)
ANY = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
# the characters the formats give a meaning to, so that every combination of them turns up
SPECIAL = st.lists(st.sampled_from(["\\", '"', "\n", "n", "\\n", "\r", "#", "{", "}", "=", ",", " ", "☃"]),
                   max_size=12).map("".join)
VALUES = ANY | SPECIAL


def _snapshot(name: str, pod: str) -> Snapshot:
    gpu = GpuReading(index=0, uuid="GPU-0", vendor="nvidia", name=name, power_watts=42.0)
    return Snapshot([Collection("nvml", [gpu])], HostInfo("node-a", "cpu", "6.1"),
                    {"nvml": BackendStats(success=True, gpus=1)}, created=0.0,
                    gpu_labels=lambda r: {"pod": pod, "namespace": "ns", "container": "c"})


def _labels(families: object, metric: str) -> list[dict[str, str]]:
    return [dict(s.labels) for fam in families for s in fam.samples  # type: ignore[attr-defined]
            if s.name == metric]


@settings(max_examples=300, deadline=None)
@given(name=VALUES, pod=VALUES)
def test_any_label_value_round_trips_through_both_parsers(name: str, pod: str) -> None:
    snap = _snapshot(name, pod)
    fields = FieldFilter()
    text = render(snap, fields).decode()
    om = render(snap, fields, openmetrics=True).decode()
    for fmt, families in (("text", list(parse_text(text))), ("OpenMetrics", list(parse_openmetrics(om)))):
        info = _labels(families, "gpu_info")
        assert [d["name"] for d in info] == [name], fmt
        power = _labels(families, "gpu_power_watts")
        assert len(power) == 1 and power[0]["pod"] == pod, fmt
    # one sample per line: no value starts a line of its own
    for body in (text, om):
        samples = [ln for ln in body.splitlines() if ln.startswith("gpu_power_watts")]
        assert len(samples) == 1, samples


@settings(max_examples=100, deadline=None)
@given(doc=VALUES, value=VALUES)
def test_any_help_text_and_plugin_label_round_trip(doc: str, value: str) -> None:
    """A plugin family's HELP text (escaped per format: OpenMetrics also escapes the quote) and
    its label values come back exactly, and the family stays one family."""
    from prometheus_client.core import GaugeMetricFamily

    assume(doc == doc.strip())  # prometheus_client's text parser trims the HELP text's outer whitespace
    fam = GaugeMetricFamily("plugin_thing", doc, labels=["k"])
    fam.add_metric([value], 1.0)
    snap = _snapshot("n", "p")
    snap.extra_families.append(fam)
    fields = FieldFilter()
    for fmt, parse, om in (("text", parse_text, False), ("OpenMetrics", parse_openmetrics, True)):
        body = render(snap, fields, openmetrics=om).decode()
        got = [f for f in parse(body) if f.name == "plugin_thing"]
        assert len(got) == 1, fmt
        assert got[0].documentation == doc, fmt
        assert [s.labels["k"] for s in got[0].samples] == [value], fmt
        helps = [ln for ln in body.splitlines() if ln.startswith("# HELP plugin_thing ")]
        assert len(helps) == 1, fmt
        if om:  # OpenMetrics' escaped-string: every backslash, quote and newline escaped (the parser is lenient)
            assert re.fullmatch(r'(\\[\\"n]|[^\\"\n])*', helps[0][len("# HELP plugin_thing "):]), helps[0]
