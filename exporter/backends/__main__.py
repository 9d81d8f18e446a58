"""``python -m exporter.backends``: print the support table; ``--write-docs`` regenerates docs/metrics.md."""

from __future__ import annotations

import sys

from exporter.backends import DOCS, render_docs, support_table

if sys.argv[1:] == ["--write-docs"]:
    DOCS.write_text(render_docs(DOCS.read_text()))
else:
    print(support_table(), end="")
