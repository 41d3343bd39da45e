#!/usr/bin/env bash
# The GPU figures and the CUDA-only tests in one run, on a GPU machine without network access, from the checkout's
# root, with gpu_carry.sh's folders beside the checkout (.gpu/, and .gpu-triton/ installed into /tmp/site-triton for the HTTP figures
# through `keyrank serve` on the embedded GPU Triton). Every result lands in $OUT as soon as it is measured:
#   gpu.txt         nvidia-smi -L
#   bench-gpu.json  keyrank bench --gpu (rewritten after every stage and HTTP row), bench-gpu.txt its output
#   tests-gpu.txt   tests/test_gpu_variant.py and tests/test_ort_cuda.py, the CUDA-only ones included
# Usage: OUT=/tmp/out bash docs/experiments/gpu_run.sh [bench|tests|all]   (BENCH_S=400, TESTS_S=170: their time limits
# in seconds, so `all` ends within 10 minutes; about 6 and 2 minutes are expected)
# Rehearsed on a CPU with PY=.venv/bin/python NO_INSTALL=1: the bench then measures its CPU part and the tests skip
# the CUDA-only ones.
set -uo pipefail
WHAT=${1:-all}
PY=${PY:-python3}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ -z "${NO_INSTALL:-}" ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/wheels/*.whl || exit 3
fi
# nvidia-pytriton first where it was installed (a missing folder on the path costs nothing).
export PYTHONPATH=/tmp/site-triton:/tmp/site:$PWD/service${PYTHONPATH:+:$PYTHONPATH}
(nvidia-smi -L 2>&1 || echo "no nvidia-smi") | tee "$OUT/gpu.txt"
if [ ! -f .gpu/models/triton-embedded-cuda/cross_encoder/1/encoder.json ]; then
  "$PY" -m keyrank.prepare.gpu_repository --out .gpu/models --model .gpu/shared/models/ce-minilm-l6 --device cuda --dtype bfloat16 \
    2>&1 | grep -v "Loading weights\|Writing model shards" || exit 4
fi
if [ "$WHAT" != tests ]; then
  # 30 requests per latency figure and 10 s per saturation window: cold requests tokenize 200k document tokens each.
  timeout "${BENCH_S:-400}" "$PY" -m keyrank.cli bench --gpu --requests "${REQUESTS:-30}" --duration "${DURATION:-10}" \
    --model-dir .gpu/models --datasets .gpu/shared/datasets --json "$OUT/bench-gpu.json" 2>&1 \
    | grep -v "Loading weights" | tee "$OUT/bench-gpu.txt"
fi
if [ "$WHAT" != bench ]; then
  KEYRANK_SHARED=$PWD/.gpu/shared KEYRANK_TEST_BI_ENCODER=none KEYRANK_TEST_MODEL_DIR=/tmp/keyrank-models-test \
    timeout "${TESTS_S:-170}" "$PY" -m pytest -q -p no:cacheprovider tests/test_gpu_variant.py tests/test_ort_cuda.py 2>&1 \
    | grep -v "Loading weights\|Writing model shards" | tee "$OUT/tests-gpu.txt"
fi
