#!/usr/bin/env bash
# The C++ Session's CUDA path and the Python wheel, on a machine with an NVIDIA GPU: starts a
# packed kilnd, runs the example program (client/examples/session_example.cc) for the CPU and
# for CUDA (compile on the daemon, fetch the cubin, load and launch through Session, compare
# with a C++ reference), and installs the kiln wheel built on the build machine into the GPU
# machine's own Python (its grpcio/protobuf, no grpcio-tools) to import it with -W error and
# run a kernel. Prints a PASS/FAIL table; exit status 1 when a row failed.
#
# On the build machine (kiln built in ./build with NVRTC):
#   cmake --build build --target kilnd kiln_example
#   tests/gpu/pack_kilnd.sh tests/gpu/session-pack
#   .venv/bin/python -m pip wheel --no-deps -w tests/gpu/session-pack client/python
# then carry tests/gpu/session-pack (git-ignored) with the working tree and run there:
#   tests/gpu/session_cuda.sh tests/gpu/session-pack [SM]        # SM defaults to 90
set -uo pipefail
pack="$(cd "${1:?usage: session_cuda.sh PACK_DIR [SM]}" && pwd)"
sm="${2:-90}"
python="${PYTHON:-python3}"
work="$(mktemp -d)"
trap 'kill "$kilnd_pid" 2>/dev/null; wait "$kilnd_pid" 2>/dev/null; rm -rf "$work"' EXIT

# NVRTC comes from the machine's CUDA toolkit (pip's nvidia-cuda-nvrtc or /usr/local/cuda).
nvrtc_dir="$("$python" -c 'import nvidia.cuda_nvrtc, os; print(os.path.join(list(nvidia.cuda_nvrtc.__path__)[0], "lib"))' 2>/dev/null)"
export LD_LIBRARY_PATH="$pack/lib:${nvrtc_dir:-/usr/local/cuda/lib64}:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export KILN_CACHE_DIR="$work/client-cache"

declare -a names results
record() { names+=("$1"); results+=("$2"); echo "== $1: $2"; }

"$pack/bin/kilnd" --listen 127.0.0.1:0 --cache-dir "$work/cache" > "$work/kilnd.log" 2>&1 &
kilnd_pid=$!
address=""
for _ in $(seq 1 120); do
  address="$(sed -n 's/.*kilnd listening on \([^ ]*\).*/\1/p' "$work/kilnd.log" | head -1)"
  [ -n "$address" ] && break
  kill -0 "$kilnd_pid" 2>/dev/null || break
  sleep 0.5
done
if [ -z "$address" ]; then
  record "kilnd starts" FAIL
  cat "$work/kilnd.log"
else
  record "kilnd starts ($address)" PASS
  for target in cpu "cuda:sm_$sm"; do
    for round in cold warm; do  # warm: a daemon cache hit and a local artifact hit
      if timeout 300 "$pack/bin/kiln_example" --server "$address" --target "$target" \
          --rows 2048 --cols 1000 --runs 3 > "$work/example.out" 2>&1; then
        record "Session $target $round" PASS
      else
        record "Session $target $round" FAIL
      fi
      cat "$work/example.out"
    done
  done
fi

wheel="$(ls "$pack"/kiln-*.whl 2>/dev/null | head -1)"
if [ -z "$wheel" ]; then
  record "wheel present" FAIL
else
  "$python" -m pip install -q --no-deps --no-compile --target "$work/site" "$wheel" > "$work/pip.out" 2>&1
  if (cd / && PYTHONPATH="$work/site" "$python" -W error -c \
      'import kiln, grpc, google.protobuf as p; print("kiln", kiln.__version__, "grpcio", grpc.__version__, "protobuf", p.__version__)'); then
    record "wheel: import kiln -W error" PASS
  else
    record "wheel: import kiln -W error" FAIL
    cat "$work/pip.out"
  fi
  if [ -n "$address" ] && (cd / && PYTHONPATH="$work/site" "$python" -W error - "$address" <<'PY'
import sys
import numpy as np
import kiln
b = kiln.GraphBuilder()
x = b.input("x", "f32", (1000,))
g = b.build(b.tanh(x) * 3.0)
with kiln.Client(sys.argv[1]) as c:
    xv = np.linspace(-3, 3, 1000, dtype=np.float32)
    np.testing.assert_allclose(c.compile(g, "cpu")(xv), np.tanh(xv) * 3.0, rtol=1e-5)
print("wheel client compiled and ran a CPU kernel")
PY
  ); then
    record "wheel: compile and run" PASS
  else
    record "wheel: compile and run" FAIL
  fi
fi

echo
printf '%-40s %s\n' "check" "result"
failed=0
for i in "${!names[@]}"; do
  printf '%-40s %s\n' "${names[$i]}" "${results[$i]}"
  [ "${results[$i]}" = PASS ] || failed=$((failed + 1))
done
echo "$(( ${#names[@]} - failed )) passed, $failed failed"
[ "$failed" -eq 0 ]
