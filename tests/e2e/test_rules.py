"""Prometheus rules and Alertmanager routing (issue 7, "Rules").

* ``promtool check rules`` and ``promtool test rules`` on ``dashboards/rules/`` (the unit tests
  live in ``dashboards/rules/tests/``), and a check that those unit tests cover every alert
  with a firing case and a quiet case;
* the conventions every alert must follow (severity, summary, description quoting the value,
  runbook_url pointing at an existing section of ``docs/alerts.md``);
* ``deploy/base/prometheusrule.yaml`` carries exactly the groups of the rule files (one source
  of truth; regenerate it with ``python -m tests.e2e.test_rules --write``);
* ``amtool check-config`` on ``deploy/alertmanager/alertmanager.yaml`` and, with
  ``amtool config routes test``, where each alert of the rule files is routed.

The rules against a real exporter and a real Prometheus: tests/e2e/test_dashboards.py.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.harness.prom import promtool

ROOT = Path(__file__).resolve().parents[2]
RULES_DIR = ROOT / "dashboards" / "rules"
RULE_FILES = sorted(RULES_DIR.glob("*.yaml"))
# compat-*.yaml (other exporters' names, docs/migration.md) are opt-in: not in the PrometheusRule.
SHIPPED_RULE_FILES = [p for p in RULE_FILES if not p.name.startswith("compat-")]
UNIT_TESTS = sorted((RULES_DIR / "tests").glob("*.yaml"))
PROMETHEUSRULE = ROOT / "deploy" / "base" / "prometheusrule.yaml"
KUSTOMIZATION = ROOT / "deploy" / "base" / "kustomization.yaml"
ALERTMANAGER = ROOT / "deploy" / "alertmanager" / "alertmanager.yaml"
ALERTS_DOC = ROOT / "docs" / "alerts.md"

RUNBOOK_BASE = "https://github.com/gpu-exporter/gpu-exporter/blob/main/docs/alerts.md#"
SEVERITIES = ("critical", "warning", "info")
AMTOOL_HINT = ("amtool not found: install the Debian package 'prometheus-alertmanager' (make test does), "
               "or set AMTOOL")

PROMETHEUSRULE_HEADER = """\
# GENERATED from dashboards/rules/*.yaml (not compat-*.yaml) by `python -m tests.e2e.test_rules --write`; do not edit.
# tests/e2e/test_rules.py fails when this file and the rule files disagree.
# prometheus-operator loads it if the Prometheus' ruleSelector matches its labels:
# kube-prometheus-stack selects `release: <helm release>` unless
# prometheus.prometheusSpec.ruleSelectorNilUsesHelmValues is false (docs/alerts.md).
"""


# ---- the rule files -----------------------------------------------------------------------------


def _load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def rule_groups(files: list[Path] = RULE_FILES) -> list[dict[str, Any]]:
    """Every group of every rule file (or of ``files``), in file order."""
    groups: list[dict[str, Any]] = []
    for path in files:
        groups.extend(_load(path)["groups"])
    return groups


def alerts() -> list[dict[str, Any]]:
    return [r for g in rule_groups() for r in g["rules"] if "alert" in r]


def test_rule_files_exist() -> None:
    names = {p.name for p in RULE_FILES}
    assert {"gpu-exporter-recording.yaml", "gpu-exporter-alerts.yaml"} <= names, names
    assert UNIT_TESTS, "no promtool unit tests in dashboards/rules/tests/"


def test_promtool_check_rules() -> None:
    proc = promtool("check", "rules", *map(str, RULE_FILES))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = sum(int(n) for n in re.findall(r"SUCCESS: (\d+) rules found", proc.stdout))
    assert found == sum(len(g["rules"]) for g in rule_groups()), proc.stdout


def test_promtool_check_rules_rejects_a_broken_rule(tmp_path: Path) -> None:
    """Guards the test above: promtool runs, fails on the bad expression and says why, where; the
    same file with the expression completed passes."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("groups:\n  - name: x\n    rules:\n      - alert: X\n        expr: gpu_up ==\n")
    proc = promtool("check", "rules", str(bad))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "FAILED" in out and "SUCCESS" not in out, out
    assert re.search(rf'{re.escape(str(bad))}: 5:\d+: group "x", rule 1, "X": could not parse expression: '
                     r".*parse error", out), out
    good = tmp_path / "good.yaml"
    good.write_text(bad.read_text().replace("gpu_up ==", "gpu_up == 0"))
    proc = promtool("check", "rules", str(good))
    assert proc.returncode == 0 and "SUCCESS: 1 rules found" in proc.stdout, proc.stdout + proc.stderr


