#!/usr/bin/env bash
# Builds the GPU suite's artifacts on this machine (the GPU machine has no kiln build): writes
# the graphs (make_graphs.py), compiles each for sm_90 with kilnc, and keeps what the suite
# loads: kernel.cubin, kernel.ptx, plan.json, report.txt, kernel.cu. Also records each
# compile's time (graph in, cubin out) in compile_times.json.
#
#   tests/gpu/build_artifacts.sh            # uses build-cuda/kernels/kilnc
#   KILN_BUILD_DIR=build tests/gpu/build_artifacts.sh
#
# The folder tests/gpu/artifacts/ is git-ignored (.git/info/exclude); carry it to the GPU
# machine with the working tree, then run tests/gpu/run_gpu.sh there.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${KILN_BUILD_DIR:-$root/build-cuda}"
case "$build" in /*) ;; *) build="$root/$build" ;; esac
kilnc="$build/kernels/kilnc"
sm="${KILN_GPU_SM:-90}"
if [ ! -x "$kilnc" ]; then
  echo "build_artifacts: no $kilnc; build it first: cmake --build $build --target kilnc" >&2
  exit 1
fi

python3 "$root/tests/gpu/make_graphs.py"
out="$root/tests/gpu/artifacts"
rm -rf "$out"
mkdir -p "$out"
cp "$root/tests/gpu/graphs/manifest.json" "$out/"

times="$out/compile_times.json"
echo "{" > "$times"
first=1
for graph in "$root"/tests/gpu/graphs/*.txtpb; do
  name="$(basename "$graph" .txtpb)"
  # "N kernel(s), frontend F ms, toolchain T ms, key K"
  line="$("$kilnc" "$graph" --target "cuda:sm_$sm" --out "$out/$name")" || {
    echo "build_artifacts: kilnc failed on $graph" >&2
    exit 1
  }
  rm -f "$out/$name/key.txt"
  ms="$(echo "$line" | awk '{for (i = 1; i <= NF; ++i) if ($i == "frontend" || $i == "toolchain") s += $(i + 1)} END {printf "%.1f", s}')"
  [ $first -eq 1 ] || echo "," >> "$times"
  printf '  "%s": %s' "$name" "$ms" >> "$times"
  first=0
  echo "  $name: $line"
done
echo "" >> "$times"
echo "}" >> "$times"

# Keep the artifacts out of git without touching .gitignore.
exclude="$root/.git/info/exclude"
if [ -d "$root/.git" ]; then
  mkdir -p "$(dirname "$exclude")"
  grep -qx '/tests/gpu/artifacts/' "$exclude" 2>/dev/null || echo '/tests/gpu/artifacts/' >> "$exclude"
fi

size_kb="$(du -sk "$out" | cut -f1)"
echo "build_artifacts: $(ls -d "$out"/*/ | wc -l) graphs, ${size_kb} KiB in $out"
if [ "$size_kb" -gt $((20 * 1024)) ]; then
  echo "build_artifacts: artifacts exceed 20 MiB" >&2
  exit 1
fi
