#!/usr/bin/env bash
# The habits CI enforces, each failing the run on a finding:
#  - clang-format (.clang-format) over every tracked C++ file, except the runtime headers that
#    generated kernels include (kernels/runtime/: their bytes are part of every kernel's key, so
#    reformatting them would invalidate every cache) and the golden files;
#  - clang's thread-safety analysis over kiln's C++ (thread_safety.py, from BUILD_DIR's
#    compile_commands.json);
#  - clang-tidy's bug-finding checks (.clang-tidy) over the same units, against a baseline that
#    only shrinks (clang_tidy.py);
#  - ruff and mypy over the Python package against a baseline that only shrinks (python_lint.py).
#
#   tests/lint/run.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
build="${1:-build}"
py="${PYTHON:-.venv/bin/python}"
status=0
mapfile -t files < <(git ls-files '*.cc' '*.h' | grep -v -e '^kernels/runtime/' -e '^tests/golden/')
if clang-format --dry-run --Werror "${files[@]}" 2>/tmp/kiln-format.$$; then
  echo "format: ${#files[@]} files as .clang-format writes them"
else
  status=1
  grep -o '^[^:]*\.\(cc\|h\)' /tmp/kiln-format.$$ | sort -u | sed 's/^/format: differs: /'
  echo "format: run clang-format -i on the files above" >&2
fi
rm -f /tmp/kiln-format.$$
"$py" tests/lint/thread_safety.py "$build" || status=1
"$py" tests/lint/clang_tidy.py "$build" || status=1
"$py" tests/lint/python_lint.py || status=1
exit $status
