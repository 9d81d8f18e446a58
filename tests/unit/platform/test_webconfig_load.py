"""``webconfig.load`` in this process (the mutation module ``webconfig-load``): each bad web config refused
with its exact one-line error, and what a good one sets (the TLS context, the client certificate check,
allowed SANs, headers, rate limit, the files watched for reloads).

The same files through ``python -m exporter`` (exit 2, the real server) are test_webconfig.py's; this file
judges the loader mutant by mutant (a test that starts a process kills nothing for mutmut).
"""

from __future__ import annotations

import ssl
import subprocess
from pathlib import Path

import pytest

from exporter.platform import webconfig
from exporter.platform.configfile import ConfigError

T = "tls_server_config:\n  cert_file: c.pem\n  key_file: k.pem\n"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-days", "2", "-subj", "/CN=x", "-keyout", "k.pem", "-out", "c.pem"], cwd=d, check=True,
                   capture_output=True, timeout=60)
    return d


def _load(pki: Path, text: str, name: str = "w.yml") -> webconfig.WebConfig:
    path = pki / name
    path.write_text(text)
    return webconfig.load(str(path))


BAD = [
    ('- a\n',
     'web config {p}: expected a mapping at the top level'),
    ('wat: 1\n',
     "web config {p}: unknown key 'wat'; expected tls_server_config, basic_auth_users, http_server_config, rate_limit"),
    ('tls_server_config: []\n',
     'web config {p}: invalid tls_server_config = []: expected a mapping with cert_file and key_file'),
    ('tls_server_config: {}\n',
     'web config {p}: invalid tls_server_config = {}: expected a mapping with cert_file and key_file'),
    ('tls_server_config:\n  cert: x\n',
     'web config {p}: tls_server_config.cert (inline PEM) is not supported; use cert_file'),
    ('tls_server_config:\n  key: x\n',
     'web config {p}: tls_server_config.key (inline PEM) is not supported; use key_file'),
    ('tls_server_config:\n  client_ca: x\n',
     'web config {p}: tls_server_config.client_ca (inline PEM) is not supported; use client_ca_file'),
    ('tls_server_config:\n  wat: 1\n',
     'web config {p}: unknown key tls_server_config.wat'),
    ('tls_server_config:\n  cert_file: c.pem\n',
     'web config {p}: tls_server_config needs both cert_file and key_file'),
    ('tls_server_config:\n  key_file: k.pem\n',
     'web config {p}: tls_server_config needs both cert_file and key_file'),
    ('tls_server_config:\n  cert_file: 7\n  key_file: k.pem\n',
     'web config {p}: invalid tls_server_config.cert_file = 7: expected a file path'),
    ("tls_server_config:\n  cert_file: ''\n  key_file: k.pem\n",
     "web config {p}: invalid tls_server_config.cert_file = '': expected a file path"),
    ('tls_server_config:\n  cert_file: nope.pem\n  key_file: k.pem\n',
     'web config {p}: cannot load cert_file {d}/nope.pem / key_file {d}/k.pem: [Errno 2] No such file or directory'),
    (T + '  min_version: TLS10\n',
     "web config {p}: invalid tls_server_config.min_version = 'TLS10': TLS 1.0 and 1.1 are not offered "
     '(RFC 8996): use TLS12'),
    (T + '  max_version: TLS11\n',
     "web config {p}: invalid tls_server_config.max_version = 'TLS11': TLS 1.0 and 1.1 are not offered "
     '(RFC 8996): use TLS12'),
    (T + '  min_version: TLS14\n',
     "web config {p}: invalid tls_server_config.min_version = 'TLS14': expected one of TLS12, TLS13"),
    (T + '  min_version: 12\n',
     'web config {p}: invalid tls_server_config.min_version = 12: expected one of TLS12, TLS13'),
    (T + '  min_version: TLS13\n  max_version: TLS12\n',
     'web config {p}: tls_server_config.min_version TLS13 is above max_version TLS12'),
    (T + '  client_auth_type: 5\n',
     'web config {p}: invalid tls_server_config.client_auth_type = 5: expected one of NoClientCert, '
     'VerifyClientCertIfGiven, RequireAndVerifyClientCert'),
    (T + '  client_auth_type: RequestClientCert\n',
     "web config {p}: invalid tls_server_config.client_auth_type = 'RequestClientCert': Python's ssl "
     'cannot ask for a client certificate without verifying it: use VerifyClientCertIfGiven or '
     'RequireAndVerifyClientCert with client_ca_file'),
    (T + '  client_auth_type: Whatever\n',
     "web config {p}: invalid tls_server_config.client_auth_type = 'Whatever': expected one of "
     'NoClientCert, VerifyClientCertIfGiven, RequireAndVerifyClientCert'),
    (T + '  client_ca_file: c.pem\n',
     'web config {p}: client_ca_file without client_auth_type: set client_auth_type '
     'RequireAndVerifyClientCert (or VerifyClientCertIfGiven), or remove client_ca_file'),
    (T + '  client_auth_type: RequireAndVerifyClientCert\n',
     'web config {p}: client_auth_type RequireAndVerifyClientCert needs client_ca_file'),
    (T + '  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: nope.pem\n',
     'web config {p}: cannot load client_ca_file {d}/nope.pem: [Errno 2] No such file or directory'),
    (T + '  client_allowed_sans: [a]\n',
     'web config {p}: client_allowed_sans needs client_auth_type RequireAndVerifyClientCert and client_ca_file'),
    (T + '  client_allowed_sans: []\n',
     'web config {p}: invalid tls_server_config.client_allowed_sans = []: expected a list of names'),
    (T + '  client_allowed_sans: a\n',
     "web config {p}: invalid tls_server_config.client_allowed_sans = 'a': expected a list of names"),
    (T + '  client_allowed_sans: [1]\n',
     'web config {p}: invalid tls_server_config.client_allowed_sans = [1]: expected a list of names'),
    (T + '  prefer_server_cipher_suites: yes please\n',
     "web config {p}: invalid tls_server_config.prefer_server_cipher_suites = 'yes please': expected true or false"),
    (T + '  cipher_suites: [TLS_AES_128_GCM_SHA256]\n',
     "web config {p}: invalid tls_server_config.cipher_suites = 'TLS_AES_128_GCM_SHA256': TLS 1.3 "
     'suites cannot be chosen (in Go neither): list TLS 1.2 suites only'),
    (T + '  cipher_suites: [NOPE]\n',
     "web config {p}: invalid tls_server_config.cipher_suites = 'NOPE': expected Go names such as "
     'TLS_RSA_WITH_AES_128_CBC_SHA'),
    (T + '  cipher_suites: []\n',
     'web config {p}: invalid tls_server_config.cipher_suites = []: expected a list of names'),
    (T + '  curve_preferences: [CurveP999]\n',
     "web config {p}: invalid tls_server_config.curve_preferences = 'CurveP999': expected one of "
     'CurveP256, CurveP384, CurveP521, X25519'),
    (T + '  curve_preferences: [CurveP256, CurveP384]\n',
     "web config {p}: invalid tls_server_config.curve_preferences = ['CurveP256', 'CurveP384']: "
     "Python's ssl can restrict the key exchange to one curve only: list one"),
    ('http_server_config: []\n',
     'web config {p}: invalid http_server_config = []: expected a mapping with http2 and headers'),
    ('http_server_config:\n  wat: 1\n',
     'web config {p}: unknown key http_server_config.wat'),
    ('http_server_config:\n  http2: true\n',
     'web config {p}: invalid http_server_config.http2 = True: this server speaks HTTP/1.1 only: set '
     'false or leave it out'),
    ('http_server_config:\n  headers:\n    X-Custom: a\n',
     "web config {p}: http_server_config.headers: 'X-Custom' cannot be configured; allowed: "
     'Strict-Transport-Security, X-Content-Type-Options, X-Frame-Options, X-XSS-Protection, '
     'Content-Security-Policy'),
    ('http_server_config:\n  headers:\n    X-Frame-Options: allow\n',
     "web config {p}: invalid http_server_config.headers.X-Frame-Options = 'allow': expected one of deny, sameorigin"),
    ('http_server_config:\n  headers:\n    Strict-Transport-Security: 5\n',
     'web config {p}: invalid http_server_config.headers.Strict-Transport-Security = 5: expected one line of text'),
    ('http_server_config:\n  headers:\n    Content-Security-Policy: "a\\nb"\n',
     "web config {p}: invalid http_server_config.headers.Content-Security-Policy = 'a\\nb': expected one line of text"),
    ('rate_limit: 5\n',
     'web config {p}: invalid rate_limit = 5: expected a mapping with interval (e.g. 100ms) and burst'),
    ('rate_limit:\n  wat: 1\n',
     "web config {p}: invalid rate_limit = {'wat': 1}: expected a mapping with interval (e.g. 100ms) and burst"),
    ('rate_limit:\n  interval: soon\n  burst: 1\n',
     "web config {p}: invalid rate_limit.interval = 'soon': expected a duration such as 100ms or 1s"),
    ('rate_limit:\n  interval: 5\n  burst: 1\n',
     'web config {p}: invalid rate_limit.interval = 5: expected a duration such as 100ms or 1s'),
    ('rate_limit:\n  interval: 2d\n  burst: 1\n',
     "web config {p}: invalid rate_limit.interval = '2d': expected a duration such as 100ms or 1s"),
    ('rate_limit:\n  interval: 1s\n',
     'web config {p}: invalid rate_limit.burst = 0: expected an integer in 1..1000000 (0 would refuse everything)'),
    ('rate_limit:\n  interval: 1s\n  burst: true\n',
     'web config {p}: invalid rate_limit.burst = True: expected an integer in 1..1000000 (0 would refuse everything)'),
    ('rate_limit:\n  interval: 1s\n  burst: 1000001\n',
     'web config {p}: invalid rate_limit.burst = 1000001: expected an integer in 1..1000000 (0 would '
     'refuse everything)'),
    ('rate_limit:\n  interval: -1s\n  burst: 1\n',
     "web config {p}: invalid rate_limit.interval = '-1s': expected a duration such as 100ms or 1s"),]


