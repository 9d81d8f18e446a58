"""A real Prometheus (Debian's ``prometheus`` and ``promtool`` binaries) driven from tests.

What this gives a test:

* :class:`Prometheus`: a private server on 127.0.0.1 with its own config and data dir,
  scraping the targets you name, evaluating your rule files, optionally starting from
  backfilled history. Query it with :meth:`Prometheus.query` / :meth:`Prometheus.query_range`
  and wait with :meth:`Prometheus.wait_for_up` / :meth:`Prometheus.wait_for` (never sleep).
* :func:`check_metrics`: ``promtool check metrics`` lint of exposition text.
* :class:`OpenMetricsWriter` + :func:`backfill_openmetrics`: build history from Python
  series and turn it into TSDB blocks with ``promtool tsdb create-blocks-from openmetrics``.

Facts these helpers rely on (Prometheus 2.42 as packaged by Debian):

* A fresh server answers ``/-/ready`` within about a second, but the scrape manager applies
  targets on a 5 s cycle, so the first ``up`` sample comes 5-6 s after start: poll it.
* promtool's backfill silently drops samples that go back in time within a series, so the
  writer sorts each series and rejects duplicate timestamps instead.
* Backfill cuts blocks at 2 h boundaries unless given the hidden ``--max-block-duration``
  flag; we pass 24 h so a day of history is one or two blocks, which the server loads fast.
* Time-based retention is measured back from the newest block, so backfilled data older than
  the default 15 d next to fresh data would be deleted at start-up; we default to 3650 d.
* Blocks must exist before the server starts (it only scans its data dir at start-up).

Cost measured once on the shared 2-core development machine, 8000 series x 360 samples
(1000 nodes x 8 GPUs, one hour at 10 s, 2.88 M samples): the writer takes about 6 s and
makes a 210 MB file; promtool takes about 6 s and peaks at 380 MB resident; the server then
starts on those blocks in under a second. Both scale linearly with the sample count.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import IO, Any, Self

from tests.harness.httpfake import FakeHTTP, Reply, Request, json_reply
from tests.harness.net import free_port
from tests.harness.poll import wait_until
from tests.harness.server import ServerProcess

PROMETHEUS_BIN = os.environ.get("PROMETHEUS_BIN", "/usr/bin/prometheus")
PROMTOOL_BIN = os.environ.get("PROMTOOL_BIN", "/usr/bin/promtool")
_DEBIAN_HINT = "install the Debian package 'prometheus' (make test does: apt-get install prometheus)"

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
_TYPES = ("gauge", "counter", "unknown")

Timestamp = float | datetime


class PrometheusError(RuntimeError):
    """Prometheus answered an API call with an error (the message is Prometheus' own)."""


def _binary(path: str) -> str:
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise RuntimeError(f"{path} not found or not executable: {_DEBIAN_HINT}")
    return path


def promtool(*args: str, input: str | None = None, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    """Run ``promtool ARGS`` and return the completed process (never raises on exit status)."""
    return subprocess.run([_binary(PROMTOOL_BIN), *args], input=input, capture_output=True, text=True, timeout=timeout)


def check_metrics(text: str) -> list[str]:
    """Lint exposition text with ``promtool check metrics``; return its findings, [] when clean.

    A parse error is returned as a finding too (``"error while linting: ..."``), so
    ``assert check_metrics(body) == []`` fails with promtool's words in either case.
    """
    proc = promtool("check", "metrics", input=text)
    findings = [ln.strip() for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
    if proc.returncode != 0 and not findings:
        findings = [f"promtool check metrics exited {proc.returncode} without a message"]
    return findings


def _ts(t: Timestamp) -> float:
    return t.timestamp() if isinstance(t, datetime) else float(t)


def _fmt_value(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(v)


def _escape_label_value(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class OpenMetricsWriter:
    """Stream Python series into an OpenMetrics file for :func:`backfill_openmetrics`.

    Each :meth:`add` writes one whole series (its samples sorted by time) to a spool file of
    its metric family, so memory stays at one series whatever the total; :meth:`close`
    concatenates the families (OpenMetrics wants each family's lines together) and appends
    ``# EOF``. Timestamps are Unix seconds (float or datetime), values are floats.

    Counters follow OpenMetrics: the sample name must end in ``_total`` and the ``# TYPE``
    line names the family without it.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.series_count = 0
        self.sample_count = 0
        self.min_ts = math.inf
        self.max_ts = -math.inf
        self._spool_dir = tempfile.TemporaryDirectory(prefix="om-spool-", dir=self.path.parent)
        self._families: dict[str, tuple[str, IO[str]]] = {}  # family -> (type, spool file)
        self._seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
        self._closed = False

    def add(
        self,
        name: str,
        labels: Mapping[str, str],
        samples: Iterable[tuple[Timestamp, float]],
        type: str = "gauge",
    ) -> int:
        """Add one series; return how many samples it had. Raises ValueError on bad input."""
        if self._closed:
            raise ValueError(f"OpenMetricsWriter for {self.path} is closed")
        if not _METRIC_NAME.match(name):
            raise ValueError(f"invalid metric name {name!r}")
        if type not in _TYPES:
            raise ValueError(f"metric {name}: type {type!r} is not one of {_TYPES}")
        family = name
        if type == "counter":
            if not name.endswith("_total"):
                raise ValueError(f"counter {name!r} must end in _total")
            family = name[: -len("_total")]
        for k in labels:
            if not _LABEL_NAME.match(k) or k.startswith("__"):
                raise ValueError(f"metric {name}: invalid label name {k!r}")
        key = (name, tuple(sorted((k, str(v)) for k, v in labels.items())))
        if key in self._seen:
            raise ValueError(f"series {name}{dict(key[1])} added twice")

        pts = sorted((_ts(t), float(v)) for t, v in samples)
        prev = -math.inf
        for t, _ in pts:
            if t == prev or not math.isfinite(t):
                raise ValueError(f"series {name}{dict(key[1])}: duplicate or non-finite timestamp {t}")
            prev = t

        if family in self._families:
            ftype, spool = self._families[family]
            if ftype != type:
                raise ValueError(f"metric family {family!r} added as {ftype} and as {type}")
        else:
            spool = open(Path(self._spool_dir.name) / f"{len(self._families)}.om", "w")  # noqa: SIM115
            self._families[family] = (type, spool)

        self._seen.add(key)
        label_str = ",".join(f'{k}="{_escape_label_value(v)}"' for k, v in key[1])
        prefix = f"{name}{{{label_str}}} " if label_str else f"{name} "
        spool.write("".join(f"{prefix}{_fmt_value(v)} {t!r}\n" for t, v in pts))
        self.series_count += 1
        self.sample_count += len(pts)
        if pts:
            self.min_ts = min(self.min_ts, pts[0][0])
            self.max_ts = max(self.max_ts, pts[-1][0])
        return len(pts)

    def close(self) -> Path:
        """Write the final file (families, then ``# EOF``) and return its path."""
        if self._closed:
            return self.path
        self._closed = True
        try:
            with open(self.path, "w") as out:
                for family, (ftype, spool) in self._families.items():
                    spool.close()
                    out.write(f"# TYPE {family} {ftype}\n")
                    with open(spool.name) as src:
                        shutil.copyfileobj(src, out, 1 << 20)
                out.write("# EOF\n")
        finally:
            for _, spool in self._families.values():
                spool.close()
            self._spool_dir.cleanup()
        return self.path

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def backfill_openmetrics(
    text_or_path: str | Path, data_dir: Path, max_block_duration: str = "24h", timeout: float = 600.0
) -> subprocess.CompletedProcess[str]:
    """Turn OpenMetrics history into TSDB blocks under ``data_dir`` (before the server starts).

    ``text_or_path``: a :class:`~pathlib.Path` to a file (e.g. from :class:`OpenMetricsWriter`),
    or a ``str`` holding the text itself (must end with ``# EOF``; timestamps in seconds).
    Raises RuntimeError with promtool's output if it fails.
    """
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="om-") as tmp:
        if isinstance(text_or_path, Path):
            src = text_or_path
        else:
            if "# EOF" not in text_or_path:
                raise ValueError("OpenMetrics text must end with '# EOF'")
            src = Path(tmp) / "input.om"
            src.write_text(text_or_path)
        proc = promtool(
            "tsdb", "create-blocks-from", "openmetrics", "--quiet",
            f"--max-block-duration={max_block_duration}", str(src), str(data_dir),
            timeout=timeout,
        )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"promtool backfill of {src} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


class FakePrometheus(FakeHTTP):
    """The one stand-in for Prometheus's HTTP API, for what a real Prometheus will not answer (errors,
    hostile or malformed bodies, scripted sequences). The real one is :class:`Prometheus`.

    Answers, in the order given: ``answer(request, query)`` (a function: the request and its PromQL
    ``query`` form field, returns a :class:`Reply`); or ``answers``, ``(status, JSON document or bytes)``
    pairs used in turn, the last one repeated; or ``by_path``, a body per API path (``{}`` elsewhere),
    changeable while serving. ``seen``: each request's path, headers and body; ``queries``: each query sent.
    """

    def __init__(self, answer: Callable[[Request, str], Reply] | None = None, *,
                 answers: Sequence[tuple[int, Any]] | None = None, by_path: dict[str, bytes] | None = None,
                 tls: Any = None, http11: bool = False) -> None:
        self.answers = list(answers or [])
        self.by_path = by_path if by_path is not None else {}
        self._answer_fn = answer
        super().__init__(self._reply, tls=tls, http11=http11)

    @staticmethod
    def query_of(req: Request) -> str:
        return urllib.parse.parse_qs(req.body.decode(errors="replace")).get("query", [""])[0]

    def _reply(self, req: Request) -> Reply:
        if self._answer_fn is not None:
            return self._answer_fn(req, self.query_of(req))
        if self.answers:
            code, doc = self.answers[min(len(self.requests), len(self.answers)) - 1]
            return json_reply(doc, code, headers={})
        return json_reply(self.by_path.get(req.path.split("?")[0], b"{}"))

    @property
    def seen(self) -> list[tuple[str, dict[str, str], str]]:
        return [(r.path, r.headers, r.body.decode()) for r in self.requests]

    @property
    def queries(self) -> list[str]:
        return [self.query_of(r) for r in self.requests]


class ExpositionServer(FakeHTTP):
    """A tiny scrape target on 127.0.0.1 serving ``body`` (assign it to change what is served).

    ``url`` is the metrics URL, ``target`` the ``host:port`` for :class:`Prometheus`;
    ``scrapes`` counts the requests served.
    """

    def __init__(self, body: str = "", content_type: str = "text/plain; version=0.0.4") -> None:
        self.body = body
        self.content_type = content_type
        super().__init__(lambda req: Reply(200, self.body.encode(), {"Content-Type": self.content_type}))
        self.target = f"127.0.0.1:{self.port}"
        self.url = f"http://{self.target}/metrics"

    @property
    def scrapes(self) -> int:
        return len(self.requests)


class Prometheus(ServerProcess):
    """A private Prometheus server on 127.0.0.1 for one test (use as a context manager).

    ``scrape_targets`` (``"127.0.0.1:9400"``) form one static job named ``job_name``;
    ``extra_scrape_configs`` are appended verbatim (relabelling, other paths...).
    ``tsdb_blocks_from``: an OpenMetrics file (backfilled into the data dir first) or a
    directory holding TSDB blocks (copied in). Change ``scrape_targets`` / ``rule_files``
    and call :meth:`reload` to apply them to a running server.
    """

    name = "prometheus"
    ready_path = "/-/ready"

    def __init__(
        self,
        tmp_dir: Path,
        scrape_targets: Sequence[str] = (),
        scrape_interval: str = "1s",
        rule_files: Sequence[Path] = (),
        evaluation_interval: str = "1s",
        extra_scrape_configs: Sequence[Mapping[str, Any]] = (),
        tsdb_blocks_from: Path | None = None,
        retention: str = "3650d",
        honor_labels: bool = False,
        job_name: str = "targets",
        scrape_timeout: str | None = None,
        lookback_delta: str = "5m",
        extra_args: Sequence[str] = (),
        start_timeout: float = 30.0,
    ) -> None:
        super().__init__(tmp_dir, start_timeout)
        self.scrape_targets = list(scrape_targets)
        self.scrape_interval = scrape_interval
        self.rule_files = [Path(p) for p in rule_files]
        self.evaluation_interval = evaluation_interval
        self.extra_scrape_configs = [dict(c) for c in extra_scrape_configs]
        self.tsdb_blocks_from = tsdb_blocks_from
        self.retention = retention
        self.honor_labels = honor_labels
        self.job_name = job_name
        self.scrape_timeout = scrape_timeout
        self.lookback_delta = lookback_delta
        self.extra_args = list(extra_args)
        self.config_path = self.tmp_dir / "prometheus.yml"
        self.data_dir = self.tmp_dir / "data"

    # ---- lifecycle (tests/harness/server.py) ---------------------------------------------

    def config(self) -> dict[str, Any]:
        """The configuration the server runs with (JSON is valid YAML, so it is written as JSON)."""
        glob: dict[str, Any] = {
            "scrape_interval": self.scrape_interval,
            "evaluation_interval": self.evaluation_interval,
        }
        if self.scrape_timeout:
            glob["scrape_timeout"] = self.scrape_timeout
        scrapes: list[dict[str, Any]] = []
        if self.scrape_targets:
            scrapes.append({
                "job_name": self.job_name,
                "honor_labels": self.honor_labels,
                "static_configs": [{"targets": list(self.scrape_targets)}],
            })  # fmt: skip
        scrapes.extend(self.extra_scrape_configs)
        return {
            "global": glob,
            "rule_files": [str(p.resolve()) for p in self.rule_files],
            "scrape_configs": scrapes,
        }

    def write_config(self) -> Path:
        self.config_path.write_text(json.dumps(self.config(), indent=2))
        return self.config_path

    def prepare(self) -> None:
        _binary(PROMETHEUS_BIN)
        self.data_dir.mkdir(exist_ok=True)
        self._seed_history()
        self.write_config()

    def command(self, port: int) -> list[str]:
        return [
            PROMETHEUS_BIN,
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={self.data_dir}",
            f"--storage.tsdb.retention.time={self.retention}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--web.enable-lifecycle",
            f"--query.lookback-delta={self.lookback_delta}",
            "--log.level=info",
            *self.extra_args,
        ]

    def _seed_history(self) -> None:
        src = self.tsdb_blocks_from
        if src is None:
            return
        src = Path(src)
        if src.is_dir():
            for block in src.iterdir():
                if block.is_dir() and (block / "meta.json").exists():
                    shutil.copytree(block, self.data_dir / block.name, dirs_exist_ok=True)
        elif src.is_file():
            backfill_openmetrics(src, self.data_dir)
        else:
            raise ValueError(f"tsdb_blocks_from {src} is neither an OpenMetrics file nor a block directory")

    def reload(self) -> None:
        """Rewrite the config from the current attributes and ask the server to reload it."""
        self.write_config()
        self._request("/-/reload", method="POST", raw=True)

    # ---- HTTP API -----------------------------------------------------------------------

    def _request(
        self, path: str, params: Mapping[str, str] | None = None, method: str = "GET", raw: bool = False
    ) -> Any:
        if self._proc is None:
            raise RuntimeError("Prometheus is not running (use it as a context manager or call start())")
        data = None
        url = f"{self.url}{path}"
        if params and method == "POST":
            data = urllib.parse.urlencode(params).encode()
        elif params:
            url += "?" + urllib.parse.urlencode(params)
        req = urllib.request.Request(url, data=data, method=method)
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                body = r.read()
        except urllib.error.HTTPError as e:
            body = e.read()
            try:
                err = json.loads(body)
                msg = f"{err.get('errorType')}: {err.get('error')}"
            except ValueError:
                msg = body.decode(errors="replace").strip()
            raise PrometheusError(f"{method} {path} {dict(params or {})} -> HTTP {e.code}: {msg}") from None
        except (urllib.error.URLError, OSError) as e:
            raise PrometheusError(f"{method} {path}: {e}\n{self.log_tail()}") from None
        if raw:
            return body
        doc = json.loads(body)
        if doc.get("status") != "success":
            raise PrometheusError(f"{path} {dict(params or {})}: {doc.get('errorType')}: {doc.get('error')}")
        return doc["data"]

    def query(self, expr: str, time: Timestamp | None = None) -> list[dict[str, Any]]:
        """Instant query; returns ``[{"metric": {...}, "value": [ts, "string"]}, ...]``.

        Scalar and string results come back as one element with an empty ``metric``.
        Raises PrometheusError with Prometheus' message on a bad expression.
        """
        params = {"query": expr}
        if time is not None:
            params["time"] = repr(_ts(time))
        data = self._request("/api/v1/query", params, method="POST")
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        return list(data["result"])

    def value(self, expr: str, time: Timestamp | None = None) -> float | None:
        """The single value of an instant query as float; None for an empty result."""
        res = self.query(expr, time)
        if not res:
            return None
        if len(res) > 1:
            raise AssertionError(f"{expr!r} returned {len(res)} series, expected one: {res}")
        return float(res[0]["value"][1])

    def query_range(self, expr: str, start: Timestamp, end: Timestamp, step: float | str) -> list[dict[str, Any]]:
        """Range query; returns ``[{"metric": {...}, "values": [[ts, "string"], ...]}, ...]``.

        ``step`` in seconds (float) or a Prometheus duration string.
        """
        params = {
            "query": expr,
            "start": repr(_ts(start)),
            "end": repr(_ts(end)),
            "step": step if isinstance(step, str) else repr(float(step)),
        }
        return list(self._request("/api/v1/query_range", params, method="POST")["result"])

    def targets(self) -> list[dict[str, Any]]:
        """Active targets from ``/api/v1/targets`` (health, lastError, labels...)."""
        return list(self._request("/api/v1/targets")["activeTargets"])

    def rules(self) -> list[dict[str, Any]]:
        """Rule groups from ``/api/v1/rules`` (each with ``rules``: health, state, lastError...)."""
        return list(self._request("/api/v1/rules")["groups"])

    def alerts(self) -> list[dict[str, Any]]:
        """Pending and firing alerts from ``/api/v1/alerts``."""
        return list(self._request("/api/v1/alerts")["alerts"])

    # ---- waiting ------------------------------------------------------------------------

    def wait_for(
        self,
        expr: str,
        predicate: Callable[[list[dict[str, Any]]], bool] = bool,
        timeout: float = 30.0,
    ) -> list[dict[str, Any]]:
        """Poll ``query(expr)`` until ``predicate(result)`` holds; return that result."""

        def check() -> tuple[list[dict[str, Any]]] | None:
            res = self.query(expr)
            return (res,) if predicate(res) else None  # a tuple, so an awaited empty result is truthy

        try:
            return wait_until(check, timeout=timeout, interval=0.2, what=f"{expr!r} to satisfy predicate")[0]
        except AssertionError as exc:
            if not self.running:
                raise AssertionError(f"{exc}\nPrometheus is not running\n{self.log_tail()}") from None
            raise

    def wait_for_up(self, job_or_target: str, timeout: float = 30.0) -> dict[str, Any]:
        """Poll until ``up == 1`` for a job name or an ``instance`` (``host:port``); return that series.

        A fresh server applies its targets on a ~5 s cycle, hence the generous default.
        """

        def ok() -> dict[str, Any] | None:
            for s in self.query("up == 1"):
                if job_or_target in (s["metric"].get("job"), s["metric"].get("instance")):
                    return s
            return None

        try:
            return wait_until(ok, timeout=timeout, interval=0.2, what=f"up == 1 for {job_or_target}")
        except AssertionError as exc:
            detail = [
                f"{t['scrapeUrl']}: health={t['health']} lastError={t['lastError']!r}"
                for t in (self.targets() if self.running else [])
            ]
            raise AssertionError(f"{exc}\ntargets: {detail or 'none'}\n{self.log_tail(10)}") from None


__all__ = [
    "ExpositionServer",
    "OpenMetricsWriter",
    "Prometheus",
    "PrometheusError",
    "backfill_openmetrics",
    "check_metrics",
    "free_port",
    "promtool",
]
