#!/bin/sh
# Fill $KEYRANK_PREPARE_OUT with `keyrank prepare` unless it already holds an
# export of the same model (so restarts and extra replicas cost nothing).
# Exports into a scratch folder on the same volume and renames into place, so
# readers never see a half-written repository.
set -eu

model="${KEYRANK_PREPARE_MODEL:?set KEYRANK_PREPARE_MODEL to a hub id or a mounted folder}"
out="${KEYRANK_PREPARE_OUT:-/models}"
manifest="$out/gateway/manifest.json"

prepared_source() {
  python3 - "$1" <<'PY' 2>/dev/null || true
import json, sys
print(json.load(open(sys.argv[1]))["cross_encoder"]["source"])
PY
}

if [ "${KEYRANK_PREPARE_FORCE:-0}" != "1" ] && [ -f "$manifest" ] \
   && [ "$(prepared_source "$manifest")" = "$model" ]; then
  echo "keyrank-prepare: $out already holds $model; nothing to do"
  exit 0
fi

mkdir -p "$out"  # /models/<name> of the chart's models.served
scratch="$out/.prepare-$(hostname)-$$"
rm -rf "$scratch"
set -- --model "$model" --out "$scratch"
if [ "${KEYRANK_PREPARE_TENSORRT_FP16:-0}" = "1" ]; then
  set -- "$@" --tensorrt-fp16
fi
echo "keyrank-prepare: keyrank prepare $*"
keyrank prepare "$@"

for part in triton triton-embedded gateway; do
  if [ -e "$scratch/$part" ]; then
    rm -rf "$out/$part.old"
    [ -e "$out/$part" ] && mv "$out/$part" "$out/$part.old"
    mv "$scratch/$part" "$out/$part"
    rm -rf "$out/$part.old"
  fi
done
rm -rf "$scratch"
echo "keyrank-prepare: wrote $out/triton and $out/gateway from $model"
