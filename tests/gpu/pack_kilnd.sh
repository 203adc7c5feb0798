#!/usr/bin/env bash
# Packs a built kilnd (stripped) with the shared libraries it needs beyond glibc into a folder,
# so that it runs on a machine that has none of our Debian packages (the GPU machine).
#   tests/gpu/pack_kilnd.sh OUT_DIR      -> OUT_DIR/bin/kilnd, OUT_DIR/lib/*.so*
# (kilnc, kiln-nvrtc and the C++ example program kiln_example come along when they are built.)
# Start it there with LD_LIBRARY_PATH=OUT_DIR/lib plus the machine's CUDA library folder
# (for libnvrtc, which is not packed: the CUDA toolkit there provides it).
set -euo pipefail
out="${1:?usage: pack_kilnd.sh OUT_DIR}"
cd "$(dirname "$0")/../.."
build="${KILN_BUILD_DIR:-build}"
case "$out" in /*) ;; *) out="$OLDPWD/$out" ;; esac
mkdir -p "$out/bin" "$out/lib"
strip -o "$out/bin/kilnd" "$build/server/kilnd"
[ -x "$build/kernels/kilnc" ] && strip -o "$out/bin/kilnc" "$build/kernels/kilnc"
# kilnd compiles raw CUDA kernels through this tool, found next to itself.
[ -x "$build/server/ext/kiln-nvrtc" ] && strip -o "$out/bin/kiln-nvrtc" "$build/server/ext/kiln-nvrtc"
[ -x "$build/client/cpp/kiln_example" ] && strip -o "$out/bin/kiln_example" "$build/client/cpp/kiln_example"
# bubblewrap: kilnd's sandbox for custom builds (kiln.torch's native part runner is one).
if command -v bwrap >/dev/null; then cp -L "$(command -v bwrap)" "$out/bin/bwrap"; fi
for bin in "$out"/bin/*; do ldd "$bin"; done | awk '$3 ~ /^\// {print $3}' | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libmvec.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libnvrtc*|libcuda.so*) ;;
    # The C++ runtime is the GPU machine's own (newer, and backward compatible): a packed older
    # one on LD_LIBRARY_PATH would shadow it for the Python process too, and extensions kilnd
    # builds there with the machine's g++ would not import.
    libstdc++.so*|libgcc_s.so*) ;;
    *) cp -L "$lib" "$out/lib/" ;;
  esac
done
du -sh "$out"
