#!/usr/bin/env bash
# Sets up everything, builds kilnd and runs it with the embedded default store: RocksDB in
# ./.kiln-cache, listening on 127.0.0.1:50051. Extra arguments go to kilnd (see --help).
# The `kiln` command and the Python package are in the project's virtualenv: .venv/bin/kiln.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/setup.sh
bash deploy/build.sh --target kilnd
exec ./"${KILN_BUILD_DIR:-build}"/server/kilnd "$@"
