"""Every input surface of ``gpu-exporter serve``, fuzzed with hypothesis (issue 16).

Surfaces: the config YAML file (raw bytes: BOM, bad dates, huge integers, deep nesting, aliases,
tags), the web-config YAML (every toolkit key with hostile values), environment values and every
numeric flag (NaN, infinities, huge, negative), and the HTTP request parser. Each case is either
accepted with sane values or rejected with a one-line :class:`ConfigError` (or a 4xx/5xx answer for
HTTP); anything else is a crash and fails the test. A sample of the rejected files is also run
through the real CLI: exit 2, one line on stderr, no traceback.

``make test`` runs a few hundred cases per surface; ``make reliability`` a few thousand (the
``long`` variants), which are the figures of docs/reliability.md's hostile-input table.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import strategies as st

from exporter.platform import http as exporter_http
from exporter.platform import webconfig
from exporter.serve import config as exporter_config
from tests.harness.exporter import REPO
from tests.harness.fuzz import NASTY, one_line, run, text, values
from tests.reliability.support import Result

FAST, LONG = 100, 3000
BUDGETS = [pytest.param(FAST, id="fast"), pytest.param(LONG, id="long", marks=pytest.mark.reliability_long)]


def record(result: Result, surface: str, done: str, cases: int, seen: dict[str, int], sample: dict[str, str]) -> None:
    result.scenario = f"hostile input: {surface}"
    result.done = done
    result.happened = "every case accepted with sane values or rejected with one line naming the culprit; 0 crashes"
    result.figures = {"surface": surface, "cases": cases, **seen, "crashes": 0,
                      "sample_rejection": (sorted(sample.values(), key=len)[len(sample) // 2][:140] if sample else "")}


def cli_runs(budget: int) -> int:
    """How many rejected files also go through the real CLI (a second each)."""
    return 6 if budget >= LONG else 2


def cli_rejects(tmp_path: Path, flag: str, content: bytes) -> None:
    """The real CLI on one file: exit 2, one line, no traceback."""
    f = tmp_path / "cli.yaml"
    f.write_bytes(content)
    res = subprocess.run([sys.executable, "-m", "exporter", "serve", "--check-config", "--backend", "simulated",
                          flag, str(f)], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-1500:]
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr


# ---- config YAML, as bytes ---------------------------------------------------------------------------

KEYS = [s.name for s in exporter_config.SPECS] + ["fields", "port", "collection_interval"]
YAML_VALUES = ["2024-02-30", "2024-13-01 25:61:00", "9" * 5000, "0x" + "f" * 3000, "1e400", ".nan", "-.inf",
               "!!timestamp x", "!!binary x!", "!!python/object:os.system {}", "!!set {a}", "&a [*a]", "*nope",
               "[" * 60 + "]" * 60, "{a: " * 40 + "1" + "}" * 40, "'\\x00'", '"\\ud800"', "~", "!!int x", "-1",
               "'\u202e'", "|\n  multi\n  line", ">-\n  folded", "[1, 2", "? [1]\n: 2"]


def _yaml_bytes(draw: Any) -> bytes:
    lines = [f"{draw(st.sampled_from(KEYS))}: {draw(st.one_of(st.sampled_from(YAML_VALUES), text))}"
             for _ in range(draw(st.integers(0, 4)))]
    doc = "\n".join(lines).encode("utf-8", "surrogateescape")
    how = draw(st.sampled_from(["plain", "plain", "bom", "midbom", "latin1", "binary", "dump", "nul", "alias"]))
    if how == "bom":
        return b"\xef\xbb\xbf" + doc
    if how == "midbom":
        return doc + b"\n\xef\xbb\xbfport: 1"
    if how == "latin1":
        return doc + b"\nsysfs_root: /sys/\xe9"
    if how == "binary":
        return draw(st.binary(max_size=200))
    if how == "dump":
        return yaml.safe_dump(draw(st.dictionaries(st.sampled_from(KEYS), values, max_size=4)),
                              allow_unicode=True).encode("utf-8", "surrogateescape")
    if how == "nul":
        return doc + b"\x00"
    if how == "alias":
        return b"a: &x [1, 2]\nb: &y [*x, *x]\nfields_include: [*y, *y]\n"
    return doc


yaml_bytes = st.composite(_yaml_bytes)()


@pytest.mark.parametrize("budget", BUDGETS)
def test_config_yaml(tmp_path: Path, budget: int, result: Result) -> None:
    cfg = tmp_path / "config.yaml"
    seen = {"accepted": 0, "rejected": 0}
    sample: dict[str, str] = {}
    rejected_files: list[bytes] = []

    def check(content: bytes) -> None:
        cfg.write_bytes(content)
        try:
            s = exporter_config.load(["--config", str(cfg)], environ={})
        except exporter_config.ConfigError as exc:
            assert one_line(str(exc)), str(exc)
            seen["rejected"] += 1
            sample.setdefault(str(exc).split(":", 2)[-1][:30], str(exc))
            if len(rejected_files) < 12 and len(content) < 20000:
                rejected_files.append(content)
        else:
            seen["accepted"] += 1
            assert 1 <= s.port <= 65535 and math.isfinite(s.collection_interval)

    run(budget, check, yaml_bytes)
    for content in rejected_files[:: max(1, len(rejected_files) // cli_runs(budget))]:
        cli_rejects(tmp_path, "--config", content)
    record(result, "config YAML file", f"{budget} generated files (bytes: BOM, bad dates, 5,000-digit integers, deep "
           "nesting, aliases, tags, binary) into `config.load`; some of the rejected ones through the real CLI", budget,
           seen, sample)
    assert seen["rejected"] > 0


# ---- web-config YAML ---------------------------------------------------------------------------------

TLS_VALUES = ["TLS12", "TLS13", "TLS10", "TLS14", "", "NoClientCert", "RequireAndVerifyClientCert",
              "RequestClientCert", "VerifyClientCertIfGiven", "CurveP256", "X25519", "P-256",
              "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", "TLS_AES_128_GCM_SHA256", "true", "false"]
HASHES = ["$2y$04$" + "a" * 53, "$2b$04$" + "." * 53, "$2y$10$" + "a" * 40, "$2y$99$" + "a" * 53, "$2x$04$" + "a" * 53,
          "plaintext", ""]


def _web_doc(draw: Any, files: dict[str, str]) -> bytes:
    doc: dict[str, Any] = {}
    if draw(st.booleans()):
        keys = draw(st.lists(st.sampled_from([*webconfig.TLS_KEYS, "cert", "key", "client_ca", "bogus"]),
                             max_size=6, unique=True))
        tls: dict[str, Any] = {}
        for k in keys:
            tls[k] = draw(st.one_of(st.sampled_from([*files.values(), *TLS_VALUES]),
                                    st.lists(st.sampled_from(TLS_VALUES), max_size=3), values))
        if draw(st.booleans()):
            tls.update(cert_file=files["crt"], key_file=files["key"])
        doc["tls_server_config"] = draw(st.sampled_from([tls, tls, tls, [], {}, None, "x"]))
    if draw(st.booleans()):
        doc["basic_auth_users"] = draw(st.one_of(
            st.dictionaries(st.one_of(st.sampled_from(["prometheus", "a:b", "", "\u00e9"]), text),
                            st.one_of(st.sampled_from(HASHES), values), max_size=3), values))
    if draw(st.booleans()):
        doc["http_server_config"] = draw(st.one_of(st.fixed_dictionaries({}, optional={
            "http2": st.one_of(st.booleans(), values),
            "headers": st.dictionaries(st.one_of(st.sampled_from(list(webconfig.HEADERS)), text),
                                       st.one_of(st.sampled_from(["deny", "nosniff", "a\r\nb", "x"]), values),
                                       max_size=3)}), values))
    if draw(st.booleans()):
        doc["rate_limit"] = draw(st.one_of(st.fixed_dictionaries({}, optional={
            "interval": st.one_of(st.sampled_from(["1s", "100ms", "1h30m", "0s", "1", "-1s", "1e9h", "1.5.5s"]),
                                  values),
            "burst": st.one_of(st.integers(-5, 10**12), values)}), values))
    if draw(st.integers(0, 9)) == 0:
        doc[draw(text)] = draw(values)
    raw = yaml.safe_dump(doc, allow_unicode=True).encode("utf-8", "surrogateescape")
    how = draw(st.sampled_from(["plain", "plain", "plain", "bom", "deep", "bigint", "date", "truncate"]))
    if how == "bom":
        return b"\xef\xbb\xbf" + raw
    if how == "deep":
        return b"tls_server_config: " + b"[" * 100 + b"]" * 100
    if how == "bigint":
        return b"rate_limit: {interval: 1s, burst: " + b"9" * 5000 + b"}"
    if how == "date":
        return b"basic_auth_users: {bob: 2024-02-30}"
    if how == "truncate":
        return raw[: draw(st.integers(0, len(raw)))]
    return raw


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-days", "2", "-subj", "/CN=x", "-keyout", "tls.key", "-out", "tls.crt"], cwd=d, check=True,
                   capture_output=True, timeout=60)
    return {"crt": str(d / "tls.crt"), "key": str(d / "tls.key"), "none": str(d / "missing.pem")}


@pytest.mark.parametrize("budget", BUDGETS)
def test_web_config_yaml(tmp_path: Path, tls_files: dict[str, str], budget: int, result: Result) -> None:
    path = tmp_path / "web.yml"
    seen = {"accepted": 0, "rejected": 0}
    sample: dict[str, str] = {}
    rejected_files: list[bytes] = []

    def check(content: bytes) -> None:
        path.write_bytes(content)
        try:
            cfg = webconfig.load(str(path))
        except exporter_config.ConfigError as exc:
            msg = str(exc)
            assert one_line(msg), msg
            assert "plaintext" not in msg  # a password-like value is never echoed back
            seen["rejected"] += 1
            sample.setdefault(msg.split(":", 2)[-1][:30], msg)
            if len(rejected_files) < 12:
                rejected_files.append(content)
        else:
            seen["accepted"] += 1
            assert cfg.ssl_context is None or cfg.ssl_context.minimum_version >= cfg.ssl_context.minimum_version.TLSv1_2
            assert all(webconfig.BCRYPT_HASH.fullmatch(h.decode()) for h in cfg.users.values())

    run(budget, check, st.composite(_web_doc)(tls_files))
    for content in rejected_files[:: max(1, len(rejected_files) // cli_runs(budget))]:
        cli_rejects(tmp_path, "--web.config.file", content)
    record(result, "web-config YAML", f"{budget} generated exporter-toolkit files (every key, hostile values, wrong "
           "types, BOM, deep nesting, huge integers, dates, truncation) into `webconfig.load`; some of the rejected "
           "ones through the real CLI", budget, seen, sample)
    assert seen["rejected"] > 0 and seen["accepted"] > 0


# ---- environment values and numeric flags ------------------------------------------------------------

NUMERIC = [s for s in exporter_config.SPECS if s.kind in ("integer", "seconds")]
numbers = st.one_of(
    st.sampled_from(["nan", "NaN", "-nan", "inf", "-inf", "Infinity", "1e999", "-1e999", "1e308", "-0", "0", "-1",
                     "9" * 5000, "0x10", "0o7", "1_000", "\u0663", "\uff11", "1e-400", "5ms", "5m", "5h", "5 s", "",
                     " ", "+", "-", ".", "1.", ".5", "1e", "e1", "10s5", "٣s"]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.text(st.sampled_from("0123456789.eE+-_smh nai"), max_size=12),
)


@pytest.mark.parametrize("budget", BUDGETS)
def test_environment_values_and_numeric_flags(budget: int, result: Result) -> None:
    seen = {"accepted": 0, "rejected": 0}
    sample: dict[str, str] = {}
    envs = [s.env for s in exporter_config.SPECS if s.env]

    def check(spec_i: int, value: str, env_name: str, env_value: str, via_env: bool) -> None:
        spec = NUMERIC[spec_i % len(NUMERIC)]
        argv, environ = ([], {spec.env: value}) if via_env and spec.env else ([spec.flag, value], {})
        environ[env_name] = env_value
        try:
            s = exporter_config.load(argv, environ)
        except exporter_config.ConfigError as exc:
            assert one_line(str(exc)), str(exc)
            seen["rejected"] += 1
            sample.setdefault(str(exc).split(" ", 2)[1], str(exc))
        else:
            seen["accepted"] += 1
            v = getattr(s, spec.name)
            assert isinstance(v, int | float) and math.isfinite(v) and v >= 0, (spec.name, value, v)

    env_value = st.one_of(st.sampled_from(NASTY), numbers, text.filter(lambda t: "\x00" not in t))
    run(budget, check, st.integers(0, 10**6), numbers, st.sampled_from(envs), env_value, st.booleans())
    record(result, "environment values and numeric flags", f"{budget} generated values (NaN, infinities, 5,000 "
           "digits, negative, underscores, non-ASCII digits, units) for every numeric flag or its variable, plus one "
           "hostile value in another `EXPORTER_*` variable, into `config.load`", budget, seen, sample)
    assert seen["rejected"] > 0 and seen["accepted"] > 0


# ---- the HTTP request parser -------------------------------------------------------------------------

head_line = st.one_of(
    st.sampled_from(["GET /metrics HTTP/1.1", "HEAD / HTTP/1.0", "GET /metrics HTTP/1.9", "GET /metrics HTTP/2.0",
                     "GET  /metrics HTTP/1.1", "GET /metrics", "get /metrics HTTP/1.1", "GET /met\x01 HTTP/1.1",
                     "Content-Length: 5", "Content-Length: 0", "Content-Length: -1", "Content-Length: 99999999999999",
                     "Content-Length: \u00b2", "Transfer-Encoding: chunked", "Host: a", " folded", "X A: 1", ": x",
                     "Authorization: Basic x", "Authorization: basic eDp5", "Accept: */*;q=2", "X: a\x00b", ""]),
    st.text(st.characters(min_codepoint=0, max_codepoint=0xFF), max_size=40),
)


def _request_bytes(draw: Any) -> bytes:
    lines = draw(st.lists(head_line, max_size=8))
    eol = draw(st.sampled_from(["\r\n", "\n", "\r"]))
    data = eol.join(lines).encode("latin-1") + draw(st.sampled_from([b"\r\n\r\n", b"\n\n", b"", b"\r\n"]))
    return data + draw(st.binary(max_size=20))


@pytest.mark.parametrize("budget", BUDGETS)
def test_http_request_parser(budget: int, result: Result) -> None:
    seen = {"parsed": 0, "incomplete": 0, "refused": 0}
    statuses: dict[str, int] = {}

    def check(data: bytes) -> None:
        try:
            parsed = exporter_http.parse_request(bytearray(data))
        except exporter_http.BadRequest as exc:
            assert 400 <= exc.status <= 505 and one_line(str(exc))
            seen["refused"] += 1
            statuses[str(exc.status)] = statuses.get(str(exc.status), 0) + 1
            return
        if parsed is None:
            seen["incomplete"] += 1
            return
        (_method, target, version, headers), used = parsed
        assert version in ("HTTP/1.0", "HTTP/1.1") and 0 < used <= len(data) and target
        assert all(k == k.lower() for k in headers)
        seen["parsed"] += 1
        exporter_http.wants_openmetrics(headers.get("accept", ""))
        exporter_http.wants_gzip(headers.get("accept-encoding", ""))

    run(budget * 3, check, st.composite(_request_bytes)())
    record(result, "HTTP requests (parser)", f"{budget * 3} generated request heads (request lines of every shape, "
           "versions, folded and malformed headers, duplicate and odd Content-Length, NUL bytes, bare CR/LF line "
           "ends) into the server's parser and content negotiation; the live server is fuzzed in test_fuzz.py",
           budget * 3, seen, {})
    result.figures["answers"] = dict(sorted(statuses.items()))
    assert seen["refused"] > 0 and seen["parsed"] > 0
