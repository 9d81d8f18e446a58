"""Self-tests of the Grafana resolver (tests/harness/grafana.py) on the parts that need no Prometheus:
regex options, sorting, selection, escaping and interpolation as Grafana's Prometheus data source does."""

from __future__ import annotations

from typing import Any

import pytest

from tests.harness.grafana import ALL, Grafana, apply_regex, regex_escape, regular_escape, selectors, sort_options


def dash(*variables: dict[str, Any]) -> dict[str, Any]:
    return {"templating": {"list": list(variables)}, "panels": []}


def custom(name: str, query: str, **kw: Any) -> dict[str, Any]:
    return {"name": name, "type": "custom", "query": query, **kw}


def test_query_result_regex_with_named_groups_and_global_flag() -> None:
    """nvidia_gpu_exporter's $gpu: the text from gpu_label, the value from uuid, in one /g regex."""
    texts = ['nvidia_smi_gpu_info{gpu_label="NVIDIA H100 #0 (aaaa1111)",index="0",uuid="aaaa1111-22"} 1 1700000000000']
    assert apply_regex(texts, '/gpu_label="(?<text>[^"]+)|uuid="(?<value>[^"]+)/g') == [
        ("NVIDIA H100 #0 (aaaa1111)", "aaaa1111-22")]


def test_regex_first_group_bare_and_no_match() -> None:
    assert apply_regex(["host-a:9400", "other"], "/(.*):9400/") == [("host-a", "host-a")]
    assert apply_regex(["ab", "abc"], "ab") == [("ab", "ab")]  # a bare regex is anchored
    assert apply_regex(["a1 a2"], "/a(\\d)/g") == [("1", "1"), ("2", "2")]


def test_sort_orders() -> None:
    opts = [("gpu10", "10"), ("gpu2", "2"), ("GPU1", "1")]
    assert [v for _, v in sort_options(opts, 1)] == ["1", "10", "2"]
    assert [v for _, v in sort_options(opts, 3)] == ["1", "2", "10"]
    assert [v for _, v in sort_options(opts, 4)] == ["10", "2", "1"]
    assert [v for _, v in sort_options(opts, 7)] == ["1", "2", "10"]
    assert sort_options(opts, 0) == opts


def test_escaping() -> None:
    assert regex_escape("a.b(c)|d") == "a\\\\.b\\\\(c\\\\)\\\\|d"
    assert regular_escape("it's") == "it\\\\'s"


def test_all_without_and_with_all_value() -> None:
    g = Grafana(None, dash(custom("a", "x.1,y"), custom("b", "p,q", includeAll=True, multi=True),  # type: ignore[arg-type]
                           custom("c", "p,q", includeAll=True, allValue=".*")))
    assert g.variables["a"].values() == ["x.1"] and g.interpolate('{a="$a"}') == '{a="x.1"}'  # plain: not regex-escaped
    assert g.variables["b"].selected == ALL
    assert g.interpolate('{b=~"$b"}') == '{b=~"(p|q)"}'
    assert g.interpolate('{c=~"${c}"}') == '{c=~".*"}'  # allValue verbatim
    assert g.interpolate("[[b]] ${b:pipe} ${b:csv}") == "(p|q) p|q p,q"
    assert g.interpolate('label_replace(x, "l", "$1", "m", "(.*)")') == 'label_replace(x, "l", "$1", "m", "(.*)")'


def test_selection_default_all_and_pinned() -> None:
    d = dash(custom("m", "a,b,c", multi=True, current={"value": ["b"]}), custom("s", "k : 1,l : 2"))
    g = Grafana(None, d)  # type: ignore[arg-type]
    assert g.variables["m"].values() == ["b"] and g.variables["s"].values() == ["1"]
    g = Grafana(None, d, choose="all")  # type: ignore[arg-type]
    assert g.variables["m"].values() == ["a", "b", "c"] and g.interpolate("$m") == "(a|b|c)"
    assert g.variables["s"].values() == ["2"]
    g = Grafana(None, d, choose={"m": ["a", "c"]})  # type: ignore[arg-type]
    assert g.interpolate("$m") == "(a|c)"
    with pytest.raises(AssertionError):
        Grafana(None, d, choose={"m": "z"})  # type: ignore[arg-type]


def test_builtins_follow_the_range_and_scrape_interval() -> None:
    g = Grafana(None, dash(), range_s=3600, scrape_interval_s=15, max_data_points=1000)  # type: ignore[arg-type]
    assert g.interpolate("[$__interval] [$__rate_interval] $__range") == "[15s] [60s] 3600s"
    g = Grafana(None, dash(), range_s=86400, scrape_interval_s=15, max_data_points=100)  # type: ignore[arg-type]
    assert g.interpolate("$__interval $__rate_interval") == "900s 915s"  # 864 s rounds to 15m


def test_unsupported_variable_type_fails_loudly() -> None:
    with pytest.raises(ValueError, match="not supported"):
        Grafana(None, dash({"name": "x", "type": "snapshot", "query": ""}))  # type: ignore[arg-type]


def test_selectors_skip_functions_keywords_and_label_lists() -> None:
    assert selectors("sum without (gpu) (rate(a[5m])) > bool on (x) group_right (y) b{c='1'}") == ["a", "b{c='1'}"]
