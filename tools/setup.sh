#!/bin/bash
# Installs what Ithaca needs on a fresh Debian 12 machine; safe to run again (idempotent), and
# prints what it did.
#   bash tools/setup.sh          Debian packages (apt) for the C++ build and the tests, and the
#                                project's Python environment .venv/ with tools/requirements.txt.
#   bash tools/setup.sh --cuda   also NVIDIA's CUDA toolkit, cuDNN and NCCL as pinned wheels
#                                (tools/requirements-cuda.txt) into .venv, which the build then
#                                uses (bazel/cuda_configure.bzl). Implied where a GPU is present.
# Without --cuda and without /usr/local/cuda the build leaves the CUDA targets out.
# Nothing is pip-installed outside .venv (git-ignored).
set -euo pipefail
cd "$(dirname "$0")/.."
CUDA=0
for arg in "$@"; do
  case "$arg" in
    --cuda) CUDA=1 ;;
    *) echo "setup: unknown argument $arg (expected --cuda)" >&2; exit 2 ;;
  esac
done
if [ "$CUDA" -eq 0 ] && nvidia-smi -L >/dev/null 2>&1; then
  echo "setup: a GPU is present: installing the CUDA wheels too"
  CUDA=1
fi

APT_PACKAGES=(
  bazel-bootstrap pkg-config protobuf-compiler protobuf-compiler-grpc libprotobuf-dev
  libgrpc++-dev libabsl-dev libgtest-dev libgmock-dev libcivetweb-dev libgloo-dev libsqlite3-dev
  libtomlplusplus-dev nlohmann-json3-dev libcli11-dev prometheus-cpp-dev python3-venv python3-numpy
  python3-torch prometheus python3-yaml clang libclang-rt-14-dev clang-format chromium openssl
  slurm-wlm munge
)
# slurm-wlm, munge: a real Slurm for tests/slurm (tests/slurm/slurm_local.sh starts it).
# clang-format: tools/check_format.sh (one of the tests).

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: apt installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
else
  echo "setup: apt: all ${#APT_PACKAGES[@]} packages present"
fi

# Debian's interpreter, so that its python3-torch, numpy and yaml stay visible in the venv.
VENV=.venv
PY="$VENV/bin/python"
if [ ! -x "$PY" ]; then
  echo "setup: creating $VENV (/usr/bin/python3 -m venv --system-site-packages)"
  /usr/bin/python3 -m venv --system-site-packages "$VENV"
else
  echo "setup: $VENV exists"
fi

# Pins of a requirements file, without comments; `no-deps` lines or the others.
pins() { sed -e '/^\s*#/d' -e '/^\s*$/d' "$1" | grep $2 'no-deps' | sed 's/\s*#.*//' || true; }

# pip is only asked when something is missing or at another version (`pip freeze` is fast).
# pip freeze spells names its own way (prometheus_client): compare with _ and - the same.
# `freeze_args` --local: count only what is in the venv itself, not Debian's or /usr/local's.
pip_install() {
  local what="$1" freeze_args="$2"
  shift 2
  local installed want=()
  installed=$("$PY" -m pip freeze $freeze_args 2>/dev/null | tr '_' '-' | tr 'A-Z' 'a-z' || true)
  for p in $what; do
    local q
    q=$(tr '_' '-' <<<"$p" | tr 'A-Z' 'a-z')
    grep -qxF "$q" <<<"$installed" || want+=("$p")
  done
  if [ ${#want[@]} -gt 0 ]; then
    echo "setup: pip installing into $VENV: ${want[*]}"
    "$PY" -m pip install -q --disable-pip-version-check "$@" "${want[@]}"
    CHANGED=1
  else
    echo "setup: pip: $(wc -w <<<"$what") pinned packages present"
  fi
}
pip_install "$(pins tools/requirements.txt -v)" ""
CHANGED=0
pip_install "$(pins tools/requirements.txt '')" "" --no-deps
if [ "$CHANGED" -eq 1 ] && [ -e bazel-bin ]; then
  # The header-only packages (cuDNN frontend, CUTLASS): a build configured before they were
  # there left the Hopper attention kernel out; look again.
  echo "setup: bazel sync --configure (new header packages in $VENV)"
  bazel sync --configure >/dev/null 2>&1 || true
fi
# The Python client (client/python, import ithaca_client), built from this tree's proto/ with the
# .venv's grpcio-tools (--no-build-isolation: nothing fetched). Reinstalled when its sources or
# the protos change.
client_stamp=$(cat client/python/pyproject.toml client/python/setup.py client/python/protogen.py \
  client/python/ithaca_client/*.py proto/ithaca/v1/job.proto | sha256sum | cut -c1-16)
if [ "$(cat "$VENV/.ithaca_client.stamp" 2>/dev/null)" != "$client_stamp" ]; then
  echo "setup: pip installing ithaca_client (client/python) into $VENV"
  "$PY" -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps \
    --force-reinstall ./client/python
  rm -rf client/python/build client/python/*.egg-info
  echo "$client_stamp" > "$VENV/.ithaca_client.stamp"
else
  echo "setup: ithaca_client present"
fi
if [ "$CUDA" -eq 1 ]; then
  # Every dependency is pinned in the file; installed into the venv even where another copy
  # is visible, since the build looks for them there.
  CHANGED=0
  pip_install "$(pins tools/requirements-cuda.txt -v)" "--local" --no-deps --ignore-installed
  if [ "$CHANGED" -eq 1 ] && [ -e bazel-bin ]; then
    # A build made before the wheels were there looked elsewhere: look again.
    echo "setup: bazel sync --configure (the build now finds CUDA in $VENV)"
    bazel sync --configure >/dev/null 2>&1 || true
    bazel shutdown >/dev/null 2>&1 || true
  fi
fi
echo "setup: ok"
