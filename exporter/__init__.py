"""gpu-exporter: vendor-neutral GPU telemetry for Kubernetes."""

from exporter.core.version import VERSION

__version__ = VERSION
