"""Single-machine tools for benchmark engineers: ``snapshot``, ``diff``, ``record``, ``pick``.

Each module has ``main(argv) -> exit status`` and reads the GPUs through the exporter's own
backends and :class:`~exporter.core.engine.Engine` (see :mod:`exporter.tools.audit`).
"""
