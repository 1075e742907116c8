# syntax=docker/dockerfile:1
# orthoserve container images, built with the same command as README.md (./scripts/setup.sh):
#   docker build --target cpu -t orthoserve:cpu .     # OpenBLAS backend on debian:bookworm
#   docker build --target gpu -t orthoserve:gpu .     # cuBLAS + NCCL on the CUDA 13 runtime image
#                                                     # (nodes need an NVIDIA driver >= 580, see below)
# tests/deploy/deploy_checks.py (run by scripts/check_deploy.sh) fails when the build steps here and
# in README.md drift apart. See docs/operations.md.

# Pinned bases; bump deliberately (and rebuild both targets).
ARG DEBIAN_IMAGE=debian:bookworm-20251229-slim
ARG CUDA_DEVEL_IMAGE=nvidia/cuda:13.0.2-devel-ubuntu24.04
ARG CUDA_RUNTIME_IMAGE=nvidia/cuda:13.0.2-runtime-ubuntu24.04
ARG ORTHOSERVE_UID=10001

# ---- CPU build: Debian 12, the platform the project targets -----------------------------------
FROM ${DEBIAN_IMAGE} AS build-cpu
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive
WORKDIR /src
COPY . .
# The README's build (apt packages from setup.sh's list, configure, build into build/); the image
# needs no Python environment and no CUDA.
RUN ORTHOSERVE_SKIP_VENV=1 ORTHOSERVE_WITH_CUDA=OFF ./scripts/setup.sh
# The runtime image installs exactly the packages that own the shared libraries the binaries load
# (libraries under /usr/local, i.e. CUDA, come with the runtime base instead).
RUN mkdir -p /out \
 && ldd build/bin/orthoserve build/bin/orthoctl | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u \
    | grep -v '^/usr/local/' \
    | while read -r lib; do \
        real=$(readlink -f "$lib"); \
        dpkg -S "$real" 2>/dev/null || dpkg -S "${real#/usr}" 2>/dev/null \
          || { echo "no package owns $lib" >&2; exit 1; }; \
      done \
    | cut -d: -f1 | sort -u > /out/runtime-packages.txt \
 && cat /out/runtime-packages.txt

# ---- GPU build: the CUDA 13 devel image (Ubuntu 24.04; NVIDIA publishes no Debian CUDA image) ---
# setup.sh's -dev packages have the same names on Ubuntu 24.04 as on Debian 12, with the same gRPC
# 1.51 / protobuf 3.21 / abseil 20220623; runtime library names differ (t64), hence the ldd-derived
# runtime package list (see docs/operations.md, "Images").
FROM ${CUDA_DEVEL_IMAGE} AS build-gpu
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive
WORKDIR /src
COPY . .
RUN ORTHOSERVE_SKIP_VENV=1 ORTHOSERVE_WITH_CUDA=ON ./scripts/setup.sh
RUN mkdir -p /out \
 && ldd build/bin/orthoserve build/bin/orthoctl | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u \
    | grep -v '^/usr/local/' \
    | while read -r lib; do \
        real=$(readlink -f "$lib"); \
        dpkg -S "$real" 2>/dev/null || dpkg -S "${real#/usr}" 2>/dev/null \
          || { echo "no package owns $lib" >&2; exit 1; }; \
      done \
    | cut -d: -f1 | sort -u > /out/runtime-packages.txt \
 && cat /out/runtime-packages.txt

# ---- CPU runtime --------------------------------------------------------------------------------
FROM ${DEBIAN_IMAGE} AS cpu
ARG ORTHOSERVE_UID
COPY --from=build-cpu /out/runtime-packages.txt /tmp/runtime-packages.txt
RUN apt-get update -qq \
 && xargs -a /tmp/runtime-packages.txt apt-get install -y -qq --no-install-recommends \
 && rm -rf /var/lib/apt/lists/* /tmp/runtime-packages.txt \
 && groupadd --gid "${ORTHOSERVE_UID}" orthoserve \
 && useradd --uid "${ORTHOSERVE_UID}" --gid "${ORTHOSERVE_UID}" --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin orthoserve
COPY --from=build-cpu /src/build/bin/orthoserve /src/build/bin/orthoctl /usr/local/bin/
ENV ORTHOSERVE_LISTEN=0.0.0.0:50051 \
    ORTHOSERVE_FLEET_LISTEN=0.0.0.0:50061 \
    ORTHOSERVE_METRICS_ADDRESS=0.0.0.0:9464 \
    ORTHOSERVE_BACKEND=cpu
EXPOSE 50051 50061 9464
USER ${ORTHOSERVE_UID}:${ORTHOSERVE_UID}
# Plaintext only: with TLS on, Kubernetes' probes (deploy/k8s/components/tls) take over.
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
  CMD ["orthoctl", "health", "--server", "127.0.0.1:50051"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["orthoserve"]

# ---- GPU runtime --------------------------------------------------------------------------------
# What the image contains: the CUDA 13.0.2 runtime with cuBLAS and NCCL (from the nvidia/cuda
# runtime base) and orthoserve's kernels for sm_80 (A100; runs on every 8.x part) and sm_90
# (H100/H200), plus compute_90 PTX that the driver compiles for newer GPUs (Blackwell). It has no
# driver: the node's NVIDIA driver (libcuda, mounted in by the nvidia runtime) must run CUDA 13,
# i.e. be of the R580 branch or newer: >= 580.65.06 (CUDA 13.x minor version compatibility), and
# >= 580.95.05, the driver CUDA 13.0.2 ships with, recommended. GPUs older than compute capability
# 8.0 (V100, T4) are not supported. With an older driver the container runtime refuses the image
# (NVIDIA_REQUIRE_CUDA "cuda>=13.0", set by the base image) or the server exits at start with
# "no usable CUDA device: ... cudaErrorInsufficientDriver". The labels below say the same;
# tests/deploy/k8s_checks.py keeps them, the CUDA version of CUDA_RUNTIME_IMAGE and
# docs/operations.md ("Images") in step.
FROM ${CUDA_RUNTIME_IMAGE} AS gpu
ARG ORTHOSERVE_UID
LABEL io.orthoserve.cuda.version="13.0.2" \
      io.orthoserve.nvidia-driver.min="580.65.06" \
      io.orthoserve.nvidia-driver.recommended="580.95.05" \
      io.orthoserve.cuda.architectures="sm_80 sm_90 compute_90"
COPY --from=build-gpu /out/runtime-packages.txt /tmp/runtime-packages.txt
RUN apt-get update -qq \
 && xargs -a /tmp/runtime-packages.txt apt-get install -y -qq --no-install-recommends \
 && rm -rf /var/lib/apt/lists/* /tmp/runtime-packages.txt \
 && groupadd --gid "${ORTHOSERVE_UID}" orthoserve \
 && useradd --uid "${ORTHOSERVE_UID}" --gid "${ORTHOSERVE_UID}" --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin orthoserve
COPY --from=build-gpu /src/build/bin/orthoserve /src/build/bin/orthoctl /usr/local/bin/
ENV ORTHOSERVE_LISTEN=0.0.0.0:50051 \
    ORTHOSERVE_FLEET_LISTEN=0.0.0.0:50061 \
    ORTHOSERVE_METRICS_ADDRESS=0.0.0.0:9464 \
    ORTHOSERVE_BACKEND=cuda \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
EXPOSE 50051 50061 9464
USER ${ORTHOSERVE_UID}:${ORTHOSERVE_UID}
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
  CMD ["orthoctl", "health", "--server", "127.0.0.1:50051"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["orthoserve"]

# `docker build .` without --target gives the CPU image.
FROM cpu AS default
