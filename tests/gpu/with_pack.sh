#!/usr/bin/env bash
# Runs a command on a GPU machine with a carried kiln pack: the packed kilnd (tests/gpu/pack_kilnd.sh)
# and the kiln wheel built on the build machine, installed into a private folder on the GPU
# machine's own Python (its torch, grpcio and protobuf). Exports KILND, PYTHONPATH and
# LD_LIBRARY_PATH (and PATH, for the packed bwrap), then runs the command.
#
#   tests/gpu/pack_kilnd.sh PACK && .venv/bin/python -m pip wheel --no-deps -w PACK client/python
#   tests/gpu/with_pack.sh PACK python3 tests/gpu/torch_backend_gpu.py --checks-only
set -euo pipefail
pack="$(cd "${1:?usage: with_pack.sh PACK_DIR COMMAND...}" && pwd)"
shift
python="${PYTHON:-python3}"
site="$(mktemp -d)"
"$python" -m pip install -q --no-deps --no-index --target "$site" "$pack"/kiln-*.whl
nvrtc_dir="$("$python" -c 'import nvidia.cuda_nvrtc, os; print(os.path.join(list(nvidia.cuda_nvrtc.__path__)[0], "lib"))' 2>/dev/null || true)"
cuda_lib="$(ls -d /usr/local/cuda*/targets/x86_64-linux/lib 2>/dev/null | head -1 || true)"
export LD_LIBRARY_PATH="$pack/lib:${nvrtc_dir:+$nvrtc_dir:}${cuda_lib:+$cuda_lib:}/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export KILND="$pack/bin/kilnd"
export PATH="$pack/bin:$PATH"  # the packed bwrap, for kilnd's custom builds
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
exec "$@"
