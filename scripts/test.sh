#!/usr/bin/env bash
# The whole test suite, exactly as CI runs it (.ci/run calls this script).
#
#   1. installs the project and its dev extras into .venv from pyproject.toml;
#   2. lint (ruff) and type checks (mypy --strict, configured in pyproject.toml);
#   3. builds the real-Kubernetes tier — kube-apiserver and the kubelet device-manager harness from
#      the Go module proxy — into ~/.cache/ix-gpu (a no-op when cached; ~15-25 min cold on 2 cores);
#   4. runs pytest with that tier switched on (IX_GPU_K8S=1). Extra arguments go to pytest.
#
# For a quick local loop without the real-Kubernetes tier: .venv/bin/pytest -m "not k8s"
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

step() { printf '\n== %s (%(%H:%M:%S)T)\n' "$*" -1; }

step "install into .venv"
if [[ ! -x .venv/bin/python ]]; then
    "${PYTHON:-python3}" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -c constraints.txt -e '.[dev]'

step "ruff"
.venv/bin/ruff check .
step "mypy"
.venv/bin/mypy

step "build the real-Kubernetes tier"
bash tests/k8s/build.sh >/dev/null

step "pytest"
export IX_GPU_K8S=1
exec .venv/bin/pytest "$@"
