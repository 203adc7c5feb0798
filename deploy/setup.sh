#!/usr/bin/env bash
# Installs everything kiln needs to build, run and test, from Debian's packages and PyPI.
# Idempotent: when everything is present it only checks and returns in a second or two.
set -euo pipefail

APT_PACKAGES=(
  build-essential cmake ninja-build pkg-config ccache
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  librocksdb-dev libabsl-dev libspdlog-dev libfmt-dev libssl-dev libcpp-httplib-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  openssl
)
PY_PACKAGES=(numpy grpcio "protobuf>=4.21" grpcio-tools pytest cryptography)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

PYTHON="${PYTHON:-python3}"
if ! "$PYTHON" -c "import numpy, grpc, google.protobuf, grpc_tools, pytest, cryptography" 2>/dev/null; then
  echo "setup: installing Python packages"
  "$PYTHON" -m pip install -q --disable-pip-version-check "${PY_PACKAGES[@]}"
fi
echo "setup: ok"
