#!/usr/bin/env bash
# The whole test suite, exactly as CI runs it (.ci/run calls this script).
#
#   1. installs the project and its dev extras into .venv from pyproject.toml;
#   2. lint (ruff) and type checks (mypy --strict, configured in pyproject.toml);
#   3. builds the real-Kubernetes tier from the Go module proxy into ~/.cache/ix-gpu (a no-op when
#      cached), side by side: Kubernetes v1.37.2 whole (apiserver, controller-manager, scheduler,
#      kubelet, kube-proxy, the device-manager harness, fake-cri), the kube-apiserver of v1.35.4
#      (the oldest supported minor) and helm v4.3.1;
#   4. for the real-node tier (as root): installs the CNI plugins, iptables, buildah, mmdebstrap and
#      libseccomp-dev from Debian's packages, builds the nodes' runtime from the Go module proxy
#      (containerd v2.3.7 and runc v1.5.3, tests/k8s/build-runtime.sh; IX_GPU_CONTAINERD=1.7 runs the
#      nodes on Debian's containerd 1.7 instead), and builds the images its pods run (a local Debian
#      base, the pause image, the project's Dockerfile, the training operator), beside the Go builds;
#   5. runs pytest: everything but the tier (-m "not k8s") while the Go builds run at nice 10; the
#      webhook's tests again on the native build (build/native-tree: the request path compiled by
#      mypyc, as the image ships it; scripts/native-tree.sh); then the tier itself (-m k8s,
#      IX_GPU_K8S=1) once the builds are done. Extra arguments go to the first and the last.
#
# The real-node tests turn on the host settings they need (net.ipv4.ip_forward, inotify limits;
# tests/k8s/host_settings.py) for their run and put them back afterwards. Where they cannot (not
# root, a read-only /proc/sys), they are skipped with the reason, which this script repeats at its
# end; the exit code is then pytest's for everything else.
#
# For a quick local loop without the real-Kubernetes tier: .venv/bin/pytest -m "not k8s"
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

STARTED=$SECONDS
TIMES=()
step_name=""
step_start=$SECONDS
end_step() {
    if [[ -n "$step_name" ]]; then TIMES+=("$(printf '%6ds  %s' $((SECONDS - step_start)) "$step_name")"); fi
}
step() {
    end_step
    step_name="$*"
    step_start=$SECONDS
    printf '\n== %s (%(%H:%M:%S)T)\n' "$*" -1
}
LOGS="$(mktemp -d)"
trap 'rm -rf "$LOGS"' EXIT
# bg NAME COMMAND...: run in the background, output to $LOGS/NAME.log; `finish NAME` waits for it.
declare -A PIDS=()
bg() { local name=$1; shift; "$@" >"$LOGS/$name.log" 2>&1 & PIDS[$name]=$!; }
finish() {
    if ! wait "${PIDS[$1]}"; then
        echo "FAILED: $1" >&2
        cat "$LOGS/$1.log" >&2
        exit 1
    fi
    grep -E '(done|cached|built .* in) ' "$LOGS/$1.log" | tail -n 2 || true
}

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

step "build the real-Kubernetes tier side by side (and, as root, the real-node tier's images)"
bg k8s-current bash tests/k8s/build.sh                                      # v1.37.2, every binary
bg k8s-oldest env IX_K8S_VERSION=v1.35.4 bash tests/k8s/build.sh kube-apiserver
bg helm bash tests/k8s/build-helm.sh                                          # helm v4.3.1
bg kwok bash tests/k8s/build-go-command.sh kwok                               # kwok v0.8.0
bg etcd bash tests/k8s/build-go-command.sh etcd                               # etcd v3.6.16
bg prometheus bash tests/k8s/build-go-command.sh prometheus                   # Prometheus 3.16.0
bg native nice -n 10 bash scripts/native-tree.sh build/native-tree           # mypyc, about a minute
if [[ $EUID -eq 0 ]]; then
    # The real-node tier: Debian packages first (the images need buildah, runc libseccomp-dev),
    # then its runtime and images (the base image and pip mostly wait on downloads while Go
    # compiles). runc first: the tests below that run it (tests/node) wait for its build.
    bash tests/k8s/node-packages.sh
    bg runc bash tests/k8s/build-runtime.sh runc                              # runc v1.5.3
    bg containerd bash tests/k8s/containerd.sh                                # containerd v2.3.7
    bg images bash tests/k8s/build-images.sh
fi

# The tests that need none of that run meanwhile: the Go builds run at nice 10 (IX_K8S_NICE), so
# these get the cores they ask for and the builds take the rest (they wait on one core most of the
# time; alone, they would leave it idle).
step "pytest: everything but the real-Kubernetes tier (beside the builds)"
# pytest's exit 5 is "no test selected" (arguments naming only one kind of test): not a failure
# unless neither run selected anything.
set +e
.venv/bin/pytest -m "not k8s" --durations=15 "$@"
unit_rc=$?
set -e

# The webhook's request path as the image runs it: compiled by mypyc. In a cold run this overlaps
# the Go builds' tail.
step "pytest: the webhook's tests on the native build (build/native-tree)"
finish native
set +e
(cd build/native-tree && IX_GPU_EXPECT_COMPILED=1 ../../.venv/bin/pytest -m "not k8s" -p no:cacheprovider \
    tests/test_native_build.py tests/webhook tests/service tests/serving/test_connection_slots.py)
native_rc=$?
set -e

step "the builds finish"
finish k8s-current
finish k8s-oldest
finish helm
finish kwok
finish etcd
finish prometheus
if [[ $EUID -eq 0 ]]; then
    finish runc
    finish containerd
    finish images
fi

step "pytest: the real-Kubernetes tier"
export IX_GPU_K8S=1
export IX_GPU_TIER_REPORT="$LOGS/real-nodes-not-run"
set +e
.venv/bin/pytest -m k8s --durations=25 "$@"
k8s_rc=$?
set -e
end_step
printf '\n== time per step (%ds in all)\n' $((SECONDS - STARTED))
printf '%s\n' "${TIMES[@]}"
if [[ -s "$IX_GPU_TIER_REPORT" ]]; then
    printf '\n== NOTE: the real-node tier did NOT run; its tests were skipped:\n'
    sed 's/^/   /' "$IX_GPU_TIER_REPORT"
    printf '   Run as root on a machine where the tier may set those host settings to prove it.\n'
fi
if ((unit_rc == 5 && k8s_rc == 5)); then exit 5; fi
for rc in "$unit_rc" "$native_rc" "$k8s_rc"; do
    if ((rc != 0 && rc != 5)); then
        printf '\n== FAILED: pytest exited %d (everything but the tier), %d (the native build), %d (the tier)\n' \
            "$unit_rc" "$native_rc" "$k8s_rc"
        exit "$rc"
    fi
done
printf '\n== passed: the three pytest runs (everything but the tier, the native build, the tier)\n'
