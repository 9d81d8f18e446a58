"""Grafana's side of a dashboard, for tests: template variables and panel queries, as Grafana
resolves them against a Prometheus data source, run against the suite's real Prometheus.

What Grafana does, and this module repeats (Grafana's Prometheus data source,
``metric_find_query.ts``, ``datasource.ts``; ``templateSrv``; the variable ``regex`` and
``sort`` options):

* Variables are resolved in dashboard order, each query interpolated with the variables
  before it. Query variables: ``label_values(label)``, ``label_values(selector, label)``,
  ``label_names()``, ``metrics(regex)``, ``query_result(expr)`` (each result as the text
  ``name{k="v",...} value timestamp_ms``) and, for anything else, a series query.
  ``custom`` (``a,b`` or ``text : value``), ``constant``, ``textbox`` and ``interval``
  variables take their options from their query; ``datasource`` and ``adhoc`` variables do
  not take part in a query's text (only ``$datasource`` / ``${DS_...}`` in data-source
  fields). A variable that refreshes never (``refresh: 0``) keeps its saved options.
* ``regex``: a JavaScript regex (``/.../flags``; a bare string is ``^...$``) applied to each
  option text; named groups ``text`` and ``value`` pick the option's text and value, else
  the first group; with the ``g`` flag every match of the first group is an option. Options
  are de-duplicated by value and sorted by ``sort`` (1/2 alphabetical, 3/4 numerical, 5/6
  case-insensitive, 7/8 natural).
* Selection: the saved ``current`` when it is among the options, else the first option
  ("All" when ``includeAll``). "All" is the ``allValue`` verbatim when set, else every
  option.
* Interpolation into PromQL (``$v``, ``${v}``, ``${v:format}``, ``[[v]]``): a variable that
  is neither multi-value nor includeAll is escaped for a string (``\\`` and ``'``); otherwise
  each value is regex-escaped and several values become ``(a|b)``. Built-ins:
  ``$__interval``, ``$__interval_ms``, ``$__rate_interval`` (max(interval + scrape interval,
  4 x scrape interval)), ``$__range``, ``$__range_s``, ``$__range_ms``, ``$__from``, ``$__to``.
* A target runs as an instant query when ``instant`` is set and ``range`` is not; otherwise
  as a range query over the dashboard's time range at the panel's interval. Hidden targets
  (``hide: true``) do not run.

Not covered (raises, so a dashboard that needs it fails loudly instead of passing blind):
other data sources (mixed panels, expressions, annotations are not panels), chained
``${var.field}`` access, formats other than those in :data:`FORMATS`.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tests.harness.prom import Prometheus

ALL = "$__all"
# templateSrv's variable reference: $name, [[name:fmt]], ${name.field:fmt}
_REF = re.compile(r"\$(\w+)|\[\[(\w+?)(?::(\w+))?\]\]|\$\{(\w+)(?:\.([^:^}]+))?(?::([^}]+))?\}")
_LABEL_VALUES = re.compile(r"^label_values\((?:(.+),\s*)?([a-zA-Z_$][a-zA-Z0-9_]*)\)\s*$", re.S)
_LABEL_NAMES = re.compile(r"^label_names\((.*)\)\s*$", re.S)
_METRICS = re.compile(r"^metrics\((.+)\)\s*$", re.S)
_QUERY_RESULT = re.compile(r"^query_result\((.+)\)\s*$", re.S)
_BUILTIN_PREFIX = "__"


def walk_panels(panels: Sequence[Mapping[str, Any]]) -> Iterator[Mapping[str, Any]]:
    """Every panel, rows' nested panels included; rows themselves are not panels."""
    for p in panels:
        if p.get("type") != "row":
            yield p
        yield from walk_panels(p.get("panels", []))


