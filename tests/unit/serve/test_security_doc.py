"""Issue 38, item 15: docs/security.md's complete web config, with a hash made by its own command
(Python's bcrypt, no apache2-utils), is one the exporter serves: TLS on, the password wanted."""

from __future__ import annotations

import base64
import re
import ssl
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

from tests.harness.exporter import REPO, DaemonProcess
from tests.harness.poll import wait_until

DOC = (REPO / "docs" / "security.md").read_text()
SECTION = DOC[DOC.index("### A complete web config"):DOC.index("## Changes without a restart")]


def _hash_command() -> str:
    (line,) = [ln for ln in SECTION.splitlines() if "bcrypt.hashpw" in ln]
    # the documented pipeline's python part, fed the password on stdin as the printf does
    part = line.split("| ", 1)[1].split("; unset", 1)[0]
    return part.replace(".venv/bin/python", str(REPO / ".venv" / "bin" / "python"), 1)


def _get(port: int, auth: str | None) -> int:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    req = urllib.request.Request(f"https://127.0.0.1:{port}/metrics")
    if auth:
        req.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=10, context=ctx) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_the_documented_web_config_serves_with_the_documented_hash(tmp_path: Path) -> None:
    made = subprocess.run(["bash", "-c", _hash_command()], input="s3cret pass\n", capture_output=True, text=True,
                          timeout=60, check=False)
    assert made.returncode == 0, made.stderr
    digest = made.stdout.strip()
    assert re.fullmatch(r"\$2[aby]\$10\$[./A-Za-z0-9]{53}", digest), digest
    (yaml_block,) = re.findall(r"```yaml\n(.*?)```", SECTION, re.S)
    text = re.sub(r"\$2b\$10\$REPLACE\S+", f"'{digest}'", yaml_block)
    assert digest in text
    (tmp_path / "web-config.yml").write_text(text)
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-days", "2", "-subj", "/CN=gpu-exporter", "-keyout", "tls.key", "-out", "tls.crt"],
                   cwd=tmp_path, check=True, capture_output=True, timeout=60)
    with DaemonProcess("serve", ["--backend", "simulated", "--web.config.file", str(tmp_path / "web-config.yml")],
                       wait=False) as ex:
        wait_until(lambda: _status(ex.port, "prometheus:s3cret pass") == 200, 30, what="the exporter over TLS")
        assert _get(ex.port, None) == 401
        assert _get(ex.port, "prometheus:wrong") == 401


def _status(port: int, auth: str) -> int | None:
    try:
        return _get(port, auth)
    except OSError:
        return None


def test_the_htpasswd_prefix_is_explained() -> None:
    assert "htpasswd -nBC 10 prometheus | cut -d: -f2-" in SECTION
    assert "apache2-utils" in SECTION and "bcrypt" in SECTION
