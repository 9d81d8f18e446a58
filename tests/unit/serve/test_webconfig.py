"""TLS and basic auth from an exporter-toolkit web config, with real TLS handshakes.

Every key of the format is either proven here with a handshake or a request, or shown to be
rejected at start-up with one line and exit 2 (issue 16: nothing accepted and ignored).
"""

from __future__ import annotations

import base64
import http.client
import os
import signal
import socket
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import bcrypt
import pytest

from tests.harness.cli import gx
from tests.harness.exporter import REPO, ExporterProcess, free_port
from tests.harness.poll import wait_until

PASSWORD = "s3cret-Pa55word"
AES256 = "ECDHE-RSA-AES256-GCM-SHA384"
AES128 = "ECDHE-RSA-AES128-GCM-SHA256"


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_ca(d: Path, name: str) -> None:
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={name}",
            "-keyout", f"{name}.key", "-out", f"{name}.crt", cwd=d)


def make_leaf(d: Path, name: str, san: str, ca: str = "ca") -> None:
    (d / f"{name}.cnf").write_text(f"subjectAltName={san}\n")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", f"{name}.key",
            "-out", f"{name}.csr", cwd=d)
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key", "-CAcreateserial",
            "-days", "2", "-extfile", f"{name}.cnf", "-out", f"{name}.crt", cwd=d)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    make_ca(d, "ca")
    make_ca(d, "other-ca")
    make_leaf(d, "server", "IP:127.0.0.1,DNS:localhost")
    make_leaf(d, "server2", "IP:127.0.0.1,DNS:localhost", ca="other-ca")  # the rotated certificate
    make_leaf(d, "client-ok", "DNS:prometheus.example,IP:::1")
    make_leaf(d, "client-other", "DNS:other.example")
    return d


def hashed(password: str = PASSWORD, rounds: int = 4) -> str:
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=rounds)).decode()


def web_config(d: Path, users: bool = True, tls: bool = True, extra_tls: str = "", extra: str = "",
               name: str | None = None) -> Path:
    lines = []
    if tls:
        lines += ["tls_server_config:", f"  cert_file: {d / 'server.crt'}", f"  key_file: {d / 'server.key'}"]
        lines += [f"  {x}" for x in extra_tls.splitlines() if x]
    if users:
        lines += ["basic_auth_users:", f"  prometheus: {hashed()}"]
    lines += extra.splitlines()
    path = d / (name or f"web-{users}-{tls}-{abs(hash((extra_tls, extra)))}.yml")
    path.write_text("\n".join(lines) + "\n")
    return path


def auth(user: str, password: str, scheme: str = "Basic") -> dict[str, str]:
    return {"Authorization": f"{scheme} " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def get(url: str, ca: Path | None, user: str | None = None, password: str | None = None) -> int:
    return fetch(url, ca, auth(user, password or "") if user is not None else {})[0]


def fetch(url: str, ca: Path | None, headers: dict[str, str] | None = None,
          ctx: ssl.SSLContext | None = None) -> tuple[int, bytes, Any]:
    if ctx is None and ca is not None:
        ctx = ssl.create_default_context(cafile=str(ca))
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10, context=ctx) as resp:
            return resp.status, resp.read(), resp.headers
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), exc.headers


def client_ctx(pki: Path, cert: str | None = None, ciphers: str | None = None, curve: str | None = None,
               max12: bool = False, ca: str = "ca") -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki / f"{ca}.crt"))
    if cert:
        ctx.load_cert_chain(pki / f"{cert}.crt", pki / f"{cert}.key")
    if max12 or ciphers:
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    if ciphers:
        ctx.set_ciphers(ciphers)
    if curve:
        ctx.set_ecdh_curve(curve)
    return ctx


def handshake(port: int, ctx: ssl.SSLContext) -> tuple[str, str]:
    """(TLS version, cipher) of a completed handshake; ssl.SSLError or OSError when refused."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
        version, cipher = s.version(), s.cipher()
        assert version is not None and cipher is not None
        return version, cipher[0]


def https_status(port: int, ctx: ssl.SSLContext, path: str = "/healthz") -> int:
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=ctx)
    try:
        conn.request("GET", path)
        return conn.getresponse().status
    finally:
        conn.close()


class TLSExporter(ExporterProcess):
    """An exporter whose readiness is probed over https with ``ctx``."""

    def __init__(self, args: list[str], ctx: ssl.SSLContext) -> None:
        self.ctx = ctx
        super().__init__(["--backend", "simulated", *args])

    def wait_healthy(self, timeout: float = 15.0) -> None:
        def ok() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(self.log())
            try:
                return https_status(self.port, self.ctx) == 200
            except OSError:
                return False

        wait_until(ok, timeout, what="https /healthz")

    def __enter__(self) -> TLSExporter:
        return self

    @property
    def base(self) -> str:
        return f"https://127.0.0.1:{self.port}"


def test_tls_and_basic_auth(pki: Path) -> None:
    cfg = web_config(pki)
    ca = pki / "ca.crt"
    with TLSExporter(["--web.config.file", str(cfg), "--log-level", "debug"], client_ctx(pki)) as ex:
        base = ex.base
        assert get(base + "/metrics", ca, "prometheus", PASSWORD) == 200
        assert get(base + "/metrics", ca, "prometheus", PASSWORD) == 200  # cached check
        assert get(base + "/metrics", ca, "prometheus", "wrong") == 401
        assert get(base + "/metrics", ca, "nobody", PASSWORD) == 401
        assert get(base + "/metrics", ca) == 401
        with pytest.raises(urllib.error.URLError) as info:
            get(base + "/metrics", pki / "other-ca.crt", "prometheus", PASSWORD)
        assert isinstance(info.value.reason, ssl.SSLCertVerificationError)
        with pytest.raises((urllib.error.URLError, ConnectionError)):  # plain http to a TLS port
            urllib.request.urlopen(f"http://127.0.0.1:{ex.port}/metrics", timeout=5)
        assert get(base + "/metrics", ca, "prometheus", PASSWORD) == 200  # still serving after bad clients
        log = ex.log()
        assert "https://" in log
        hashed_pw = cfg.read_text().split("prometheus: ", 1)[1].strip()
        assert PASSWORD not in log and hashed_pw not in log and "s3cret" not in log


def test_probes_are_open_under_auth_and_say_only_up_or_down(pki: Path) -> None:
    """The kubelet sends no credentials: /healthz and /readyz answer, with nothing but ok / not ready."""
    cfg = web_config(pki, tls=False)
    with ExporterProcess(["--backend", "nvml", "--web.config.file", str(cfg)],
                         env={"LD_LIBRARY_PATH": "/nonexistent"}, wait=False) as ex:
        wait_until(lambda: ex.get("/healthz")[0] == 200, 15, what="/healthz")
        status, body, _ = ex.get("/readyz")  # no NVML here: not ready, and the reason stays private
        assert (status, body) == (503, b"not ready\n")
        status, body, _ = ex.get("/readyz", auth("prometheus", "wrong"))
        assert (status, body) == (503, b"not ready\n")
        status, body, _ = ex.get("/readyz", auth("prometheus", PASSWORD))
        assert status == 503 and b"nvml" in body  # the authorised reader gets the reason
        assert ex.get("/healthz")[1] == b"ok\n"
    with ExporterProcess(["--backend", "simulated", "--web.config.file", str(cfg)]) as ex:
        assert ex.get("/readyz")[:2] == (200, b"ok\n")
        assert ex.get("/metrics")[0] == 401


def test_basic_auth_without_tls(pki: Path) -> None:
    cfg = web_config(pki, tls=False)
    with ExporterProcess(["--backend", "simulated", "--web.config.file", str(cfg)]) as ex:
        assert get(ex.url + "/metrics", None) == 401
        assert get(ex.url + "/metrics", None, "prometheus", PASSWORD) == 200
        # the scheme is case-insensitive (RFC 7617 2, RFC 9110 11.1), as in Go's Request.BasicAuth
        assert ex.get("/metrics", auth("prometheus", PASSWORD, "basic"))[0] == 200
        assert ex.get("/metrics", auth("prometheus", PASSWORD, "BASIC"))[0] == 200
        assert ex.get("/metrics", auth("prometheus", PASSWORD, "Bearer"))[0] == 401


def test_passwords_longer_than_bcrypt_reads_are_refused(pki: Path) -> None:
    """bcrypt reads 72 bytes: a longer password whose first 72 bytes are right must not pass (it
    would make every longer variant of the password valid). 72 bytes exactly, in ASCII or in
    multi-byte UTF-8, is a password like any other."""
    ascii72 = "p" * 71 + "!"
    utf72 = "é" * 36  # 72 bytes
    cfg = pki / "web-72.yml"
    cfg.write_text(f"basic_auth_users:\n  a: {hashed(ascii72)}\n  u: {hashed(utf72)}\n")
    with ExporterProcess(["--backend", "simulated", "--web.config.file", str(cfg)]) as ex:
        assert get(ex.url + "/metrics", None, "a", ascii72) == 200
        assert get(ex.url + "/metrics", None, "u", utf72) == 200
        assert get(ex.url + "/metrics", None, "a", ascii72 + "x") == 401
        assert get(ex.url + "/metrics", None, "a", ascii72 + "!" * 100) == 401
        assert get(ex.url + "/metrics", None, "u", utf72 + "é") == 401
        assert get(ex.url + "/metrics", None, "a", ascii72[:71]) == 401
        # the refusals are not cached as successes: the right password still works after them
        assert get(ex.url + "/metrics", None, "a", ascii72) == 200


def test_failed_logins_are_rate_limited_per_address(pki: Path) -> None:
    cfg = web_config(pki, tls=False)
    good = auth("prometheus", PASSWORD)
    with ExporterProcess(["--backend", "simulated", "--web.config.file", str(cfg)]) as ex:
        assert ex.get("/metrics", good)[0] == 200  # these credentials passed once: never limited
        statuses = [ex.get("/metrics", auth("prometheus", f"guess{i}"))[0] for i in range(14)]
        assert statuses[:10] == [401] * 10 and set(statuses[10:]) == {429}, statuses
        status, _, headers = ex.get("/metrics", auth("nobody", "x"))
        assert status == 429 and int(headers["Retry-After"]) >= 1
        assert ex.get("/metrics", good)[0] == 200
        assert ex.get("/readyz")[0] == 200
        assert ex.log().count("failed attempts from 127.0.0.1") == 1


def test_client_allowed_sans(pki: Path) -> None:
    cfg = web_config(pki, users=False, extra_tls=f"client_ca_file: {pki / 'ca.crt'}\n"
                     "client_auth_type: RequireAndVerifyClientCert\n"
                     "client_allowed_sans: [prometheus.example, '0:0::1']")
    with TLSExporter(["--web.config.file", str(cfg)], client_ctx(pki, "client-ok")) as ex:
        assert https_status(ex.port, client_ctx(pki, "client-ok"), "/metrics") == 200
        with pytest.raises((OSError, http.client.HTTPException)):  # a valid certificate, but not an allowed SAN
            https_status(ex.port, client_ctx(pki, "client-other"), "/metrics")
        with pytest.raises((OSError, http.client.HTTPException)):  # no certificate at all
            https_status(ex.port, client_ctx(pki), "/metrics")
        assert https_status(ex.port, client_ctx(pki, "client-ok"), "/metrics") == 200


def test_cipher_suites_and_server_preference(pki: Path) -> None:
    suites = "cipher_suites: [TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384, TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256]\n"
    for prefer, expect in (("true", AES256), ("false", AES128)):
        cfg = web_config(pki, users=False, extra_tls=suites + f"prefer_server_cipher_suites: {prefer}")
        with TLSExporter(["--web.config.file", str(cfg)], client_ctx(pki)) as ex:
            assert handshake(ex.port, client_ctx(pki, ciphers=f"{AES128}:{AES256}")) == ("TLSv1.2", expect)
            with pytest.raises(ssl.SSLError):  # a TLS 1.2 suite not in the list
                handshake(ex.port, client_ctx(pki, ciphers="ECDHE-RSA-CHACHA20-POLY1305"))


def test_curve_preferences(pki: Path) -> None:
    cfg = web_config(pki, users=False, extra_tls="curve_preferences: [CurveP384]")
    with TLSExporter(["--web.config.file", str(cfg)], client_ctx(pki)) as ex:
        assert handshake(ex.port, client_ctx(pki, curve="secp384r1"))[0] == "TLSv1.3"
        assert handshake(ex.port, client_ctx(pki, curve="secp384r1", max12=True))[0] == "TLSv1.2"
        for max12 in (False, True):
            with pytest.raises(ssl.SSLError):
                handshake(ex.port, client_ctx(pki, curve="prime256v1", max12=max12))


def test_min_and_max_version(pki: Path) -> None:
    cfg = web_config(pki, users=False, extra_tls="min_version: TLS13")
    with TLSExporter(["--web.config.file", str(cfg)], client_ctx(pki)) as ex:
        assert handshake(ex.port, client_ctx(pki))[0] == "TLSv1.3"
        with pytest.raises(ssl.SSLError):
            handshake(ex.port, client_ctx(pki, max12=True))
    cfg = web_config(pki, users=False, extra_tls="max_version: TLS12")
    with TLSExporter(["--web.config.file", str(cfg)], client_ctx(pki)) as ex:
        assert handshake(ex.port, client_ctx(pki))[0] == "TLSv1.2"


def test_headers_and_rate_limit(pki: Path) -> None:
    cfg = web_config(pki, tls=False, extra="http_server_config:\n  http2: false\n  headers:\n"
                     "    X-Frame-Options: deny\n    Strict-Transport-Security: max-age=31536000\n"
                     "rate_limit:\n  interval: 1h\n  burst: 3\n")
    good = auth("prometheus", PASSWORD)
    with ExporterProcess(["--backend", "simulated", "--web.config.file", str(cfg)]) as ex:
        statuses = []
        for _ in range(5):
            status, _, headers = ex.get("/metrics", good)
            statuses.append(status)
            assert headers["X-Frame-Options"] == "deny" and headers["Strict-Transport-Security"] == "max-age=31536000"
        assert statuses == [200, 200, 200, 429, 429]
        assert ex.get("/nope")[2]["X-Frame-Options"] == "deny"
        assert ex.get("/healthz")[0] == 200 and ex.get("/readyz")[0] == 200  # probes are not rate-limited


@pytest.fixture
def rotating(pki: Path, tmp_path: Path) -> Iterator[tuple[TLSExporter, Path]]:
    """An exporter whose web config names certificate files in tmp_path, which the test may replace."""
    for n in ("server.crt", "server.key"):
        (tmp_path / n).write_bytes((pki / n).read_bytes())
    cfg = tmp_path / "web.yml"
    cfg.write_text(f"tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"  # relative: to the file
                   f"basic_auth_users:\n  prometheus: {hashed()}\n")
    ex = TLSExporter(["--web.config.file", str(cfg)], client_ctx(pki))
    with ex:
        yield ex, tmp_path


def test_rotated_certificates_and_edited_config_take_effect_without_restart(
        pki: Path, rotating: tuple[TLSExporter, Path]) -> None:
    ex, d = rotating
    assert fetch(ex.base + "/metrics", pki / "ca.crt", auth("prometheus", PASSWORD))[0] == 200
    for n in ("crt", "key"):  # cert-manager style: new files moved into place
        (d / f"new.{n}").write_bytes((pki / f"server2.{n}").read_bytes())
        os.replace(d / f"new.{n}", d / f"server.{n}")

    def rotated() -> bool:
        try:
            return handshake(ex.port, client_ctx(pki, ca="other-ca"))[0].startswith("TLS")
        except (ssl.SSLError, OSError):
            return False

    wait_until(rotated, 10, what="the rotated certificate to be served")
    with pytest.raises(ssl.SSLError):
        handshake(ex.port, client_ctx(pki))
    cfg = d / "web.yml"
    cfg.write_text(cfg.read_text().replace("prometheus:", "scraper:"))  # users edited
    other = client_ctx(pki, ca="other-ca")
    wait_until(lambda: fetch(ex.base + "/metrics", None, auth("scraper", PASSWORD), other)[0] == 200, 10,
               what="the new user to be accepted")
    assert fetch(ex.base + "/metrics", None, auth("prometheus", PASSWORD), other)[0] == 401
    cfg.write_text("basic_auth_users:\n  scraper: $2y$10$cut-short\n")  # a broken edit: kept out, logged
    wait_until(lambda: "cannot be used, keeping the previous one" in ex.log(), 10, what="the reload error")
    assert fetch(ex.base + "/metrics", None, auth("scraper", PASSWORD), other)[0] == 200
    assert ex.log().count("cannot be used") == 1  # once per change, not once per request


def test_sighup_reloads_and_never_kills(pki: Path, tmp_path: Path) -> None:
    cfg = tmp_path / "web.yml"
    cfg.write_text(f"basic_auth_users:\n  prometheus: {hashed()}\n")
    with ExporterProcess(["--backend", "simulated", "--web.config.file", str(cfg)]) as ex:
        ex.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: "SIGHUP" in ex.log(), 10, what="the SIGHUP log line")
        assert ex.proc.poll() is None and ex.get("/metrics", auth("prometheus", PASSWORD))[0] == 200
    with ExporterProcess(["--backend", "simulated"]) as ex:  # no web config: ignored, with a line
        ex.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: "SIGHUP" in ex.log(), 10, what="the SIGHUP log line")
        assert ex.proc.poll() is None and ex.get("/healthz")[0] == 200


CUT_HASH = "$2y$10$" + "a" * 40


@pytest.mark.parametrize(("content", "expect"), [
    ("tls_server_config:\n  cert_file: /nonexistent.crt\n  key_file: /nonexistent.key\n", "cannot load cert_file"),
    ("basic_auth_users:\n  bob: plaintext\n", "basic_auth_users.bob: expected a whole bcrypt hash"),
    (f"basic_auth_users:\n  bob: '{CUT_HASH}'\n", "basic_auth_users.bob: expected a whole bcrypt hash"),
    ("basic_auth_users:\n  'a:b': '$2y$10$" + "a" * 53 + "'\n", "cannot hold ':'"),
    ("basic_auth_users:\n", "basic_auth_users"),
    # issue 38 item 15: `htpasswd -nB user` prints user:hash; pasted whole, the error says so
    ("basic_auth_users:\n  bob:$2y$10$" + "a" * 53 + "\n", "basic_auth_users holds an htpasswd line (user:hash)"),
    ("basic_auth_users:\n  bob: 'bob:$2y$10$" + "a" * 53 + "'\n", "the value is an htpasswd line"),
    ("tls_server_config:\n  cert_file: a\n", "needs both cert_file and key_file"),
    ("tls_server_config: []\n", "tls_server_config"),
    ("tls_server_config: {}\n", "tls_server_config"),
    ("tls_server_config:\n", "tls_server_config"),
    ("bogus: 1\n", "unknown key 'bogus'"),
    ("tls_server_config: [1\n", "not valid YAML"),
    ("tls_server_config:\n  cert: '-----BEGIN CERTIFICATE-----'\n", "inline PEM"),
    ("tls_server_config:\n  wat: 1\n", "unknown key tls_server_config.wat"),
    ("http_server_config:\n  http2: true\n", "HTTP/1.1 only"),
    ("http_server_config:\n  headers:\n    Server: x\n", "'Server' cannot be configured"),
    ("http_server_config:\n  headers:\n    X-Frame-Options: allow\n", "expected one of deny, sameorigin"),
    ("http_server_config:\n  headers:\n    Content-Security-Policy: \"a\\r\\nSet-Cookie: x\"\n", "one line"),
    ("http_server_config:\n  wat: 1\n", "unknown key http_server_config.wat"),
    ("rate_limit:\n  interval: 1\n  burst: 1\n", "rate_limit.interval"),
    ("rate_limit:\n  interval: 1s\n  burst: 0\n", "rate_limit.burst"),
    ("tls_server_config:\n  cert_file: x\n  key_file: x\n" + "\u00e9: 1\n", "unknown key"),
    ("a: " + "[" * 100 + "]" * 100 + "\n", "nested deeper"),
    ("basic_auth_users:\n  bob: " + "9" * 5000 + "\n", "a value cannot be read"),
])
def test_bad_web_config_exits_2(tmp_path: Path, content: str, expect: str) -> None:
    cfg = tmp_path / "web.yml"
    cfg.write_text(content)
    check_rejected(cfg, expect)
    assert "plaintext" not in run_check(cfg).stderr


@pytest.mark.parametrize(("tls", "expect"), [
    ("min_version: TLS13\nmax_version: TLS12", "min_version TLS13 is above max_version TLS12"),
    ("min_version: TLS10", "TLS 1.0 and 1.1 are not offered"),
    ("max_version: TLS11", "TLS 1.0 and 1.1 are not offered"),
    ("min_version: SSL3", "expected one of TLS12, TLS13"),
    ("client_ca_file: {ca}", "client_ca_file without client_auth_type"),
    ("client_auth_type: RequireAndVerifyClientCert", "needs client_ca_file"),
    ("client_auth_type: RequireAnyClientCert\nclient_ca_file: {ca}", "cannot ask for a client certificate"),
    ("client_auth_type: RequestClientCert\nclient_ca_file: {ca}", "cannot ask for a client certificate"),
    ("client_auth_type: Sometimes", "expected one of NoClientCert"),
    ("client_allowed_sans: [a.example]", "client_allowed_sans needs client_auth_type"),
    ("client_allowed_sans: []\nclient_auth_type: RequireAndVerifyClientCert\nclient_ca_file: {ca}",
     "client_allowed_sans"),
    ("cipher_suites: [TLS_RSA_WITH_RC4_128_SHA]", "expected Go names"),
    ("cipher_suites: [TLS_AES_128_GCM_SHA256]", "TLS 1.3 suites cannot be chosen"),
    ("cipher_suites: TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", "expected a list"),
    ("curve_preferences: [CurveP256, X25519]", "one curve only"),
    ("curve_preferences: [P-256]", "expected one of CurveP256"),
    ("prefer_server_cipher_suites: 'yes'", "expected true or false"),
])
def test_tls_settings_that_cannot_be_kept_are_rejected(pki: Path, tls: str, expect: str) -> None:
    cfg = web_config(pki, users=False, extra_tls=tls.replace("{ca}", str(pki / "ca.crt")))
    check_rejected(cfg, expect)


def run_check(cfg: Path) -> subprocess.CompletedProcess[str]:
    return gx("serve", "--backend", "simulated", "--check-config", "--web.config.file", str(cfg))


def check_rejected(cfg: Path, expect: str) -> None:
    res = run_check(cfg)
    assert res.returncode == 2, res.stderr
    assert expect in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_the_same_files_start_the_real_server(pki: Path) -> None:
    """--check-config and serving agree: a rejected file also stops `serve` with exit 2."""
    cfg = web_config(pki, users=False, extra_tls="min_version: TLS13\nmax_version: TLS12")
    res = subprocess.run([sys.executable, "-m", "exporter", "serve", "--backend", "simulated", "--port",
                          str(free_port()), "--address", "127.0.0.1", "--web.config.file", str(cfg)],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1
