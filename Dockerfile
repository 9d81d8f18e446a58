# gpu-exporter container image.
#
#   make image                                                                # both images
#   docker build -t gpu-exporter:0.1.0 .                                      # NVIDIA and others
#   docker build --target runtime-rocm -t gpu-exporter-rocm:0.1.0 .           # AMD (adds ROCm's SMI libraries)
#
# Needs BuildKit (the default since Docker 23; podman and buildah too): it builds only the
# stages the target uses, so the default build never pulls the ROCm image. The project's
# machines have no container engine, so this file is checked by hadolint and by the tests of
# tests/e2e/test_deploy.py ("the image"), and by review.

# Base images by digest: a tag moves, a digest does not. scripts/refresh-base-digests
# rewrites the digests below from the registry (docs/deploy.md, "Base image digests").
# Debian release pinned so that the apt versions below stay installable.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:a36c24f9cbdf4fd0f52d67f0823eeac19c2028c637cecc392d97f980d4fec56b
# ONE ROCm release for the AMD image: the ROCm image that provides libamd_smi.so and
# librocm-core.so, and the amdsmi wheel, which binds every libamd_smi symbol at import and
# needs the library of its own release. pyproject.toml's amdsmi requirement must admit it
# (tests/e2e/test_deploy.py checks all three). Another release: docs/deploy.md.
ARG ROCM_RELEASE=7.0.2
ARG ROCM_IMAGE=rocm/dev-ubuntu-22.04:${ROCM_RELEASE}

# ---- builder: build the wheel and install it with its runtime dependencies into a venv ----
FROM ${PYTHON_IMAGE} AS builder
ARG ROCM_RELEASE
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml ./
COPY exporter ./exporter
# pip builds a wheel from the source tree and installs it (not editable); [k8s] adds the
# gRPC client for pod attribution; the amdsmi wheel is pinned to ROCM_RELEASE. pip and
# setuptools are then removed from the venv: nothing at run time installs packages.
RUN python -m venv /opt/gpu-exporter \
 && /opt/gpu-exporter/bin/pip install --no-cache-dir ".[k8s]" "amdsmi==${ROCM_RELEASE}" \
 && /opt/gpu-exporter/bin/pip uninstall --yes pip setuptools

# ---- runtime-base: Python, the venv, a non-root user; no compilers, no pip ----
FROM ${PYTHON_IMAGE} AS runtime-base
# Numeric UID/GID so that Kubernetes can verify runAsNonRoot. setuid/setgid bits are
# stripped because the AMD overlay runs privileged, where no_new_privs cannot be set.
RUN groupadd --system --gid 65532 gpu-exporter \
 && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin gpu-exporter \
 && find / -xdev -perm /6000 -type f -exec chmod a-s {} +
COPY --from=builder /opt/gpu-exporter /opt/gpu-exporter
ENV PATH=/opt/gpu-exporter/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
LABEL org.opencontainers.image.title="gpu-exporter" \
      org.opencontainers.image.description="Vendor-neutral GPU metrics for Prometheus" \
      org.opencontainers.image.licenses="Apache-2.0"
USER 65532:65532
EXPOSE 9400
# No HEALTHCHECK: one image serves two commands on different ports (serve :9400,
# profile :9401), and Kubernetes ignores HEALTHCHECK in favour of the manifests' probes.
ENTRYPOINT ["gpu-exporter"]
# serve listens on 127.0.0.1 by default; in a container the scrapes arrive on its own address.
CMD ["serve", "--address=0.0.0.0"]

# ---- rocm: source of the AMD SMI libraries (only pulled for --target runtime-rocm) ----
FROM ${ROCM_IMAGE} AS rocm

# ---- runtime-rocm: runtime-base plus libamd_smi.so, librocm-core.so, librocm_smi64.so, rocm-smi ----
FROM runtime-base AS runtime-rocm
USER 0:0
# librocm-core.so answers amdsmi_get_rocm_version(); .info/version names the release.
COPY --from=rocm /opt/rocm/lib/libamd_smi.so* /opt/rocm/lib/librocm_smi64.so* /opt/rocm/lib/librocm-core.so* /opt/rocm/lib/
COPY --from=rocm /opt/rocm/.info/version /opt/rocm/.info/version
COPY --from=rocm /opt/rocm/libexec/rocm_smi /opt/rocm/libexec/rocm_smi
# libamd_smi.so links libdrm and libdrm_amdgpu (bookworm's versions below); check the built
# image with ldd (docs/deploy.md). rocm-smi is a Python script that finds its modules next
# to its real path, hence the symlink. The build fails when the library and the wheel come
# from different ROCm releases.
RUN apt-get update \
 && apt-get install --yes --no-install-recommends libdrm2=2.4.114-1+b1 libdrm-amdgpu1=2.4.114-1+b1 \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /opt/rocm/bin \
 && ln -s ../libexec/rocm_smi/rocm_smi.py /opt/rocm/bin/rocm-smi \
 && find / -xdev -perm /6000 -type f -exec chmod a-s {} + \
 && python -c 'import importlib.metadata as m, sys; w = m.version("amdsmi"); r = open("/opt/rocm/.info/version").read().strip(); sys.exit(0 if r == w or r.startswith(w + "-") else f"amdsmi wheel {w} != ROCm library {r}")'
ENV ROCM_PATH=/opt/rocm \
    PATH=/opt/gpu-exporter/bin:/opt/rocm/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LD_LIBRARY_PATH=/opt/rocm/lib
USER 65532:65532

# ---- runtime (default target): the image for NVIDIA nodes and everything else ----
FROM runtime-base AS runtime