def test_promtool_unit_tests_pass() -> None:
    proc = promtool("test", "rules", *map(str, UNIT_TESTS), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("SUCCESS") == len(UNIT_TESTS), proc.stdout


def _unit_test_cases() -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = []
    for path in UNIT_TESTS:
        doc = _load(path)
        rule_files = {(path.parent / f).resolve() for f in doc["rule_files"]}
        ours = {p.resolve() for p in RULE_FILES}
        assert rule_files <= ours, f"{path.name} tests a file outside dashboards/rules/"
        for test in doc["tests"]:
            cases.extend(test.get("alert_rule_test", []))
    return cases


def test_every_alert_has_a_firing_and_a_quiet_unit_test() -> None:
    cases = _unit_test_cases()
    firing = {c["alertname"] for c in cases if c.get("exp_alerts")}
    quiet = {c["alertname"] for c in cases if not c.get("exp_alerts")}
    names = [a["alert"] for a in alerts()]
    assert len(names) == len(set(names)), "alert names must be unique"
    missing_firing = sorted(set(names) - firing)
    missing_quiet = sorted(set(names) - quiet)
    assert not missing_firing, f"alerts without a firing case in dashboards/rules/tests/: {missing_firing}"
    assert not missing_quiet, f"alerts without a quiet case in dashboards/rules/tests/: {missing_quiet}"
    unknown = sorted((firing | quiet) - set(names))
    assert not unknown, f"unit tests name alerts that no rule file defines: {unknown}"


def test_every_recording_rule_has_a_unit_test() -> None:
    exprs = " ".join(
        str(t["expr"])
        for path in UNIT_TESTS
        for test in _load(path)["tests"]
        for t in test.get("promql_expr_test", [])
    )
    records = [r["record"] for g in rule_groups() for r in g["rules"] if "record" in r]
    assert records
    untested = [r for r in records if r not in exprs]
    assert not untested, f"recording rules without a promql_expr_test: {untested}"


# ---- alert conventions ---------------------------------------------------------------------------


def _anchor(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def doc_anchors() -> dict[str, str]:
    """Anchor -> section text of docs/alerts.md (## and ### headings)."""
    sections: dict[str, str] = {}
    current = None
    for line in ALERTS_DOC.read_text().splitlines():
        m = re.match(r"#{2,3} (.+)", line)
        if m:
            current = _anchor(m.group(1))
            sections[current] = ""
        elif current is not None:
            sections[current] += line + "\n"
    return sections


@pytest.mark.parametrize("rule", alerts(), ids=lambda r: r["alert"])
def test_alert_conventions(rule: dict[str, Any]) -> None:
    name = rule["alert"]
    # GPUExporterAbsent keeps the spelling issue 19 gave it.
    assert re.fullmatch(r"G(pu|PU)[A-Z][A-Za-z]+", name), f"{name}: alert names are CamelCase starting with Gpu"
    severity = rule.get("labels", {}).get("severity")
    assert severity in SEVERITIES, f"{name}: severity {severity!r} is not one of {SEVERITIES}"
    ann = rule.get("annotations", {})
    assert set(ann) == {"summary", "description", "runbook_url"}, f"{name}: annotations {sorted(ann)}"
    assert "{{ $value" in ann["description"], f"{name}: the description must quote the value"
    assert "$labels." in ann["description"], f"{name}: the description must name the affected target"
    assert "\n" not in ann["summary"], f"{name}: one-line summary"
    # Counters are alerted on by their increase, never by their value.
    for counter in re.findall(r"\b(gpu_\w+_total)\b", str(rule["expr"])):
        used_right = re.search(rf"(increase|rate)\(\s*{counter}", str(rule["expr"]))
        assert used_right, f"{name}: {counter} without increase()"


@pytest.mark.parametrize("rule", alerts(), ids=lambda r: r["alert"])
def test_runbook_section_exists(rule: dict[str, Any]) -> None:
    url = rule["annotations"]["runbook_url"]
    assert url.startswith(RUNBOOK_BASE), f"{rule['alert']}: runbook_url must start with {RUNBOOK_BASE}"
    anchor = url[len(RUNBOOK_BASE):]
    assert anchor == rule["alert"].lower(), f"{rule['alert']}: the anchor is the lower-cased alert name"
    sections = doc_anchors()
    assert anchor in sections, f"docs/alerts.md has no section '## {rule['alert']}'"
    body = sections[anchor]
    for word in ("Meaning", "Impact", "Diagnosis", "Mitigation"):
        assert f"**{word}.**" in body, f"docs/alerts.md#{anchor}: missing **{word}.**"
    assert rule["labels"]["severity"] in body, f"docs/alerts.md#{anchor} does not state the severity"


def test_docs_list_no_unknown_alert() -> None:
    names = {a["alert"].lower() for a in alerts()}
    documented = {a for a in doc_anchors() if a.startswith("gpu")}
    assert documented <= names, f"docs/alerts.md documents unknown alerts: {sorted(documented - names)}"


# ---- the PrometheusRule --------------------------------------------------------------------------


def prometheusrule() -> dict[str, Any]:
    """The PrometheusRule object generated from the rule files."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "gpu-exporter",
            "namespace": "gpu-exporter",
            "labels": {
                "app.kubernetes.io/name": "gpu-exporter",
                "app.kubernetes.io/component": "rules",
                "app.kubernetes.io/part-of": "gpu-exporter",
            },
        },
        "spec": {"groups": rule_groups(SHIPPED_RULE_FILES)},
    }


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings (PromQL) as literal blocks, so the generated file stays readable."""


def _str_representer(dumper: yaml.SafeDumper, s: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", s, style="|" if "\n" in s else None)


_BlockDumper.add_representer(str, _str_representer)


def render_prometheusrule() -> str:
    body = yaml.dump(prometheusrule(), Dumper=_BlockDumper, sort_keys=False, width=1_000_000,
                     allow_unicode=True)
    return PROMETHEUSRULE_HEADER + body


def test_prometheusrule_carries_the_rule_files() -> None:
    assert PROMETHEUSRULE.exists(), f"{PROMETHEUSRULE} is missing: python -m tests.e2e.test_rules --write"
    committed = _load(PROMETHEUSRULE)
    assert committed == prometheusrule(), (
        "deploy/base/prometheusrule.yaml differs from dashboards/rules/*.yaml: regenerate it with "
        "`python -m tests.e2e.test_rules --write`"
    )
    assert PROMETHEUSRULE.read_text() == render_prometheusrule(), "python -m tests.e2e.test_rules --write"
    resources = _load(KUSTOMIZATION)["resources"]
    assert PROMETHEUSRULE.name in resources, "list prometheusrule.yaml in deploy/base/kustomization.yaml"


def test_prometheusrule_rules_pass_promtool(tmp_path: Path) -> None:
    """The groups as prometheus-operator hands them to Prometheus still load."""
    spec = _load(PROMETHEUSRULE)["spec"]
    out = tmp_path / "from-prometheusrule.yaml"
    out.write_text(yaml.safe_dump({"groups": spec["groups"]}))
    proc = promtool("check", "rules", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ---- Alertmanager --------------------------------------------------------------------------------


def _amtool() -> str:
    path = os.environ.get("AMTOOL") or shutil.which("amtool")
    if not path:
        pytest.fail(AMTOOL_HINT, pytrace=False)
    return path


def _run_amtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_amtool(), *args], capture_output=True, text=True, timeout=60, check=False)


def test_amtool_check_config() -> None:
    proc = _run_amtool("check-config", str(ALERTMANAGER))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_amtool_rejects_a_broken_config(tmp_path: Path) -> None:
    """Guards the test above: amtool runs and fails on a route to an undefined receiver."""
    bad = tmp_path / "alertmanager.yaml"
    bad.write_text("route:\n  receiver: nowhere\nreceivers:\n  - name: somewhere\n")
    assert _run_amtool("check-config", str(bad)).returncode != 0


# Alerts about a workload's use of a GPU go to its owners, whatever their severity.
WORKLOAD_ALERTS = {"GPUAllocatedButIdle", "GPUAllocatedIdlePattern"}


def _expected_receiver(rule: dict[str, Any]) -> str:
    if rule["alert"] in WORKLOAD_ALERTS:
        return "workload-owners"
    return {"critical": "gpu-oncall-pager", "warning": "gpu-team-chat", "info": "gpu-team-queue"}[
        rule["labels"]["severity"]
    ]


def test_every_alert_is_routed_by_its_severity() -> None:
    wrong = []
    for rule in alerts():
        labels = [f"alertname={rule['alert']}", f"severity={rule['labels']['severity']}"]
        proc = _run_amtool("config", "routes", "test", f"--config.file={ALERTMANAGER}", *labels)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        got = proc.stdout.strip()
        if got != _expected_receiver(rule):
            wrong.append(f"{rule['alert']}: {got} (expected {_expected_receiver(rule)})")
    assert not wrong, wrong


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python -m tests.e2e.test_rules --write   (regenerates deploy/base/prometheusrule.yaml)")
    PROMETHEUSRULE.write_text(render_prometheusrule())
    print(f"wrote {PROMETHEUSRULE.relative_to(ROOT)}")


def test_alert_names_use_one_casing() -> None:
    """Issue 28, finding 2: GpuAllocatedButIdle and GPUAllocatedButIdle differed only in case, and a
    route matched one of them. Every alert is GPU… and no two names differ only in case."""
    names = [rule["alert"] for rule in alerts()]
    assert all(re.fullmatch(r"GPU[A-Z][A-Za-z]+", n) for n in names), [n for n in names if not n.startswith("GPU")]
    assert len({n.lower() for n in names}) == len(names), sorted(names)


def _routes(route: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for child in route.get("routes", []) for r in (child, *_routes(child))]


def test_every_route_and_inhibition_names_shipped_alerts() -> None:
    """Each alertname matcher of alertmanager.yaml matches a shipped alert, and every route is the
    receiver of at least one of them (amtool config routes test): a renamed alert leaves no route
    or inhibition behind that nothing reaches any more."""
    config = yaml.safe_load(ALERTMANAGER.read_text())
    names = {rule["alert"] for rule in alerts()}
    matchers = [m for r in _routes(config["route"]) for m in r.get("matchers", [])]
    matchers += [m for rule in config.get("inhibit_rules", [])
                 for m in (*rule.get("source_matchers", []), *rule.get("target_matchers", []))]
    stale = []
    for m in matchers:
        found = re.fullmatch(r'alertname(=~|=)"(.*)"', m)
        if found:
            op, value = found.groups()
            # Each alternative of a regex matcher must still match a shipped alert.
            parts = value.split("|") if op == "=~" else [re.escape(value)]
            if not all(any(re.fullmatch(part, n) for n in names) for part in parts):
                stale.append(m)
    assert not stale, f"matchers that name no shipped alert: {stale}"
    reached = set()
    for rule in alerts():
        labels = [f"alertname={rule['alert']}", f"severity={rule['labels']['severity']}"]
        proc = _run_amtool("config", "routes", "test", f"--config.file={ALERTMANAGER}", *labels)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        reached.add(proc.stdout.strip())
    receivers = {r["receiver"] for r in _routes(config["route"])}
    assert receivers <= reached, f"routes no shipped alert reaches: {sorted(receivers - reached)}"
