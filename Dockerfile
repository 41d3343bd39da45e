# keyrank gateway: HTTP API, tokenizer, segmentation, selectors, aggregation.
# The cross-encoder runs on Triton (docker/triton for a GPU, docker/triton-cpu
# without one); this image talks to it over gRPC and holds no PyTorch, no
# compiler and no test dependencies.
#
#   docker build -t keyrank-gateway:0.1.0 --build-arg VERSION=0.1.0 .
#   docker run -p 127.0.0.1:8080:8080 -v keyrank-models:/models:ro \
#     -e KEYRANK_TRITON_URL=triton:8001 keyrank-gateway:0.1.0
#
# Build arguments: PYTHON_IMAGE (base; any Debian-based image with python3 >=
# 3.11 and venv, e.g. one made by docker/base/make-debian-base.sh),
# PIP_INDEX_URL (a package index mirror), BUILD_PACKAGES (Debian packages for
# the build stage only, e.g. build-essential where a dependency has no wheel
# for the platform; none needed on x86_64/aarch64 Linux), VERSION (the
# image's version label; the package version).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---- requirements: the base dependencies, out of pyproject.toml -------------
# A stage of its own: the dependency layer below is keyed on this list alone,
# so editing pyproject.toml elsewhere (or the source) does not reinstall it.
FROM ${PYTHON_IMAGE} AS requirements
COPY pyproject.toml /src/
RUN python3 -c "import tomllib; print('\n'.join(tomllib.load(open('/src/pyproject.toml', 'rb'))['project']['dependencies']))" \
      > /requirements.txt

# ---- build: resolve and install the package into a venv --------------------
FROM ${PYTHON_IMAGE} AS build
ARG PIP_INDEX_URL=https://pypi.org/simple
ARG BUILD_PACKAGES=""
# Installed by the dependencies but never loaded by the gateway (tests/test_docker.py reads the running
# process's memory map after every kind of request): httptools (uvicorn[standard]; `keyrank serve` runs
# its own h11 protocol) and hf-xet (huggingface-hub's downloader; the tokenizer is read from /models).
ARG UNUSED="httptools hf-xet"
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN if [ -n "$BUILD_PACKAGES" ]; then \
      apt-get update && apt-get install -y --no-install-recommends $BUILD_PACKAGES && rm -rf /var/lib/apt/lists/*; \
    fi
RUN python3 -m venv /opt/keyrank
ENV PATH=/opt/keyrank/bin:$PATH
WORKDIR /src
# Dependencies first (their layer survives source edits), then the package itself.
COPY --from=requirements /requirements.txt /tmp/requirements.txt
RUN pip install -r /tmp/requirements.txt
COPY pyproject.toml README.md ./
COPY service ./service
# The gateway needs only the base dependencies ['project']['dependencies']: no export/test/eval extras.
RUN pip install --no-deps . \
 && pip check \
 && pip uninstall -y pip setuptools $UNUSED \
 && find /opt/keyrank -name __pycache__ -prune -exec rm -rf {} +

# ---- runtime: slim, non-root, read-only friendly ----------------------------
FROM ${PYTHON_IMAGE} AS runtime
ARG VERSION=0.1.0
ARG UID=10001
LABEL org.opencontainers.image.title="keyrank-gateway" \
      org.opencontainers.image.description="Long-document re-ranking gateway (KeyB2, MaxP, PARADE) in front of Triton" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.source="https://github.com/keyrank/keyrank" \
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
