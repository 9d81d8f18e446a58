"""Optional dependencies (pyproject extras): one check, one line naming the extra to install.

`make run` installs only what serving needs; the kubernetes client, for example, comes with the
``k8s`` extra (the image, ``make test`` and the README's profiler install line bring it).
"""

from __future__ import annotations

import importlib

# The extra that brings each optional package.
EXTRAS = {"kubernetes": "k8s", "grpc": "k8s", "google.protobuf": "k8s"}


class MissingExtra(Exception):
    """An optional package is not installed. ``str()`` is the one-line message for the user."""


def hint(module: str, who: str) -> str:
    """The one line saying how to install the extra that brings ``module``. The package is not on
    PyPI: a checkout installs it with pip -e, a release from the wheel attached to it."""
    extra = EXTRAS[module]
    return (f"{who} needs the {module} package, which the '{extra}' extra installs (gpu-exporter is not on PyPI): "
            f"from a checkout, .venv/bin/pip install -e '.[{extra}]'; from a release, "
            f"pip install './gpu_exporter-<version>-py3-none-any.whl[{extra}]' (the wheel attached to the release)")


def require(module: str, who: str) -> None:
    """Import ``module`` once, or raise :class:`MissingExtra` naming the extra that installs it."""
    try:
        importlib.import_module(module)
    except ImportError:
        raise MissingExtra(hint(module, who)) from None
