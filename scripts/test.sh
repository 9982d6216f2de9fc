#!/usr/bin/env bash
# The whole test suite, exactly as CI runs it (.ci/run calls this script).
#
#   1. installs the project and its dev extras into .venv from pyproject.toml;
#   2. lint (ruff) and type checks (mypy --strict, configured in pyproject.toml);
#   3. builds the real-Kubernetes tier from the Go module proxy into ~/.cache/ix-gpu (a no-op when
#      cached): the 1.35.4 tier (~13 min cold on 2 cores), the 1.37.2 mini-cluster set with
#      kube-proxy (~17 min cold) and helm v4.3.1 (~5 min cold);
#   4. for the real-node tier (as root): installs runc, the CNI plugins, iptables, buildah and
#      mmdebstrap from Debian's packages, fetches containerd 1.7 (Debian's build, pinned by SHA-256),
#      and builds the images its pods run (a local Debian base, the pause image, the project's
#      Dockerfile; ~3 min cold, cached by content hash);
#   5. runs pytest with that tier switched on (IX_GPU_K8S=1). Extra arguments go to pytest.
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

images_pid=""
if [[ $EUID -eq 0 ]]; then
    # The real-node tier: Debian packages, then its images, built beside the Go builds below (the
    # base image and pip mostly wait on downloads; the training operator's Go build takes its turn
    # at the shared build lock).
    step "the real-node tier's packages; its images in the background"
    bash tests/k8s/node-packages.sh
    bash tests/k8s/containerd.sh >/dev/null
    images_log="$(mktemp)"
    bash tests/k8s/build-images.sh >"$images_log" 2>&1 &
    images_pid=$!
fi

step "build the real-Kubernetes tier"
bash tests/k8s/build.sh >/dev/null                                 # 1.35.4: apiserver, kubelet, harness
IX_K8S_VERSION=v1.37.2 bash tests/k8s/build.sh cluster >/dev/null  # the mini cluster, kube-proxy included
bash tests/k8s/build-helm.sh >/dev/null                            # helm v4.3.1
if [[ -n "$images_pid" ]]; then
    step "the real-node tier's images"
    if ! wait "$images_pid"; then
        cat "$images_log" >&2
        exit 1
    fi
    tail -n 3 "$images_log"
fi

step "pytest"
export IX_GPU_K8S=1
exec .venv/bin/pytest "$@"