def panels(dash: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list(walk_panels(dash.get("panels", [])))


def targets(panel: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The panel's Prometheus targets that run (hidden ones do not)."""
    return [t for t in panel.get("targets", []) if not t.get("hide") and t.get("expr")]


# --- escaping and formats (Grafana's Prometheus data source) ------------------------------------

def regular_escape(v: str) -> str:
    """prometheusRegularEscape: a value inside a PromQL string."""
    return v.replace("\\", "\\\\").replace("'", "\\\\'")


def regex_escape(v: str) -> str:
    """prometheusSpecialRegexEscape: a value inside a PromQL regex string."""
    return re.sub(r"[$^*{}\[\]'+?.()|]", lambda m: "\\\\" + m.group(0), v.replace("\\", "\\\\\\\\"))


def _fmt_regex(vals: list[str]) -> str:
    return vals[0] if len(vals) == 1 else "(" + "|".join(re.escape(v) for v in vals) + ")"


FORMATS = {
    "raw": lambda vals: ",".join(vals),
    "csv": lambda vals: ",".join(vals),
    "pipe": lambda vals: "|".join(vals),
    "regex": _fmt_regex,
    "text": lambda vals: " + ".join(vals),
    "json": lambda vals: json.dumps(vals if len(vals) != 1 else vals[0]),
    "singlequote": lambda vals: ",".join("'" + v.replace("'", "\\'") + "'" for v in vals),
    "doublequote": lambda vals: ",".join('"' + v.replace('"', '\\"') + '"' for v in vals),
}


# --- JavaScript regexes ----------------------------------------------------------------------------

def js_regex(text: str) -> tuple[re.Pattern[str], bool]:
    """Grafana's stringToJsRegex: ``/body/flags`` or a bare string (anchored). Returns the
    Python pattern and whether the ``g`` flag is set."""
    if not text.startswith("/"):
        return re.compile("^" + text + "$"), False
    end = text.rindex("/")
    body, flags = text[1:end], text[end + 1:]
    py_flags = 0
    for f in flags:
        if f == "i":
            py_flags |= re.I
        elif f == "m":
            py_flags |= re.M
        elif f == "s":
            py_flags |= re.S
        elif f not in "gyu":
            raise ValueError(f"regex flag {f!r} of {text!r} is not supported")
    body = re.sub(r"\(\?<([a-zA-Z_]\w*)>", r"(?P<\1>", body)  # JS named groups
    return re.compile(body, py_flags), "g" in flags


def apply_regex(texts: Sequence[str], regex: str) -> list[tuple[str, str]]:
    """The (text, value) options that ``regex`` makes of ``texts`` (Grafana's
    metricNamesToVariableValues)."""
    if not regex:
        return [(t, t) for t in texts]
    pattern, glob = js_regex(regex)
    out: list[tuple[str, str]] = []
    for item in texts:
        matches = list(pattern.finditer(item)) if glob else [m for m in [pattern.search(item)] if m]
        if not matches:
            continue
        value_m = next((m for m in matches if m.groupdict().get("value")), None)
        text_m = next((m for m in matches if m.groupdict().get("text")), None)
        first = next((m for m in matches if m.re.groups >= 1 and m.group(1) is not None), None)
        if value_m or text_m:
            value = (value_m or text_m).groupdict()["value" if value_m else "text"]  # type: ignore[union-attr]
            text = (text_m or value_m).groupdict()["text" if text_m else "value"]  # type: ignore[union-attr]
            out.append((text, value))
        elif len(matches) > 1 and first:
            out.extend((m.group(1), m.group(1)) for m in matches if m.group(1) is not None)
        elif first:
            out.append((first.group(1), first.group(1)))
        else:
            out.append((item, item))
    return out


def _natural_key(s: str) -> list[Any]:
    return [(0, int(p), "") if p.isdigit() else (1, 0, p.lower()) for p in re.split(r"(\d+)", s) if p]


def _number(s: str) -> float:
    m = re.search(r"-?\d+(?:\.\d+)?", s)
    return float(m.group(0)) if m else -math.inf


def sort_options(opts: list[tuple[str, str]], sort: int | None) -> list[tuple[str, str]]:
    keys: dict[int, Any] = {1: lambda o: o[0], 3: lambda o: _number(o[0]), 5: lambda o: o[0].lower(),
                            7: lambda o: _natural_key(o[0])}
    if not sort:
        return opts
    return sorted(opts, key=keys[sort - 1 if sort % 2 == 0 else sort], reverse=sort % 2 == 0)


# --- the resolver ----------------------------------------------------------------------------------

@dataclass
class Variable:
    name: str
    type: str
    multi: bool
    include_all: bool
    all_value: str | None
    options: list[tuple[str, str]] = field(default_factory=list)  # (text, value), All excluded
    selected: list[str] | str = ""  # ALL, or the selected values

    def values(self) -> list[str]:
        """The values the selection stands for ("All" without allValue: every option)."""
        if self.selected == ALL:
            return [v for _, v in self.options]
        return list(self.selected) if isinstance(self.selected, list) else [self.selected]


@dataclass
class Grafana:
    """One dashboard, resolved against ``prom`` as Grafana would on loading it.

    ``choose``: how each variable is set once its options are known: ``"default"`` (Grafana's
    own choice on load), ``"all"`` ("All" where offered, else every option of a multi-value
    variable, else the last option), or a mapping of variable name to a value or list of
    values. ``range_s``: the dashboard's time range ending now; ``scrape_interval_s``: the
    data source's scrape interval (Grafana's "min interval").
    """

    prom: Prometheus
    dashboard: Mapping[str, Any]
    choose: str | Mapping[str, str | list[str]] = "default"
    range_s: float = 300.0
    scrape_interval_s: float = 1.0
    max_data_points: int = 1000
    now: float = field(default_factory=time.time)
    variables: dict[str, Variable] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for spec in self.dashboard.get("templating", {}).get("list", []):
            var = self._resolve(spec)
            self.variables[var.name] = var

    # -- variables --

    def _query_text(self, spec: Mapping[str, Any]) -> str:
        q = spec.get("query", "")
        if isinstance(q, Mapping):
            q = q.get("query", "")
        return str(q)

    def _resolve(self, spec: Mapping[str, Any]) -> Variable:
        kind = spec.get("type", "query")
        var = Variable(spec["name"], kind, bool(spec.get("multi")), bool(spec.get("includeAll")),
                       spec.get("allValue") or None)
        if kind in ("datasource", "adhoc"):
            return var
        query = self._query_text(spec)
        if kind == "query":
            if spec.get("refresh", 1) == 0 and spec.get("options"):
                opts = [(str(o["text"]), str(o["value"])) for o in spec["options"] if o.get("value") != ALL]
            else:
                texts = self.find_values(self.interpolate(query))
                opts = apply_regex(texts, spec.get("regex") or "")
        elif kind == "custom":
            opts = []
            for part in re.split(r"(?<!\\),", query):
                text, sep, value = part.partition(" : ")
                opts.append((text.strip(), (value if sep else text).strip()))
        elif kind in ("constant", "textbox"):
            opts = [(query, query)]
        elif kind == "interval":
            opts = [(v.strip(), v.strip()) for v in query.split(",") if v.strip()]
        else:
            raise ValueError(f"variable ${var.name}: type {kind!r} is not supported")
        seen: set[str] = set()
        var.options = sort_options([o for o in opts if not (o[1] in seen or seen.add(o[1]))],  # type: ignore[func-returns-value]
                                   spec.get("sort"))
        var.selected = self._select(var, spec)
        return var

    def _select(self, var: Variable, spec: Mapping[str, Any]) -> list[str] | str:
        values = [v for _, v in var.options]
        choose = self.choose
        if isinstance(choose, Mapping) and var.name in choose:
            want = choose[var.name]
            want_list = want if isinstance(want, list) else [want]
            missing = [w for w in want_list if w not in values and w != ALL]
            assert not missing, f"${var.name}: {missing} not among its options {values}"
            return ALL if want == ALL else want_list
        if not values:
            return ALL if var.include_all else []
        if choose == "all":
            if var.include_all:
                return ALL
            return values if var.multi else [values[-1]]
        cur = (spec.get("current") or {}).get("value")
        cur_list = cur if isinstance(cur, list) else [cur] if cur else []
        if cur_list == [ALL] and var.include_all:
            return ALL
        if cur_list and all(c in values for c in cur_list):
            return list(cur_list)
        return ALL if var.include_all else [values[0]]

    def find_values(self, query: str) -> list[str]:
        """A Prometheus variable query's option texts (Grafana's PrometheusMetricFindQuery)."""
        start, end = self.now - self.range_s, self.now
        window = {"start": repr(start), "end": repr(end)}
        if m := _LABEL_NAMES.match(query):
            params = dict(window, **({"match[]": m.group(1)} if m.group(1).strip() else {}))
            return sorted(self.prom._request("/api/v1/labels", params))
        if m := _LABEL_VALUES.match(query):
            selector, label = m.group(1), m.group(2)
            if selector:
                series = self.prom._request("/api/v1/series", dict(window, **{"match[]": selector}))
                return sorted({s[label] for s in series if label in s})
            return sorted(self.prom._request(f"/api/v1/label/{label}/values", window))
        if m := _METRICS.match(query):
            names = self.prom._request("/api/v1/label/__name__/values", window)
            pattern = re.compile(m.group(1))
            return [n for n in names if pattern.search(n)]
        if m := _QUERY_RESULT.match(query):
            out = []
            for r in self.prom.query(m.group(1), time=end):
                metric = dict(r["metric"])
                text = metric.pop("__name__", "")
                text += "{" + ",".join(f'{k}="{v}"' for k, v in metric.items()) + "}"
                out.append(f"{text} {r['value'][1]} {int(float(r['value'][0]) * 1000)}")
            return out
        series = self.prom._request("/api/v1/series", dict(window, **{"match[]": query}))
        out = []
        for s in series:
            s = dict(s)
            name = s.pop("__name__", "")
            out.append(name + "{" + ",".join(f'{k}="{v}"' for k, v in s.items()) + "}")
        return out

    # -- interpolation --

    @property
    def interval_s(self) -> float:
        """$__interval: the time range over the data points rounded as Grafana's roundInterval does,
        at least the scrape interval (the data source's "min interval")."""
        return max(self.scrape_interval_s, round_interval(self.range_s / self.max_data_points))

    def builtins(self) -> dict[str, str]:
        interval = self.interval_s
        rate = max(interval + self.scrape_interval_s, 4 * self.scrape_interval_s)
        return {
            "__interval": f"{interval:g}s", "__interval_ms": f"{int(interval * 1000)}",
            "__rate_interval": f"{rate:g}s", "__rate_interval_ms": f"{int(rate * 1000)}",
            "__range": f"{round(self.range_s)}s", "__range_s": f"{round(self.range_s)}",
            "__range_ms": f"{int(self.range_s * 1000)}",
            "__from": f"{int((self.now - self.range_s) * 1000)}", "__to": f"{int(self.now * 1000)}",
        }

    def interpolate(self, text: str) -> str:
        """``text`` with every variable reference replaced, as the Prometheus data source does."""
        builtins = self.builtins()

        def one(m: re.Match[str]) -> str:
            name = m.group(1) or m.group(2) or m.group(4)
            fmt = m.group(3) or m.group(6)
            if m.group(5):
                raise ValueError(f"${{{name}.{m.group(5)}}}: field access is not supported")
            if name in builtins:
                return builtins[name]
            var = self.variables.get(name)
            if var is None or var.type in ("datasource", "adhoc"):
                return m.group(0)  # not a variable (label_replace's "$1"): Grafana leaves it as written
            if var.selected == ALL and var.all_value is not None:
                return self.interpolate(var.all_value)  # allValue is used verbatim
            vals = var.values()
            if fmt:
                if fmt not in FORMATS:
                    raise ValueError(f"${{{name}:{fmt}}}: format not supported")
                return FORMATS[fmt](vals)
            if not var.multi and not var.include_all:
                return regular_escape(vals[0]) if vals else ""
            escaped = [regex_escape(v) for v in vals]
            return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"

        return _REF.sub(one, text)

    # -- running targets --

    def run(self, target: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The target's result as Grafana asks for it: instant or range."""
        expr = self.interpolate(target["expr"])
        if target.get("instant") and not target.get("range"):
            return self.prom.query(expr, time=self.now)
        step = max(self.interval_s, _seconds(target.get("interval") or "0s"))
        return self.prom.query_range(expr, self.now - self.range_s, self.now, step)


# Grafana's rangeutil.roundInterval: (below this many ms, round to this many ms)
_ROUND = ((15, 10), (35, 20), (75, 50), (150, 100), (350, 200), (750, 500), (1500, 1000), (3500, 2000),
          (7500, 5000), (12500, 10000), (17500, 15000), (25000, 20000), (45000, 30000), (90000, 60000),
          (210000, 120000), (450000, 300000), (750000, 600000), (1050000, 900000), (1500000, 1200000),
          (2700000, 1800000), (5400000, 3600000), (9000000, 7200000), (16200000, 10800000),
          (32400000, 21600000), (86400000, 43200000), (604800000, 86400000), (1814400000, 604800000),
          (3628800000, 2592000000))


def round_interval(seconds: float) -> float:
    ms = seconds * 1000
    return next((to for below, to in _ROUND if ms < below), 31536000000) / 1000


def _seconds(text: str) -> float:
    text = text.strip().lstrip(">")
    if not text:
        return 0.0
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)?", text)
    if not m:
        return 0.0  # a variable such as $__interval: the default step applies
    return float(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}[m.group(2)]


# --- which series a PromQL expression reads --------------------------------------------------------

_TOKEN = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|\{(?:"(?:\\.|[^"\\])*"|[^}"])*\}|\[[^\]]*\]'
                    r"|(?:\d+(?:ms|[smhdwy]))+\b|\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|[a-zA-Z_:][a-zA-Z0-9_:]*|\S")
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
             "offset", "inf", "nan", "atan2"}
_LABEL_LISTS = {"by", "without", "on", "ignoring", "group_left", "group_right"}
_AGGREGATIONS = {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk",
                 "quantile", "limitk", "limit_ratio"}


def selectors(expr: str) -> list[str]:
    """The vector selectors ``expr`` reads (``name{...}`` or ``{...}``), in order."""
    toks = _TOKEN.findall(expr)
    out: list[str] = []
    i = 0
    while i < len(toks):
        t = toks[i]
        nxt = toks[i + 1] if i + 1 < len(toks) else ""
        if t.lower() in _LABEL_LISTS and nxt == "(":
            i = toks.index(")", i)  # skip the label list
        elif t in _AGGREGATIONS and nxt.lower() in ("by", "without"):
            pass  # sum by (...) (...): an aggregation, not a series
        elif re.fullmatch(r"[a-zA-Z_:][a-zA-Z0-9_:]*", t) and t.lower() not in _KEYWORDS and nxt != "(":
            out.append(t + (nxt if nxt.startswith("{") else ""))
        elif t.startswith("{") and (i == 0 or not re.fullmatch(r"[a-zA-Z_:][a-zA-Z0-9_:]*", toks[i - 1])):
            out.append(t)
        i += 1
    return out