@pytest.mark.parametrize(("text", "message"), BAD)
def test_a_bad_web_config_is_refused_in_one_line(pki: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        _load(pki, text)
    assert str(err.value) == message.replace("{p}", str(pki / "w.yml")).replace("{d}", str(pki))


def test_an_empty_file_is_no_config(pki: Path) -> None:
    cfg = _load(pki, "")
    assert (cfg.ssl_context, cfg.users, cfg.allowed_sans, cfg.headers, cfg.rate_limit) == (None, {}, None, {}, None)
    assert cfg.path == str(pki / "w.yml") and cfg.files == (str(pki / "w.yml"),)


@pytest.mark.parametrize(("auth", "mode"), [(None, ssl.CERT_NONE), ("NoClientCert", ssl.CERT_NONE),
                                            ("VerifyClientCertIfGiven", ssl.CERT_OPTIONAL),
                                            ("RequireAndVerifyClientCert", ssl.CERT_REQUIRED)])
def test_the_client_certificate_check(pki: Path, auth: str | None, mode: ssl.VerifyMode) -> None:
    text = T + (f"  client_auth_type: {auth}\n" if auth else "")
    if auth not in (None, "NoClientCert"):
        text += "  client_ca_file: c.pem\n"
    cfg = _load(pki, text)
    assert cfg.ssl_context is not None and cfg.ssl_context.verify_mode == mode
    ca = (str(pki / "c.pem"),) if auth not in (None, "NoClientCert") else ()
    assert cfg.files == (str(pki / "w.yml"), str(pki / "c.pem"), str(pki / "k.pem"), *ca)
    assert cfg.allowed_sans is None


def test_tls_versions_ciphers_and_preference(pki: Path) -> None:
    ctx = _load(pki, T).ssl_context
    assert ctx is not None
    assert (ctx.minimum_version, ctx.maximum_version) == (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3)
    assert ctx.options & ssl.OP_CIPHER_SERVER_PREFERENCE  # Go's and the toolkit's default
    ctx = _load(pki, T + "  min_version: TLS13\n  max_version: TLS13\n  prefer_server_cipher_suites: false\n"
                "  cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384]\n"
                "  curve_preferences: [CurveP384]\n").ssl_context
    assert ctx is not None
    assert (ctx.minimum_version, ctx.maximum_version) == (ssl.TLSVersion.TLSv1_3, ssl.TLSVersion.TLSv1_3)
    assert not ctx.options & ssl.OP_CIPHER_SERVER_PREFERENCE
    tls12 = {c["name"] for c in ctx.get_ciphers() if c["protocol"] == "TLSv1.2"}
    assert tls12 == {"ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-ECDSA-AES256-GCM-SHA384"}
    ctx = _load(pki, T + "  min_version: TLS12\n  max_version: TLS12\n").ssl_context
    assert ctx is not None and ctx.maximum_version == ssl.TLSVersion.TLSv1_2


def test_allowed_sans_are_kept_in_canonical_form(pki: Path) -> None:
    cfg = _load(pki, T + "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: c.pem\n"
                "  client_allowed_sans: [a.example, '2001:DB8:0:0:0:0:0:1', ' 10.0.0.1 ', not-an-ip]\n")
    assert cfg.allowed_sans == frozenset({"a.example", "2001:db8::1", "10.0.0.1", "not-an-ip"})
    # a client certificate as getpeercert() gives it: Python writes IPv6 in full upper case
    assert cfg.client_allowed({"subjectAltName": (("IP Address", "2001:DB8:0:0:0:0:0:1\n"),)})
    assert cfg.client_allowed({"subjectAltName": (("DNS", "b.example"), ("DNS", "a.example"))})
    assert not cfg.client_allowed({"subjectAltName": (("DNS", "b.example"), ("URI", "a.example.evil"))})
    assert not cfg.client_allowed({}) and not cfg.client_allowed(None)
    assert webconfig.WebConfig().client_allowed(None)  # no list: any verified client
    assert webconfig._canonical_san("DNS", " 10.0.0.1 ") == " 10.0.0.1 "  # only IP addresses are rewritten


def test_headers_rate_limit_and_relative_files(pki: Path) -> None:
    cfg = _load(pki, "http_server_config:\n  http2: false\n  headers:\n    X-Frame-Options: deny\n"
                "    Content-Security-Policy: default-src 'self'\nrate_limit:\n  interval: 250ms\n  burst: 3\n")
    assert cfg.headers == {"X-Frame-Options": "deny", "Content-Security-Policy": "default-src 'self'"}
    assert cfg.rate_limit == (0.25, 3)
    assert _load(pki, "rate_limit:\n  interval: 0s\n  burst: 5\n").rate_limit is None  # the toolkit's "none"
    assert _load(pki, "rate_limit:\n  interval: 24h\n  burst: 1000000\n").rate_limit == (86400.0, 1000000)
    assert _load(pki, "rate_limit:\n  interval: 1s\n  burst: 1\n").rate_limit == (1.0, 1)
    assert _load(pki, "rate_limit:\n  burst: 1\n").rate_limit is None
    assert _load(pki, "http_server_config: {}\n").headers == {}
    sub = pki / "sub"
    sub.mkdir(exist_ok=True)
    (sub / "w.yml").write_text("tls_server_config:\n  cert_file: ../c.pem\n  key_file: ../k.pem\n")
    cfg = webconfig.load(str(sub / "w.yml"))  # file names are relative to the web config's directory
    assert cfg.files == (str(sub / "w.yml"), str(sub / "../c.pem"), str(sub / "../k.pem"))


def test_an_encrypted_key_is_refused_not_prompted_for(pki: Path) -> None:
    subprocess.run(["openssl", "ec", "-in", "k.pem", "-out", "enc.pem", "-aes256", "-passout", "pass:x"], cwd=pki,
                   check=True, capture_output=True, timeout=60)
    with pytest.raises(ConfigError) as err:
        _load(pki, "tls_server_config:\n  cert_file: c.pem\n  key_file: enc.pem\n")
    assert str(err.value).startswith(f"web config {pki / 'w.yml'}: cannot load cert_file {pki / 'c.pem'} / key_file "
                                     f"{pki / 'enc.pem'}: ")
    assert webconfig._no_password() == b""


@pytest.mark.parametrize(("text", "message"), [
    ("basic_auth_users: []\n",
     "invalid basic_auth_users = '<hidden>': expected a mapping of user name to bcrypt hash"),
    ("basic_auth_users: hunter2\n",
     "invalid basic_auth_users = '<hidden>': expected a mapping of user name to bcrypt hash"),
    ("http_server_config:\n  headers: 5\n",
     "invalid http_server_config.headers = 5: expected a mapping of header to value"),
    (T + "  curve_preferences: []\n", "invalid tls_server_config.curve_preferences = []: expected a list of names"),
    ("rate_limit:\n  interval: '5'\n  burst: 1\n",
     "invalid rate_limit.interval = '5': expected a duration such as 100ms or 1s"),  # a unit is needed
    ("rate_limit:\n  interval: 86401s\n  burst: 1\n",
     "invalid rate_limit.interval = '86401s': expected a duration such as 100ms or 1s"),
    ("a: [\n", "web config {p} line 2: not valid YAML"),
])
def test_more_refusals_in_one_line(pki: Path, text: str, message: str) -> None:
    """The users' value is never shown (it may hold a password); the rest names the value."""
    with pytest.raises(ConfigError) as err:
        _load(pki, text)
    want = message.replace("{p}", str(pki / "w.yml"))
    assert str(err.value) == (want if want.startswith("web config") else f"web config {pki / 'w.yml'}: {want}")


def test_users_are_loaded(pki: Path) -> None:
    import bcrypt

    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4)).decode()
    cfg = _load(pki, f"basic_auth_users:\n  alice: {hashed}\n")
    assert cfg.users == {"alice": hashed.encode()} and sorted(cfg._dummies) == [4]


