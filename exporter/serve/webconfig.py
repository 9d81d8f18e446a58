"""``--web.config.file``: TLS and basic auth in the Prometheus exporter-toolkit format.

Existing users of node_exporter and friends can reuse their file::

    tls_server_config:
      cert_file: /etc/tls/tls.crt
      key_file: /etc/tls/tls.key
      client_ca_file: /etc/tls/ca.crt          # optional: mutual TLS
      client_auth_type: RequireAndVerifyClientCert
      min_version: TLS12
    basic_auth_users:
      prometheus: $2y$10$...                    # bcrypt hash (htpasswd -nBC 10)

Supported keys are validated up front; an unknown key or a bad value is a one-line error
naming it. Passwords are checked with bcrypt; successful checks are cached (by a SHA-256
of the credentials, never the password itself) because bcrypt costs ~100 ms by design.
``/healthz`` stays open so that kubelet liveness probes need no credentials.
"""

from __future__ import annotations

import base64
import hashlib
import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exporter.serve.config import ConfigError

TLS_KEYS = {"cert_file", "key_file", "client_ca_file", "client_auth_type", "min_version", "max_version",
            "cipher_suites", "prefer_server_cipher_suites", "curve_preferences", "client_allowed_sans"}
CLIENT_AUTH = {"NoClientCert", "RequestClientCert", "RequireAnyClientCert", "VerifyClientCertIfGiven",
               "RequireAndVerifyClientCert"}
VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1, "TLS12": ssl.TLSVersion.TLSv1_2,
            "TLS13": ssl.TLSVersion.TLSv1_3}


@dataclass
class WebConfig:
    ssl_context: ssl.SSLContext | None = None
    users: dict[str, bytes] = field(default_factory=dict)  # user -> bcrypt hash
    _ok: set[bytes] = field(default_factory=set, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def check(self, header: str | None) -> bool:
        """True when basic auth is off or ``header`` carries valid credentials."""
        if not self.users:
            return True
        if not header or not header.startswith("Basic "):
            return False
        try:
            user, _, password = base64.b64decode(header[6:].strip(), validate=True).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        hashed = self.users.get(user)
        if hashed is None:
            return False
        key = hashlib.sha256(user.encode() + b"\0" + password.encode() + b"\0" + hashed).digest()
        with self._lock:
            if key in self._ok:
                return True
        import bcrypt  # only when basic auth is configured

        try:
            ok = bcrypt.checkpw(password.encode(), hashed)
        except ValueError:
            ok = False
        if ok:
            with self._lock:
                if len(self._ok) > 1024:
                    self._ok.clear()
                self._ok.add(key)
        return ok


def _fail(path: str, key: str, value: object, allowed: str) -> ConfigError:
    shown = value if key != "basic_auth_users" else "<hidden>"
    return ConfigError(f"web config {path}: invalid {key} = {shown!r}: {allowed}")


def load(path: str) -> WebConfig:
    import yaml

    try:
        doc = yaml.safe_load(Path(path).read_text()) or {}
    except OSError as exc:
        raise ConfigError(f"cannot read web config {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError:
        raise ConfigError(f"web config {path}: not valid YAML") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"web config {path}: expected a mapping at the top level")
    unknown = set(doc) - {"tls_server_config", "basic_auth_users", "http_server_config"}
    if unknown:
        raise ConfigError(f"web config {path}: unknown key {sorted(unknown)[0]!r}; "
                          "expected tls_server_config, basic_auth_users, http_server_config")
    cfg = WebConfig()
    tls = doc.get("tls_server_config")
    if tls:
        cfg.ssl_context = _tls_context(path, tls)
    users = doc.get("basic_auth_users") or {}
    if not isinstance(users, dict):
        raise _fail(path, "basic_auth_users", users, "expected a mapping of user name to bcrypt hash")
    for user, hashed in users.items():
        if not isinstance(hashed, str) or not hashed.startswith(("$2a$", "$2b$", "$2y$")):
            raise ConfigError(f"web config {path}: basic_auth_users.{user}: expected a bcrypt hash ($2y$...)")
        cfg.users[str(user)] = hashed.encode()
    if cfg.users:
        try:
            import bcrypt  # noqa: F401 - fail at start-up, not at the first request
        except ImportError:
            raise ConfigError("basic_auth_users needs the bcrypt package (pip install bcrypt)") from None
    return cfg


def _tls_context(path: str, tls: Any) -> ssl.SSLContext:
    if not isinstance(tls, dict):
        raise _fail(path, "tls_server_config", tls, "expected a mapping")
    unknown = set(tls) - TLS_KEYS
    if unknown:
        raise ConfigError(f"web config {path}: unknown key tls_server_config.{sorted(unknown)[0]}")
    cert, key = tls.get("cert_file"), tls.get("key_file")
    if not cert or not key:
        raise ConfigError(f"web config {path}: tls_server_config needs both cert_file and key_file")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"web config {path}: cannot load cert_file {cert} / key_file {key}: {exc}") from None
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    for opt in ("min_version", "max_version"):
        if opt in tls:
            v = VERSIONS.get(str(tls[opt]))
            if v is None:
                raise _fail(path, f"tls_server_config.{opt}", tls[opt], f"expected one of {', '.join(VERSIONS)}")
            if opt == "min_version":
                ctx.minimum_version = v
            else:
                ctx.maximum_version = v
    auth = str(tls.get("client_auth_type", "NoClientCert"))
    if auth not in CLIENT_AUTH:
        raise _fail(path, "tls_server_config.client_auth_type", auth,
                    f"expected one of {', '.join(sorted(CLIENT_AUTH))}")
    ca = tls.get("client_ca_file")
    if ca:
        try:
            ctx.load_verify_locations(cafile=ca)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"web config {path}: cannot load client_ca_file {ca}: {exc}") from None
    if auth in ("RequireAndVerifyClientCert", "RequireAnyClientCert"):
        if not ca:
            raise ConfigError(f"web config {path}: client_auth_type {auth} needs client_ca_file")
        ctx.verify_mode = ssl.CERT_REQUIRED
    elif auth in ("VerifyClientCertIfGiven", "RequestClientCert") and ca:
        ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx
