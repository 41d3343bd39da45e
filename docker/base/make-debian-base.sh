#!/usr/bin/env bash
# Make a Python base image from Debian packages alone, for machines that cannot
# pull python:3.11-slim-bookworm (an air-gapped network with a Debian mirror):
#
#   docker/base/make-debian-base.sh [--ca-bundle FILE] [IMAGE] [MIRROR]
#   docker build --build-arg PYTHON_IMAGE=keyrank-base:bookworm ...
#
# IMAGE defaults to keyrank-base:bookworm, MIRROR to the first Debian mirror
# this machine's apt uses (else http://deb.debian.org/debian). Needs root,
# debootstrap and a running dockerd. Idempotent: when IMAGE exists and carries
# this recipe's label, nothing is done (seconds); otherwise about 2 minutes.
#
# --ca-bundle FILE adds the certificates of FILE (PEM, e.g. a company's
# TLS-inspecting proxy CA, or this machine's /etc/ssl/certs/ca-certificates.crt)
# to the image's trust store and points pip at it (/etc/pip.conf), so `pip
# install` in builds FROM this image reaches the package index through that
# proxy. The bundle lives only in the locally made image, never in the
# repository, and images built from it inherit it (it is public keys only).
set -euo pipefail

ca_bundle=""
if [ "${1:-}" = "--ca-bundle" ]; then
  ca_bundle="${2:?--ca-bundle needs a file}"
  shift 2
  [ -r "$ca_bundle" ] || { echo "make-debian-base: cannot read $ca_bundle" >&2; exit 1; }
fi
image="${1:-keyrank-base:bookworm}"
suite=bookworm
packages=python3,python3-venv,python3-pip,python-is-python3,ca-certificates
ca_hash="$( [ -n "$ca_bundle" ] && sha256sum <"$ca_bundle" | cut -c1-16 || echo none)"
# The label that says which recipe made an image: change the recipe (or the CA), get a new image.
recipe="$(printf '%s|%s|%s|v1' "$suite" "$packages" "$ca_hash" | sha256sum | cut -c1-16)"

if [ "$(docker image inspect -f '{{ index .Config.Labels "org.keyrank.base.recipe" }}' "$image" 2>/dev/null)" = "$recipe" ]; then
  echo "make-debian-base: $image is up to date (recipe $recipe)"
  exit 0
fi

mirror="${2:-}"
if [ -z "$mirror" ]; then
  mirror="$( (grep -rhoE '^(deb|URIs:)[[:space:]]+(\[[^]]*\][[:space:]]+)?https?://[^[:space:]]+' \
                /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null || true) \
             | awk '{print $NF}' | grep -E '/debian/?$' | head -n 1)"
  mirror="${mirror:-http://deb.debian.org/debian}"
fi
command -v debootstrap >/dev/null || { echo "make-debian-base: debootstrap is missing (apt-get install debootstrap)" >&2; exit 1; }

rootfs="$(mktemp -d /tmp/keyrank-base.XXXXXX)"
trap 'rm -rf "$rootfs"' EXIT
echo "make-debian-base: debootstrap $suite from $mirror (about 2 minutes)"
if ! debootstrap --variant=minbase --include="$packages" "$suite" "$rootfs" "$mirror" >"$rootfs.log" 2>&1; then
  tail -n 20 "$rootfs.log" >&2
  rm -f "$rootfs.log"
  exit 1
fi
rm -f "$rootfs.log"
if [ -n "$ca_bundle" ]; then
  cp "$ca_bundle" "$rootfs/usr/local/share/ca-certificates/keyrank-build-ca.crt"
  chroot "$rootfs" update-ca-certificates >/dev/null 2>&1  # one file, many certificates: rehash warns, the bundle has them
  printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' >"$rootfs/etc/pip.conf"
fi
# apt's caches and lists are 100 MB: a Dockerfile that installs packages runs apt-get update first.
rm -rf "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
       "$rootfs"/var/log/* "$rootfs"/tmp/*
echo "make-debian-base: importing $image"
tar -C "$rootfs" -c . | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change "LABEL org.keyrank.base.recipe=$recipe org.keyrank.base.ca-bundle=$ca_hash" \
  --change "LABEL org.opencontainers.image.description=\"Debian $suite minbase with python3 (debootstrap)\"" \
  --change 'CMD ["python3"]' \
  - "$image" >/dev/null
echo "make-debian-base: $image ($(docker image inspect -f '{{ .Size }}' "$image" | awk '{printf "%d MB", $1/1e6}'))"
