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


def require(module: str, who: str) -> None:
    """Import ``module`` once, or raise :class:`MissingExtra` naming the extra that installs it."""
    try:
        importlib.import_module(module)
    except ImportError:
        extra = EXTRAS[module]
        raise MissingExtra(f"{who} needs the {module} package, which the '{extra}' extra installs: "
                           f"pip install 'gpu-exporter[{extra}]'") from None
