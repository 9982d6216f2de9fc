#!/usr/bin/env bash
# A copy of the work tree with the webhook's request path compiled by mypyc (setup.py,
# IX_GPU_COMPILE=1), for running the tests on the native build as the image ships it:
#
#   bash scripts/native-tree.sh [DIR]      # default build/native-tree; prints DIR
#   (cd build/native-tree && IX_GPU_EXPECT_COMPILED=1 ../../.venv/bin/pytest tests/webhook ...)
#
# The copy holds the files git tracks or would track (as `git ls-files -co --exclude-standard`),
# so what runs is what is committed plus the edits in the work tree. Needs .venv (mypy, the
# dependencies) and gcc with Python's headers. About a minute on one core.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$PWD"
DIR="${1:-build/native-tree}"
rm -rf "$DIR"
mkdir -p "$DIR"
git ls-files -co --exclude-standard -z | tar --null -T - -cf - | tar -xf - -C "$DIR"
cd "$DIR"
# setuptools' build directory inside the copy: nothing is left in the work tree.
IX_GPU_COMPILE=1 "$ROOT/.venv/bin/python" setup.py -q build_ext --inplace >build-native.log 2>&1 \
    || { cat build-native.log >&2; echo "native build failed" >&2; exit 1; }
echo "$DIR"
