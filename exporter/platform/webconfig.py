"""``--web.config.file``: TLS and basic auth in the Prometheus exporter-toolkit format.

Existing users of node_exporter and friends can reuse their file::

    tls_server_config:
      cert_file: /etc/tls/tls.crt              # relative paths: relative to this file, as in the toolkit
      key_file: /etc/tls/tls.key
      client_ca_file: /etc/tls/ca.crt          # mutual TLS; needs client_auth_type
      client_auth_type: RequireAndVerifyClientCert
      client_allowed_sans: [prometheus.monitoring.svc]
      min_version: TLS12
      max_version: TLS13
      cipher_suites: [TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384]   # TLS 1.2 only, as in Go
      prefer_server_cipher_suites: true
      curve_preferences: [X25519]
    http_server_config:
      http2: false
      headers: {X-Frame-Options: deny}
    rate_limit: {interval: 100ms, burst: 20}
    basic_auth_users:
      prometheus: $2y$10$...                    # bcrypt hash (htpasswd -nBC 10)

Every key of the toolkit's format is either enforced (each proven by a real TLS handshake or a
request in tests/unit/serve/test_webconfig.py) or rejected at start-up with one line naming it:
Python's ``ssl`` cannot ask for a client certificate without verifying it (``RequestClientCert``,
``RequireAnyClientCert``), sets one key-exchange group only (``curve_preferences`` of one curve),
and this server speaks HTTP/1.1 only (``http2: true``); TLS 1.0 and 1.1 are refused (RFC 8996), and
the inline ``cert``, ``key`` and ``client_ca`` are refused in favour of files. A setting that would
be silently ineffective (``client_ca_file`` without ``client_auth_type``, ``min_version`` above
``max_version``, an empty ``tls_server_config``, a truncated bcrypt hash) is an error too.

The file and the certificates it names are re-read when they change (checked on every new
connection and once a second, like the toolkit's per-connection reload), so rotated certificates take effect
without a restart; a change that does not load, or that would drop basic auth or TLS, is logged and the previous
config stays in force (issue 26: a half-written file must never turn auth off).
Passwords are checked with bcrypt in constant time whether or not the user exists (an unknown user
is checked against a dummy hash of the same cost); successful checks are cached by a SHA-256 of the
credentials, never the password itself, because bcrypt costs ~100 ms by design.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import logging
import os
import re
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from exporter.platform import units
from exporter.platform.configfile import ConfigError, read_yaml, shown_value

if TYPE_CHECKING:
    import ssl

log = logging.getLogger(__name__)

TOP_KEYS = ("tls_server_config", "basic_auth_users", "http_server_config", "rate_limit")
TLS_KEYS = {"cert_file", "key_file", "client_ca_file", "client_auth_type", "min_version", "max_version",
            "cipher_suites", "prefer_server_cipher_suites", "curve_preferences", "client_allowed_sans"}
INLINE_KEYS = {"cert": "cert_file", "key": "key_file", "client_ca": "client_ca_file"}
# ssl and hashlib load OpenSSL (about 6 MiB of RSS): imported only where TLS or basic auth is configured, so
# an exporter without a web config keeps its small footprint. Values: the ssl module's CERT_* and TLSVersion names.
CLIENT_AUTH = {"NoClientCert": "CERT_NONE", "VerifyClientCertIfGiven": "CERT_OPTIONAL",
               "RequireAndVerifyClientCert": "CERT_REQUIRED"}
UNVERIFIED_CLIENT_AUTH = ("RequestClientCert", "RequireAnyClientCert", "RequireClientCert")
VERSIONS = {"TLS12": "TLSv1_2", "TLS13": "TLSv1_3"}
OLD_VERSIONS = ("TLS10", "TLS11")
# Go's names (tls.CipherSuites(), the secure TLS 1.2 suites) -> OpenSSL's.
CIPHERS = {
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA", "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256", "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
}
TLS13_SUITES = ("TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256")
CURVES = {"CurveP256": "prime256v1", "CurveP384": "secp384r1", "CurveP521": "secp521r1", "X25519": "X25519"}
# The toolkit's allowed response headers and, where it restricts them, their values.
HEADERS: dict[str, tuple[str, ...] | None] = {
    "Strict-Transport-Security": None, "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"), "X-XSS-Protection": None, "Content-Security-Policy": None}
BCRYPT_HASH = re.compile(r"\$2[aby]\$[0-9]{2}\$[./A-Za-z0-9]{53}")
MAX_COST = 14  # 15 is ~2 s of CPU per check, 16 ~5 s: a few wrong passwords would hold the server (docs/security.md)
_HTPASSWD_LINE = re.compile(r"[^:\s]+:\$2[aby]\$.*")  # `htpasswd -nB user` prints user:hash: pasted whole
MAX_PASSWORD = 72  # bcrypt's limit: longer passwords never match


@dataclass
class WebConfig:
    """One loaded web config. Immutable once built, except for the cache of successful checks."""

    path: str = ""
    ssl_context: ssl.SSLContext | None = None
    users: dict[str, bytes] = field(default_factory=dict)  # user -> bcrypt hash
    allowed_sans: frozenset[str] | None = None
    headers: dict[str, str] = field(default_factory=dict)  # added to every answer
    rate_limit: tuple[float, int] | None = None  # (seconds per request, burst): the toolkit's rate_limit
    files: tuple[str, ...] = ()  # re-read when one of them changes
    # cost -> a hash of a random password, one per configured cost: every check compares against one
    # hash of each cost (the user's own at its cost), so it costs the same whoever the user is
    _dummies: dict[int, bytes] = field(default_factory=dict)
    _ok: set[bytes] = field(default_factory=set, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _bcrypt: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def cached(self, header: str | None) -> bool:
        """True when ``header`` carries credentials that already passed (no bcrypt: microseconds)."""
        creds = parse_basic(header)
        if creds is None or creds[0] not in self.users:
            return False
        with self._lock:
            return self._key(*creds) in self._ok

    def check(self, header: str | None) -> bool:
        """True when basic auth is off or ``header`` carries valid credentials.

        Takes the same bcrypt work for any well-formed Basic header, whether the user exists or not and
        whatever its hash's cost: one comparison at each configured cost, against the user's own hash at
        its cost and a dummy hash at the others (issue 36: with one dummy of the highest cost, a known
        user with a cheaper hash was refused 87-100 times faster than an unknown one). Checks run one
        at a time (bcrypt is CPU-bound by design), as in the toolkit.
        """
        if not self.users:
            return True
        creds = parse_basic(header)
        if creds is None:
            return False
        user, password = creds
        hashed = self.users.get(user)
        key = self._key(user, password)
        with self._lock:
            if hashed is not None and key in self._ok:
                return True
        import bcrypt  # only when basic auth is configured

        own = _cost(hashed) if hashed is not None else None
        plan = [hashed if cost == own and hashed is not None else dummy for cost, dummy in self._dummies.items()]
        if hashed is not None and own not in self._dummies:  # a config built by hand, without its dummies
            plan.append(hashed)
        ok = False
        with self._bcrypt:
            for target in plan:
                try:
                    matched = bcrypt.checkpw(password[:MAX_PASSWORD], target)
                except ValueError:
                    matched = False
                if target is hashed:
                    ok = matched
        ok = ok and hashed is not None and len(password) <= MAX_PASSWORD
        if ok:
            with self._lock:
                if len(self._ok) > 1024:
                    self._ok.clear()
                self._ok.add(key)
        return ok

    def _key(self, user: str, password: bytes) -> bytes:
        # surrogateescape: a user name that is not UTF-8 is a failed login like any other, never an error
        raw = user.encode("utf-8", "surrogateescape")
        import hashlib

        return hashlib.sha256(raw + b"\0" + password + b"\0" + self.users.get(user, b"")).digest()

    def client_allowed(self, cert: dict[str, Any] | None) -> bool:
        """``client_allowed_sans``: the verified client certificate (``getpeercert()``) names one of them."""
        if self.allowed_sans is None:
            return True
        sans = [_canonical_san(kind, value) for kind, value in (cert or {}).get("subjectAltName", ())]
        return any(s in self.allowed_sans for s in sans)


def _cost(hashed: bytes | str) -> int | None:
    """The cost of a bcrypt hash (``$2y$10$...``: 10), or None when it has none."""
    digits = hashed[4:6]
    text = digits.decode("ascii", "replace") if isinstance(digits, bytes) else digits
    return int(text) if len(text) == 2 and text.isdigit() else None


def parse_basic(header: str | None) -> tuple[str, bytes] | None:
    """(user, password) of a ``Basic`` Authorization header, or None.

    The scheme is matched case-insensitively (RFC 7617 section 2, RFC 9110 section 11.1), as Go's
    ``Request.BasicAuth`` does: ``basic`` and ``BASIC`` are the same scheme.
    """
    if not header or len(header) < 6 or header[:6].lower() != "basic ":
        return None
    try:
        raw = base64.b64decode(header[6:].strip(), validate=True)
    except (ValueError, binascii.Error):
        return None
    user, sep, password = raw.partition(b":")
    if not sep:
        return None
    return user.decode("utf-8", "surrogateescape"), password


def _canonical_san(kind: str, value: str) -> str:
    if kind == "IP Address":  # Python writes IPv6 in full upper case; Go (and the allowed list) compressed
        try:
            return str(ipaddress.ip_address(value.strip()))
        except ValueError:
            return value
    return value


def _fail(path: str, key: str, value: object, allowed: str) -> ConfigError:
    shown = shown_value(value) if key != "basic_auth_users" else "'<hidden>'"
    return ConfigError(f"web config {path}: invalid {key} = {shown}: {allowed}")


def load(path: str) -> WebConfig:
    doc = read_yaml(path, "web config")
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise ConfigError(f"web config {path}: expected a mapping at the top level")
    unknown = [k for k in doc if k not in TOP_KEYS]
    if unknown:
        raise ConfigError(f"web config {path}: unknown key {str(unknown[0])!r}; expected {', '.join(TOP_KEYS)}")
    cfg = WebConfig(path=path, files=(path,))
    base = os.path.dirname(path)
    if "tls_server_config" in doc:
        cfg.ssl_context, cfg.allowed_sans, files = _tls_context(path, base, doc["tls_server_config"])
        cfg.files += files
    if "http_server_config" in doc:
        cfg.headers = _http_config(path, doc["http_server_config"])
    if "rate_limit" in doc:
        cfg.rate_limit = _rate_limit(path, doc["rate_limit"])
    if "basic_auth_users" in doc:
        _users(path, doc["basic_auth_users"], cfg)
    return cfg


def _users(path: str, users: Any, cfg: WebConfig) -> None:
    if isinstance(users, str) and _HTPASSWD_LINE.fullmatch(users.strip()):
        raise ConfigError(f"web config {path}: basic_auth_users holds an htpasswd line (user:hash); write it as "
                          "a mapping, one user per line: '  <user>: <hash>' (a space after the colon, no quotes "
                          "needed)")
    if not isinstance(users, dict) or not users:
        raise _fail(path, "basic_auth_users", users, "expected a mapping of user name to bcrypt hash")
    for user, hashed in users.items():
        name = str(user)
        if ":" in name or not name.isprintable():
            raise ConfigError(f"web config {path}: basic_auth_users: a user name cannot hold ':' or control "
                              "characters")
        if isinstance(hashed, str) and _HTPASSWD_LINE.fullmatch(hashed.strip()):
            raise ConfigError(f"web config {path}: basic_auth_users.{name}: the value is an htpasswd line "
                              "(user:hash): drop the user name and colon before the hash ($2y$...)")
        if not isinstance(hashed, str) or not BCRYPT_HASH.fullmatch(hashed):
            # a hash cut short used to be accepted, and every request then got 401 with nothing logged
            raise ConfigError(f"web config {path}: basic_auth_users.{name}: expected a whole bcrypt hash "
                              f"($2y$10$ and 53 characters, from htpasswd -nBC 10; cost 4..{MAX_COST})")
        cost = int(hashed[4:6])
        if not 4 <= cost <= MAX_COST:
            raise ConfigError(f"web config {path}: basic_auth_users.{name}: bcrypt cost {cost} is outside "
                              f"4..{MAX_COST} (each check of cost 15 takes seconds of CPU: a few wrong passwords "
                              "would hold the server; htpasswd -nBC 10)")
        cfg.users[name] = hashed.encode()
    try:
        import bcrypt
    except ImportError:  # fail at start-up, not at the first request
        raise ConfigError("basic_auth_users needs the bcrypt package (pip install bcrypt)") from None
    for cost in sorted({int(h[4:6]) for h in cfg.users.values()}):
        cfg._dummies[cost] = bcrypt.hashpw(os.urandom(16).hex().encode(), bcrypt.gensalt(rounds=cost))


def _http_config(path: str, http: Any) -> dict[str, str]:
    if not isinstance(http, dict):
        raise _fail(path, "http_server_config", http, "expected a mapping with http2 and headers")
    unknown = set(map(str, http)) - {"http2", "headers"}
    if unknown:
        raise ConfigError(f"web config {path}: unknown key http_server_config.{sorted(unknown)[0]}")
    if "http2" in http and http["http2"] is not False:
        raise _fail(path, "http_server_config.http2", http["http2"],
                    "this server speaks HTTP/1.1 only: set false or leave it out")
    headers = http.get("headers") or {}
    if not isinstance(headers, dict):
        raise _fail(path, "http_server_config.headers", headers, "expected a mapping of header to value")
    out: dict[str, str] = {}
    for name, value in headers.items():
        if name not in HEADERS:
            raise ConfigError(f"web config {path}: http_server_config.headers: {str(name)!r} cannot be configured; "
                              f"allowed: {', '.join(HEADERS)}")
        allowed = HEADERS[name]
        if not isinstance(value, str) or not value.isprintable() or (allowed and value not in allowed):
            raise _fail(path, f"http_server_config.headers.{name}", value,
                        f"expected one of {', '.join(allowed)}" if allowed else "expected one line of text")
        out[name] = value
    return out


def _rate_limit(path: str, rl: Any) -> tuple[float, int] | None:
    if not isinstance(rl, dict) or set(map(str, rl)) - {"interval", "burst"}:
        raise _fail(path, "rate_limit", rl, "expected a mapping with interval (e.g. 100ms) and burst")
    interval, burst = rl.get("interval", "0s"), rl.get("burst", 0)
    try:
        seconds = units.parse_duration(interval, bare_seconds=False) if isinstance(interval, str) else -1.0
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds <= 86400:
        raise _fail(path, "rate_limit.interval", interval, "expected a duration such as 100ms or 1s")
    if seconds == 0:  # the toolkit's "no rate limit"
        return None
    if isinstance(burst, bool) or not isinstance(burst, int) or not 1 <= burst <= 1_000_000:
        raise _fail(path, "rate_limit.burst", burst, "expected an integer in 1..1000000 (0 would refuse everything)")
    return seconds, burst


def _no_password() -> bytes:
    return b""  # an encrypted key_file fails to load instead of prompting on a terminal


def _tls_context(path: str, base: str, tls: Any) -> tuple[ssl.SSLContext, frozenset[str] | None, tuple[str, ...]]:
    import ssl

    if not isinstance(tls, dict) or not tls:  # `tls_server_config: []` or empty must not mean plain HTTP
        raise _fail(path, "tls_server_config", tls, "expected a mapping with cert_file and key_file")
    for k in tls:
        if k in INLINE_KEYS:
            raise ConfigError(f"web config {path}: tls_server_config.{k} (inline PEM) is not supported; "
                              f"use {INLINE_KEYS[k]}")
        if k not in TLS_KEYS:
            raise ConfigError(f"web config {path}: unknown key tls_server_config.{k}")

    def file(key: str) -> str | None:
        v = tls.get(key)
        if v is None:
            return None
        if not isinstance(v, str) or not v:
            raise _fail(path, f"tls_server_config.{key}", v, "expected a file path")
        return os.path.join(base, v)  # relative to the web config's directory, as in the toolkit

    cert, key, ca = file("cert_file"), file("key_file"), file("client_ca_file")
    if not cert or not key:
        raise ConfigError(f"web config {path}: tls_server_config needs both cert_file and key_file")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        ctx.load_cert_chain(cert, key, password=_no_password)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"web config {path}: cannot load cert_file {cert} / key_file {key}: {exc}") from None
    lo, hi = (_version(path, tls, opt, d) for opt, d in (("min_version", "TLS12"), ("max_version", "TLS13")))
    if lo > hi:
        raise ConfigError(f"web config {path}: tls_server_config.min_version {tls.get('min_version')} is above "
                          f"max_version {tls.get('max_version')}")
    ctx.minimum_version, ctx.maximum_version = lo, hi
    _ciphers(path, ctx, tls)
    _curves(path, ctx, tls.get("curve_preferences"))
    auth = tls.get("client_auth_type", "NoClientCert")
    if not isinstance(auth, str):
        raise _fail(path, "tls_server_config.client_auth_type", auth, f"expected one of {', '.join(CLIENT_AUTH)}")
    if auth in UNVERIFIED_CLIENT_AUTH:
        raise _fail(path, "tls_server_config.client_auth_type", auth,
                    "Python's ssl cannot ask for a client certificate without verifying it: use "
                    "VerifyClientCertIfGiven or RequireAndVerifyClientCert with client_ca_file")
    if auth not in CLIENT_AUTH:
        raise _fail(path, "tls_server_config.client_auth_type", auth, f"expected one of {', '.join(CLIENT_AUTH)}")
    if ca and auth == "NoClientCert":
        raise ConfigError(f"web config {path}: client_ca_file without client_auth_type: set client_auth_type "
                          "RequireAndVerifyClientCert (or VerifyClientCertIfGiven), or remove client_ca_file")
    if auth != "NoClientCert":
        if not ca:
            raise ConfigError(f"web config {path}: client_auth_type {auth} needs client_ca_file")
        try:
            ctx.load_verify_locations(cafile=ca)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"web config {path}: cannot load client_ca_file {ca}: {exc}") from None
        ctx.verify_mode = getattr(ssl, CLIENT_AUTH[auth])
    sans = _allowed_sans(path, tls.get("client_allowed_sans"), auth)
    return ctx, sans, tuple(f for f in (cert, key, ca) if f)


def _version(path: str, tls: dict[str, Any], opt: str, default: str) -> ssl.TLSVersion:
    v = tls.get(opt, default)
    if not isinstance(v, str):
        raise _fail(path, f"tls_server_config.{opt}", v, f"expected one of {', '.join(VERSIONS)}")
    if v in OLD_VERSIONS:
        raise _fail(path, f"tls_server_config.{opt}", v, "TLS 1.0 and 1.1 are not offered (RFC 8996): use TLS12")
    if v not in VERSIONS:
        raise _fail(path, f"tls_server_config.{opt}", v, f"expected one of {', '.join(VERSIONS)}")
    import ssl

    return getattr(ssl.TLSVersion, VERSIONS[v])


def _names(path: str, key: str, v: Any) -> list[str] | None:
    if v is None:
        return None
    if not isinstance(v, list) or not v or not all(isinstance(x, str) for x in v):
        raise _fail(path, f"tls_server_config.{key}", v, "expected a list of names")
    return v


def _ciphers(path: str, ctx: ssl.SSLContext, tls: dict[str, Any]) -> None:
    import ssl

    prefer = tls.get("prefer_server_cipher_suites", True)  # Go's and the toolkit's default
    if not isinstance(prefer, bool):
        raise _fail(path, "tls_server_config.prefer_server_cipher_suites", prefer, "expected true or false")
    if prefer:
        ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    else:
        ctx.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE
    names = _names(path, "cipher_suites", tls.get("cipher_suites"))
    if names is None:
        return
    for n in names:
        if n in TLS13_SUITES:
            raise _fail(path, "tls_server_config.cipher_suites", n,
                        "TLS 1.3 suites cannot be chosen (in Go neither): list TLS 1.2 suites only")
        if n not in CIPHERS:
            raise _fail(path, "tls_server_config.cipher_suites", n, f"expected Go names such as {next(iter(CIPHERS))}")
    try:
        ctx.set_ciphers(":".join(CIPHERS[n] for n in names))
    except ssl.SSLError:
        raise _fail(path, "tls_server_config.cipher_suites", names, "none is available in this OpenSSL") from None
    have = {c["name"] for c in ctx.get_ciphers()}
    missing = [n for n in names if CIPHERS[n] not in have]
    if missing:
        raise _fail(path, "tls_server_config.cipher_suites", missing[0], "not available in this OpenSSL")


def _curves(path: str, ctx: ssl.SSLContext, v: Any) -> None:
    names = _names(path, "curve_preferences", v)
    if names is None:
        return
    bad = [n for n in names if n not in CURVES]
    if bad:
        raise _fail(path, "tls_server_config.curve_preferences", bad[0], f"expected one of {', '.join(CURVES)}")
    if len(names) > 1:
        raise _fail(path, "tls_server_config.curve_preferences", names,
                    "Python's ssl can restrict the key exchange to one curve only: list one")
    ctx.set_ecdh_curve(CURVES[names[0]])  # with OpenSSL 3 this sets the only group, TLS 1.3 included


def _allowed_sans(path: str, v: Any, auth: str) -> frozenset[str] | None:
    names = _names(path, "client_allowed_sans", v)
    if names is None:
        return None
    if auth == "NoClientCert":
        raise ConfigError(f"web config {path}: client_allowed_sans needs client_auth_type "
                          "RequireAndVerifyClientCert and client_ca_file")
    return frozenset(_canonical_san("IP Address", n) for n in names)


def _stamp(files: tuple[str, ...]) -> tuple[tuple[int, int, int, int] | None, ...]:
    out: list[tuple[int, int, int, int] | None] = []
    for f in files:
        try:
            st = os.stat(f)  # follows symlinks: a Kubernetes secret's ..data swap changes the inode
            out.append((st.st_mtime_ns, st.st_size, st.st_ino, st.st_dev))
        except OSError:
            out.append(None)
    return tuple(out)


def _weakens(old: WebConfig, new: WebConfig) -> str:
    """Why ``new`` would serve with less protection than ``old`` ("" when it does not).

    A reload never fails open: ``cat > web.yml`` leaves an empty or cut file for a moment, which
    parses as "no auth" or "no TLS". Dropping them, or lowering the client-certificate check, needs
    a restart, where the operator sees the new config start.
    """
    if old.users and not new.users:
        return "drops basic_auth_users"
    if (new.ssl_context is None) != (old.ssl_context is None):
        return "switches between http and https, which needs a restart"
    if old.ssl_context is not None and new.ssl_context is not None:
        if new.ssl_context.verify_mode < old.ssl_context.verify_mode:
            return "lowers client_auth_type"
        if old.allowed_sans is not None and new.allowed_sans is None:
            return "drops client_allowed_sans"
    return ""


class LiveWebConfig:
    """The web config in force: re-loaded when its file or a certificate it names changes.

    ``current()`` costs a few ``stat`` calls. A change that does not load (a half-written
    certificate, a bad edit) or that would weaken protection (no basic_auth_users, no TLS, a lower
    client-certificate check: see :func:`_weakens`) is logged once, as one error line, and the
    previous config stays in force.
    """

    def __init__(self, cfg: WebConfig) -> None:
        self._cfg = cfg
        self._stamp = _stamp(cfg.files)
        self._lock = threading.Lock()

    def current(self, block: bool = True) -> WebConfig:
        """The config in force, re-loaded first if a file changed (``block=False``: in the background,
        for the I/O thread, which must never wait on a file or a bcrypt hash)."""
        if _stamp(self._cfg.files) != self._stamp:
            if block:
                self.reload()
            elif not self._lock.locked():
                threading.Thread(target=self.reload, name="web-config-reload", daemon=True).start()
        return self._cfg

    def reload(self, why: str = "changed on disk") -> bool:
        """Load the file again; True when the new config is in force."""
        with self._lock:
            old = self._cfg
            stamp = _stamp(old.files)
            if why == "changed on disk" and stamp == self._stamp:
                return True  # another thread did it meanwhile
            try:
                new = load(old.path)
            except ConfigError as exc:
                if stamp != self._stamp or why != "changed on disk":
                    log.error("web config %s (%s) cannot be used, keeping the previous one: %s", old.path, why, exc)
                self._stamp = stamp
                return False
            weaker = _weakens(old, new)
            if weaker:
                log.error("web config %s (%s) %s: keeping the previous one (a half-written file looks the same; "
                          "to change this on purpose, restart)", old.path, why, weaker)
                self._stamp = stamp
                return False
            # the stamp taken BEFORE the load (issue 36): a file that changed while it loaded (a second
            # quick edit, a Secret's ..data swap) differs from it, so the next check loads again. A
            # stamp taken now would match that later file and its change would never be applied. When
            # the new config names other files, their stamp cannot match this one: loaded once more.
            self._cfg, self._stamp = new, stamp
            log.info("web config %s reloaded (%s)", old.path, why)
            return True
