"""Issue 28, finding 10: JSON writes whole numbers as integers. /stats and ``snapshot --json`` gave
``85899345920.0`` and ``"generation": 5.0``, which typed decoders (Go's int64, serde's u64) reject.
jsonschema accepts 5.0 as an integer, so the raw text is checked: every value that the schema
types as an integer must be written without a fraction."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from exporter.serve.api_schema import STATS
from tests.harness.exporter import REPO, ExporterProcess


class Written(float):
    """A JSON number that was written with a fraction or an exponent."""


def _integer_fields_written_as_floats(doc: Any, schema: dict[str, Any], where: str = "") -> list[str]:
    bad: list[str] = []
    types = schema.get("type", [])
    types = [types] if isinstance(types, str) else types
    if "integer" in types and isinstance(doc, Written):
        bad.append(f"{where} = {float(doc)!r}")
    if isinstance(doc, dict):
        for key, value in doc.items():
            sub = schema.get("properties", {}).get(key) or schema.get("additionalProperties")
            if isinstance(sub, dict):
                bad += _integer_fields_written_as_floats(value, sub, f"{where}.{key}")
    elif isinstance(doc, list) and isinstance(schema.get("items"), dict):
        for i, value in enumerate(doc):
            bad += _integer_fields_written_as_floats(value, schema["items"], f"{where}[{i}]")
    return bad


def _check(text: str) -> None:
    doc = json.loads(text, parse_float=lambda s: Written(s))
    assert doc["gpus"], "no GPU in the document"
    integers = [g["memory_total_bytes"] for g in doc["gpus"]] + [g["pcie"]["generation"] for g in doc["gpus"]]
    assert all(type(v) is int for v in integers if v is not None), integers
    bad = _integer_fields_written_as_floats(doc, STATS)
    assert not bad, f"integers written as floats: {bad}"


def test_stats_writes_integers_as_integers() -> None:
    with ExporterProcess(["--backend", "simulated"]) as ex:
        status, body, _ = ex.get("/stats")
        assert status == 200
        _check(body.decode())


def test_snapshot_json_writes_integers_as_integers() -> None:
    proc = subprocess.run([sys.executable, "-m", "exporter", "snapshot", "--json", "--backend", "simulated",
                           "--window", "0"], cwd=REPO, env=dict(os.environ), capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    _check(proc.stdout)
