"""``gpu-exporter profile``: read GPU series back from Prometheus, classify each GPU's usage
pattern, and annotate the Nodes (docs/profiler.md, docs/annotations.md).

Modules: ``prom`` (HTTP API client), ``queries`` (the cycle's PromQL and snapshot),
``classify`` (pure statistics), ``plan`` (annotations, hysteresis, owned keys; pure),
``annotate`` (Node reads and merge patches), ``loop`` (cycle, loop, /metrics, /healthz),
``main`` (flags; ``run(argv)`` is the entry point).
"""
