"""Kubernetes integration: GPU-to-pod attribution from the kubelet pod-resources API, DRA devices
from this node's ResourceSlices (:mod:`exporter.k8s.resourceslices`), per-process attribution.

Nothing here imports grpc or the kubernetes client at module import time; see
:mod:`exporter.k8s.podresources`.
"""
