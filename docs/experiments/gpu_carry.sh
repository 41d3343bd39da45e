#!/usr/bin/env bash
# Build .gpu/: what `keyrank bench --gpu` needs on a GPU machine without network access, in one folder of at
# most 64 MiB.
#   .gpu/models/   gateway assets (no bi-encoder); gpu_run.sh writes triton-embedded-cuda/ (bf16) there
#   .gpu/shared/   the checkpoint (~46 MB) and the data the benchmark and the CUDA tests read (~7 MB): QMSum val
#                  (the 100 x 2k-token candidates), one QMSum train meeting, DL20's BM25 run
#   .gpu/wheels/   the gateway's pure-Python dependencies the device image lacks (~5 MB, Python 3.12)
# The nvidia-pytriton wheel (55 MB) would take the folder past 64 MiB: without it the bench scores with
# the same model code in the gateway process (python -m keyrank.modelserver.gpu_gateway) and says so.
# Usage (repository root): bash docs/experiments/gpu_carry.sh [models-dir] [checkpoint]; then, there,
# bash docs/experiments/gpu_run.sh (docs/PERFORMANCE.md, section 5).
# For the embedded GPU Triton behind `keyrank serve --workers N`: bash docs/experiments/gpu_carry.sh --triton builds
# .gpu-triton/ (the nvidia-pytriton wheel and its missing dependencies, ~59 MB), installed there before .gpu/.
#
# ONNX Runtime's CUDA provider needs more than one such folder holds: bash docs/experiments/gpu_carry.sh --ort [models-dir]
# builds .gpu-ort/, in pieces of at most 64 MiB each:
#   .gpu-ort/models/triton-embedded-cuda-ort/  the fp16 graph (~46 MB, python -m keyrank.prepare.ort_cuda), one piece
#   .gpu-ort/wheel/part-NN                     onnxruntime-gpu for Python 3.12 (210-265 MB) in 60 MiB parts, one piece
#                                              each; needed only where the GPU machine's python lacks the CUDA provider
#                                              (python3 -c "import onnxruntime as o; print(o.get_available_providers())")
# The wheel must be built for the CUDA major of the libraries there (PyTorch's: python3 -c "import torch;
# print(torch.version.cuda)"): PyPI's onnxruntime-gpu is built for CUDA 13 from 1.27.0 on and for CUDA 12 up to
# 1.26.0 (build_and_package_info.py in each wheel). ORT_CUDA=12 picks 1.26.0; the default, 13, the newest.
#   .gpu-ort/wheel/NAME                        the wheel's file name, for `cat part-* > $(cat NAME)` there
set -euo pipefail
PY=${PY:-.venv/bin/python}
EXCLUDE=$(git rev-parse --git-path info/exclude)
# NAME==VERSION of each package named, as this checkout's venv runs them (tested together).
pins() { "$PY" -c "import sys; from importlib.metadata import version; print(' '.join(n + '==' + version(n) for n in sys.argv[1:]))" "$@"; }
mkdir -p "$(dirname "$EXCLUDE")"
if [ "${1:-}" = "--ort" ]; then
  MODELS=${2:-models}
  grep -qx '/.gpu-ort/' "$EXCLUDE" 2>/dev/null || echo '/.gpu-ort/' >> "$EXCLUDE"
  [ -f "$MODELS/triton-embedded-cuda-ort/cross_encoder/1/model.onnx" ] || "$PY" -m keyrank.prepare.ort_cuda --out "$MODELS"
  rm -rf .gpu-ort && mkdir -p .gpu-ort/models .gpu-ort/wheel
  cp -r "$MODELS/triton-embedded-cuda-ort" .gpu-ort/models/
  # onnxruntime-gpu for the GPU machine's Python 3.12 and CUDA major (its libraries come from PyTorch's nvidia-* wheels there).
  SPEC=onnxruntime-gpu; [ "${ORT_CUDA:-13}" = 12 ] && SPEC=onnxruntime-gpu==1.26.0
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 -d .gpu-ort/dl "$SPEC"
  WHEEL=$(ls .gpu-ort/dl/*.whl)
  basename "$WHEEL" > .gpu-ort/wheel/NAME
  split -b 60M -d "$WHEEL" .gpu-ort/wheel/part-
  rm -rf .gpu-ort/dl
  du -sh .gpu-ort/models .gpu-ort/wheel/*
  exit 0
fi
if [ "${1:-}" = "--triton" ]; then
  # The nvidia-pytriton wheel (tritonserver and its Python stubs) and what it imports that the GPU image lacks: a folder
  # of its own (~59 MB), installed there into /tmp/site-triton before gpu_run.sh runs.
  grep -qx '/.gpu-triton/' "$EXCLUDE" 2>/dev/null || echo '/.gpu-triton/' >> "$EXCLUDE"
  rm -rf .gpu-triton && mkdir -p .gpu-triton
  PINS=$(pins nvidia-pytriton pyzmq sh importlib-metadata)
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_35_x86_64 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_26_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .gpu-triton $PINS
  du -sh .gpu-triton
  exit 0
fi
MODELS=${1:-models}
CHECKPOINT=${2:-../shared/models/ce-minilm-l6}
SHARED=$(dirname "$(dirname "$CHECKPOINT")")
grep -qx '/.gpu/' "$EXCLUDE" 2>/dev/null || echo '/.gpu/' >> "$EXCLUDE"
rm -rf .gpu && mkdir -p .gpu/models/gateway .gpu/shared/models .gpu/shared/datasets/qmsum/train .gpu/shared/datasets/trec-dl20-passage .gpu/wheels
cp "$MODELS"/gateway/{manifest.json,tokenizer.json,classifier_head.npz} .gpu/models/gateway/
# The checkpoint itself (16-bit weights, 45 MB): gpu_run.sh writes the bf16 repository from it there, and the CUDA tests
# export it (KEYRANK_SHARED=.gpu/shared), so one copy serves both.
cp -r "$CHECKPOINT" .gpu/shared/models/ce-minilm-l6
# QMSum val (the benchmark's candidates), the first QMSum train meeting (the fp16 graph's check) and DL20's BM25 run
# (the tests' mixed-length inputs).
cp -r "$SHARED"/datasets/qmsum/val .gpu/shared/datasets/qmsum/
cp "$(ls "$SHARED"/datasets/qmsum/train/*.json | sort | head -1)" .gpu/shared/datasets/qmsum/train/
cp "$SHARED"/datasets/trec-dl20-passage/bm25_dl20.json .gpu/shared/datasets/trec-dl20-passage/
# The versions this checkout's venv runs (tested together), built for the device's Python 3.12.
NAMES="fastapi opentelemetry-api starlette pydantic pydantic-core pydantic-settings python-dotenv annotated-types typing-inspection uvicorn fastapi-offline tritonclient python-rapidjson"
PINS=$(pins $NAMES)
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .gpu/wheels $PINS
du -sh .gpu .gpu/*
