"""gpu-exporter: vendor-neutral GPU telemetry for Kubernetes."""

__version__ = "0.1.0"
