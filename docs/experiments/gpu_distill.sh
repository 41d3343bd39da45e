#!/bin/bash
# keyb2's scorer distilled on a GPU (an NVIDIA H200, 2026-11-26) from a windows teacher over all the
# training data (docs/EXPERIMENTS.md, 2026-11-26). Two steps, each in the repository root:
#
#   here:   docs/experiments/gpu_distill.sh bundle RUN      # RUN = r6 (student = the teacher's weights) or r7 (student = ce-minilm-l6)
#   there:  bash .gpu/gpu_distill.sh train RUN     # with .gpu/ beside the checkout; $OUT: the model in 3 fp16 parts, log, cache
#
# The GPU machine has no network access, and the bundle stays under 64 MiB: the teacher as its bf16 PyTorch variant (keyrank prepare --device cuda) or, where its cached scores
# travel instead, none of its weights; the student's starting weights in fp16 (r6 reads them from the
# teacher's bf16 file), the datasets' training splits (xz), and wheels of what the GPU image lacks.
# Weights travel back in fp16 (16 MiB a file).
set -u -o pipefail
STEP=${1:?bundle or train}; RUN=${2:?r6 or r7}
TEACHER=${TEACHER:-runs/r4/prepared}; BASE=${BASE:-../shared/models/ce-minilm-l6}; CACHE=${CACHE:-runs/r6-device/cache}
# What the finetune path imports that the GPU image lacks, at the versions this checkout's venv runs.
NAMES="pydantic pydantic-core pydantic-settings python-dotenv annotated-types typing-inspection typing-extensions sniffio ir-measures pytrec-eval-terrier"
fp16() {  # $1 = python, $2 = safetensors in, $3 = out: floating tensors halved for the trip
  "$1" -c "import sys; from safetensors.torch import load_file, save_file; w = load_file(sys.argv[1]); \
save_file({k: v.half() if v.is_floating_point() else v for k, v in w.items()}, sys.argv[2], metadata={'format': 'pt'})" "$2" "$3"
}

if [ "$STEP" = bundle ]; then
  grep -qx "/.gpu/" .git/info/exclude 2>/dev/null || echo "/.gpu/" >> .git/info/exclude
  rm -rf .gpu && mkdir -p .gpu/teacher/triton-embedded-cuda/cross_encoder/1 .gpu/cache || exit 1
  cp "$0" .gpu/gpu_distill.sh
  PINS=$(.venv/bin/python -c "import sys; from importlib.metadata import version; print(' '.join(n + '==' + version(n) for n in sys.argv[1:]))" $NAMES)
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .gpu/whl $PINS || exit 1
  tar -C ../shared/datasets -cJf .gpu/data.tar.xz --dereference qmsum/train trec-dl20-passage squad2-dev-half || exit 1
  cp -r "$TEACHER/gateway" .gpu/teacher/
  if [ "$RUN" = r6 ]; then  # the teacher scores there, and its weights start the student
    .venv/bin/keyrank prepare --model "$(python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['cross_encoder']['source'])" "$TEACHER/gateway/manifest.json")" \
        --out "$TEACHER" --no-bi-encoder --device cuda || exit 1
    cp -r "$TEACHER/triton-embedded-cuda" .gpu/teacher/
  else  # its scores travel: the weights stay here, the student starts from the base model
    cp "$TEACHER/triton-embedded-cuda/cross_encoder/1/encoder.json" .gpu/teacher/triton-embedded-cuda/cross_encoder/1/
    cp "$CACHE"/teacher-*.jsonl .gpu/cache/
    mkdir -p .gpu/base && cp "$BASE"/{config.json,tokenizer.json,tokenizer_config.json,special_tokens_map.json,vocab.txt} .gpu/base/
    fp16 .venv/bin/python "$BASE/model.safetensors" .gpu/base/model.safetensors
  fi
  du -sh .gpu; exit 0
fi

# --- train: on the GPU machine ---------------------------------------------------------------------
export PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/out} W=/tmp/$RUN
PY=python3; mkdir -p "$OUT" "$W/cache"
start=$(date +%s); log() { echo "[$(( $(date +%s) - start ))s] $*"; }
$PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/service
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
mkdir -p "$W/data" && tar -xJf .gpu/data.tar.xz -C "$W/data" || exit 1
cp .gpu/cache/*.jsonl "$W/cache/" 2>/dev/null
SRC=.gpu/base; [ "$RUN" = r6 ] && SRC=.gpu/teacher/triton-embedded-cuda/cross_encoder/1/checkpoint
$PY -c "import sys, shutil, torch; from transformers import AutoModelForSequenceClassification as A; \
A.from_pretrained(sys.argv[1], dtype=torch.float32).save_pretrained(sys.argv[2]); \
[shutil.copy(f'{sys.argv[1]}/{f}', sys.argv[2]) for f in ('tokenizer.json', 'tokenizer_config.json')]" "$SRC" "$W/init" || exit 1
LR=2e-5; [ "$RUN" = r7 ] && LR=3e-5
log setup done
timeout "${BUDGET:-450}" $PY -m keyrank.cli finetune --model "$W/init" --out "$W/$RUN" --strategy keyb2 --selector bm25 \
    --negatives 6 --distill 1.0 --teacher .gpu/teacher --teacher-strategy maxp --teacher-runtime torch \
    --device cuda --no-progress --data-dir "$W/data" --groups-per-step 8 --sequences-per-forward 64 --cache-dir "$W/cache" \
    --task qmsum farrel squad-far --farrel-seeds 0,1,2,3 --farrel-offsets 0,512,1024,1536,2048,2560,3072 \
    --epochs 2 --lr $LR --dev-max-queries 1000 --checkpoint-every 1000 > "$OUT/$RUN.log" 2>&1
log "finetune rc=$?"; tail -30 "$OUT/$RUN.log"
cp "$W/$RUN/training.json" "$OUT/" 2>/dev/null; mkdir -p "$OUT/cache" && cp "$W"/cache/teacher-*.jsonl "$OUT/cache/"
if [ -f "$W/$RUN/model/model.safetensors" ]; then
  fp16 $PY "$W/$RUN/model/model.safetensors" "$W/fp16.safetensors"
  (cd "$OUT" && split -n 3 -d "$W/fp16.safetensors" "$RUN-fp16.safetensors.part-" && sha256sum "$W/fp16.safetensors" >> "$RUN.log")
fi
log end
