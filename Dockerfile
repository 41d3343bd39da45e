# syntax=docker/dockerfile:1.7
# keyrank gateway: HTTP API, tokenizer, segmentation, selectors, aggregation.
# The cross-encoder runs on Triton (docker/triton/Dockerfile); this image talks
# to it over gRPC and holds no PyTorch, no compiler and no test dependencies.
#
#   docker build -t keyrank-gateway .
#   docker run -p 8080:8080 -v keyrank-models:/models:ro \
#     -e KEYRANK_TRITON_URL=triton:8001 keyrank-gateway

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---- build: resolve and install the package into a venv --------------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
# Compiler only in this stage: a wheel-less dependency can still build here.
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential \
 && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/keyrank
ENV PATH=/opt/keyrank/bin:$PATH
WORKDIR /src
COPY pyproject.toml README.md ./
COPY service ./service
# The gateway needs only the base dependencies: no export/test/eval extras.
RUN pip install --upgrade pip setuptools wheel \
 && pip install . \
 && pip uninstall -y pip setuptools wheel

# ---- runtime: slim, non-root, read-only friendly ----------------------------
FROM ${PYTHON_IMAGE} AS runtime
ARG UID=10001
LABEL org.opencontainers.image.title="keyrank-gateway" \
      org.opencontainers.image.description="Long-document re-ranking gateway (KeyB2, MaxP, PARADE) in front of Triton" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid ${UID} keyrank \
 && useradd --system --uid ${UID} --gid keyrank --no-create-home --home-dir /tmp --shell /usr/sbin/nologin keyrank
COPY --from=build /opt/keyrank /opt/keyrank
# HOME and the numba cache point at /tmp so the root filesystem can be
# mounted read-only (mount a tmpfs/emptyDir there).
ENV PATH=/opt/keyrank/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/tmp \
    NUMBA_CACHE_DIR=/tmp/numba-cache \
    KEYRANK_HOST=0.0.0.0 \
    KEYRANK_PORT=8080 \
    KEYRANK_MODEL_DIR=/models \
    KEYRANK_TRITON_URL=triton:8001 \
    KEYRANK_WORKERS=1
# One uvicorn worker per container by default: scale with replicas (HPA); the
# Prometheus registry is per process, so several workers would split /metrics.
WORKDIR /tmp
USER ${UID}:${UID}
EXPOSE 8080
HEALTHCHECK --interval=15s --timeout=3s --start-period=30s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('KEYRANK_PORT', '8080'), timeout=2)"]
ENTRYPOINT ["keyrank"]
CMD ["serve"]
