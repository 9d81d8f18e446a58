"""Generated protobuf/gRPC modules for the kubelet pod-resources v1 API (see generate.sh)."""
