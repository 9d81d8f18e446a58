"""Test harnesses for the outside world: fake NVML fleet, Prometheus, kube API, kubelet."""
