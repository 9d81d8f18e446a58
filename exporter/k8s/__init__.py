"""Kubernetes integration: GPU-to-pod attribution from the kubelet pod-resources API.

Nothing here imports grpc at module import time; see :mod:`exporter.k8s.podresources`.
"""
