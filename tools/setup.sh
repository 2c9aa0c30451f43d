#!/bin/bash
# Installs what Ithaca needs on a fresh Debian 12 machine; safe to run again (idempotent).
set -euo pipefail
APT_PACKAGES=(
  bazel-bootstrap pkg-config protobuf-compiler protobuf-compiler-grpc libprotobuf-dev
  libgrpc++-dev libabsl-dev libgtest-dev libgmock-dev libcivetweb-dev libgloo-dev libsqlite3-dev
  libtomlplusplus-dev nlohmann-json3-dev python3-pip python3-numpy python3-torch
  prometheus python3-yaml
)
# Python packages for /usr/bin/python3 (the interpreter that has Debian's torch): independent
# oracles used by tests.
PIP_PACKAGES=(
  safetensors==0.4.5
  grpcio==1.62.3
  grpcio-tools==1.62.3
  protobuf==4.25.5
  prometheus-client==0.21.1
  nvidia-cudnn-frontend==1.32.0
  kubernetes-validate==1.37.0
)

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi

# pip is only asked when something is missing or at another version (`pip freeze` is fast).
# pip freeze spells names its own way (prometheus_client): compare with _ and - the same.
installed=$(/usr/bin/python3 -m pip freeze 2>/dev/null | tr '_' '-' || true)
want=()
for p in "${PIP_PACKAGES[@]}"; do
  grep -qixF "${p//_/-}" <<<"$installed" || want+=("$p")
done
if [ ${#want[@]} -gt 0 ]; then
  echo "setup: pip installing ${want[*]} for /usr/bin/python3"
  $SUDO /usr/bin/python3 -m pip install -q --break-system-packages "${want[@]}"
fi
echo "setup: ok"
