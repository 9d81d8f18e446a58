"""``python -m exporter.backends``: print the support table; ``--write-docs`` regenerates docs/metrics.md and
the backend names of the README, docs/alerts.md, docs/cli.md and docs/python-api.md."""

from __future__ import annotations

import sys

from exporter.backends import DOCS, EXAMPLE, NAMED_IN, render_docs, render_example, render_names, support_table

if sys.argv[1:] == ["--write-docs"]:
    DOCS.write_text(render_docs(DOCS.read_text()))
    if EXAMPLE.exists():
        EXAMPLE.write_text(render_example(EXAMPLE.read_text()))
    for path in (p for p in NAMED_IN if p.exists()):  # a copy of the package may carry only metrics.md
        path.write_text(render_names(path.read_text()))
else:
    print(support_table(), end="")