def test_the_tls_context_is_a_server_context_with_its_defaults_kept(pki: Path) -> None:
    """The server preference is added to, or taken from, the context's own options: the rest (no
    compression, no SSLv3, ...) are kept."""
    fresh = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).options
    ctx = _load(pki, T).ssl_context
    assert ctx is not None and ctx.protocol == ssl.PROTOCOL_TLS_SERVER
    assert ctx.options == fresh | ssl.OP_CIPHER_SERVER_PREFERENCE
    ctx = _load(pki, T + "  prefer_server_cipher_suites: false\n").ssl_context
    assert ctx is not None and ctx.options == fresh & ~ssl.OP_CIPHER_SERVER_PREFERENCE


class _OpenSSL:
    """An SSLContext of an OpenSSL build that lacks suites (a FIPS build without ChaCha20, ...): the one
    seam the cipher check has that this machine's OpenSSL, which has them all, cannot show."""

    def __init__(self, have: set[str] | None) -> None:
        self.options = 0
        self.have = have

    def set_ciphers(self, spec: str) -> None:
        if self.have is None:
            raise ssl.SSLError("No cipher can be selected.")

    def get_ciphers(self) -> list[dict[str, str]]:
        return [{"name": n} for n in sorted(self.have or ())]


def test_suites_this_openssl_lacks_are_named(pki: Path) -> None:
    path = str(pki / "w.yml")
    two = {"cipher_suites": ["TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
                             "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
                             "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256"]}
    one = {"cipher_suites": ["TLS_RSA_WITH_AES_128_CBC_SHA"]}
    with pytest.raises(ConfigError) as err:
        webconfig._ciphers(path, _OpenSSL(None), one)  # type: ignore[arg-type]
    assert str(err.value) == (f"web config {path}: invalid tls_server_config.cipher_suites = "
                              "['TLS_RSA_WITH_AES_128_CBC_SHA']: none is available in this OpenSSL")
    with pytest.raises(ConfigError) as err:
        webconfig._ciphers(path, _OpenSSL({"ECDHE-ECDSA-AES128-GCM-SHA256"}), two)  # type: ignore[arg-type]
    assert str(err.value) == (f"web config {path}: invalid tls_server_config.cipher_suites = "
                              "'TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256': not available in this OpenSSL")
    ctx = _OpenSSL({"ECDHE-ECDSA-AES128-GCM-SHA256"})
    webconfig._ciphers(path, ctx, {"cipher_suites": two["cipher_suites"][:1]})  # type: ignore[arg-type]
    assert ctx.options == ssl.OP_CIPHER_SERVER_PREFERENCE


def test_the_cost_of_a_hash() -> None:
    """``$2y$10$...``: 10, from text or bytes; anything without two digits there has none."""
    assert webconfig._cost("$2y$10$" + "a" * 53) == 10 and webconfig._cost(b"$2b$04$" + b"a" * 53) == 4
    assert webconfig._cost("$2a$14$") == 14
    for bad in ("$2y$1x$", "$2y$", "", b"$2y$\xff\xfe$", "$2y$+1$", "$2y$ 9$", b"$2y$1"):
        assert webconfig._cost(bad) is None, bad
