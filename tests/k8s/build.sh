#!/usr/bin/env bash
# Build the real-Kubernetes test tier's Go binaries from the Go module proxy:
#   kube-apiserver           k8s.io/kubernetes/cmd/kube-apiserver at $IX_K8S_VERSION
#   kube-controller-manager  k8s.io/kubernetes/cmd/kube-controller-manager at $IX_K8S_VERSION
#   kube-scheduler           k8s.io/kubernetes/cmd/kube-scheduler at $IX_K8S_VERSION
#   kubelet                  k8s.io/kubernetes/cmd/kubelet at $IX_K8S_VERSION
#   kube-proxy               k8s.io/kubernetes/cmd/kube-proxy at $IX_K8S_VERSION (the real-node tier)
#   kubelet-harness          tests/k8s/kubelet-harness (the kubelet's real device manager behind a JSON-lines CLI)
#   fake-cri                 tests/k8s/fake-cri (a CRI runtime that runs containers as host processes)
#
#   bash tests/k8s/build.sh [all | BINARY ...]
#
# Without arguments: "all" of the current Kubernetes (v1.37.2), what every suite but the oldest-version
# ones runs. The kubelet-harness is written against the v1.37 device-manager API (NewManagerImpl and
# the fake topology manager take a logger, nodes come from cadvisor/lib/model, Allocate takes a
# context and a lifecycle operation), so it compiles from v1.37 on. The oldest supported minor is
# built for its apiserver alone:
#   IX_K8S_VERSION=v1.35.4 bash tests/k8s/build.sh kube-apiserver
# A pre-release (vX.Y.Z-suffix, e.g. v1.38.0-beta.0) takes its staging modules at v0.Y.Z-suffix. Where
# the upstream go.mod needs a newer Go than the local toolchain, the build runs with
# GOTOOLCHAIN=${IX_K8S_GOTOOLCHAIN:-go1.27.3} (otherwise GOTOOLCHAIN=local):
#   IX_K8S_VERSION=v1.38.0-beta.0 bash tests/k8s/build.sh kube-apiserver kube-scheduler
#
# Output: ${IX_GPU_CACHE:-~/.cache/ix-gpu}/k8s-<version>-<harnesshash>/bin/. Binaries already there are
# not built again; a later call that asks for more binaries adds them to the same directory. The cache
# key covers this script and the harness and fake-cri sources, so editing either gives a fresh
# directory (Go's own build cache keeps such rebuilds short). The three newest directories of each
# Kubernetes version are kept.
#
# The binaries missing are built by one `go build`, so the compiler and the linkers of different
# binaries share the cores (linking is mostly single-threaded). Builds of different directories (two
# versions) may run at the same time; one directory is built by one process at a time (a lock).
#
# Progress goes to stderr; the last line on stdout is the bin directory.
#
# The throwaway Go module lives in <cache dir>/src: it requires k8s.io/kubernetes and replaces every
# staging module that the upstream go.mod maps to ./staging/src/... with the published v0.Y.Z module.
set -euo pipefail

K8S_VERSION="${IX_K8S_VERSION:-v1.37.2}"
CACHE_ROOT="${IX_GPU_CACHE:-$HOME/.cache/ix-gpu}"
GO="${GO:-}"
if [[ -z "$GO" ]]; then
    if command -v go >/dev/null 2>&1; then GO="$(command -v go)"; else GO=/usr/local/go/bin/go; fi
fi
NICE="${IX_K8S_NICE:-nice -n 10}"

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
HARNESS_SRC="$HERE/kubelet-harness"
FAKE_CRI_SRC="$HERE/fake-cri"

log() { printf '[k8s-build %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[[ "$K8S_VERSION" =~ ^v1\.([0-9]+)\.([0-9]+)(-[0-9A-Za-z.]+)?$ ]] ||
    die "IX_K8S_VERSION must look like v1.35.4 or v1.38.0-beta.0, got '$K8S_VERSION'"
K8S_MINOR="${BASH_REMATCH[1]}"
# A pre-release's staging modules carry its suffix: v1.38.0-beta.0 -> v0.38.0-beta.0.
STAGING_VERSION="v0.${BASH_REMATCH[1]}.${BASH_REMATCH[2]}${BASH_REMATCH[3]}"
[[ -x "$GO" ]] || die "no Go toolchain at '$GO' (set GO=/path/to/go)"

# Cache key: this script plus every harness and fake-cri source file (names and contents).
HARNESS_HASH="$(
    cd "$HERE"
    { echo build.sh; find kubelet-harness fake-cri -type f ! -name go.sum ! -name go.mod | LC_ALL=C sort; } |
        while read -r f; do printf '%s\n' "$f"; sha256sum <"$f"; done | sha256sum | cut -c1-12
)"
OUT="$CACHE_ROOT/k8s-$K8S_VERSION-$HARNESS_HASH"
BIN="$OUT/bin"

# What to build: "all" and binary names, in the order given (duplicates dropped).
ALL_BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubelet-harness fake-cri)
BINARIES=()
add() { local b; for b in "${BINARIES[@]}"; do [[ "$b" == "$1" ]] && return 0; done; BINARIES+=("$1"); }
(($# > 0)) || set -- all
for arg in "$@"; do
    case "$arg" in
    all) for b in "${ALL_BINARIES[@]}"; do add "$b"; done ;;
    *)
        [[ " ${ALL_BINARIES[*]} " == *" $arg "* ]] ||
            die "unknown set or binary '$arg' (set: all; binaries: ${ALL_BINARIES[*]})"
        add "$arg"
        ;;
    esac
done
if ((K8S_MINOR < 37)) && [[ " ${BINARIES[*]} " == *" kubelet-harness "* ]]; then
    die "the kubelet-harness is written against the v1.37 device-manager API; $K8S_VERSION has an older one"
fi

package() { # the Go package of a binary
    case "$1" in
    kubelet-harness | fake-cri) echo "./$1" ;;
    *) echo "k8s.io/kubernetes/cmd/$1" ;;
    esac
}

missing() { # the requested binaries not built yet
    local b
    for b in "${BINARIES[@]}"; do [[ -x "$BIN/$b" ]] || echo "$b"; done
}
complete() { [[ -f "$OUT/src/.ready" && -z "$(missing)" ]]; }

mkdir -p "$CACHE_ROOT"
if complete; then
    touch "$OUT" # most recently used: kept by the pruning below
    log "cached: $BIN"
    echo "$BIN"
    exit 0
fi

# One build of this directory at a time (two pytest sessions may start together).
LOCK="$CACHE_ROOT/.build-k8s-$K8S_VERSION-$HARNESS_HASH.lock"
exec 9>"$LOCK"
log "waiting for the build lock $LOCK"
flock 9
if complete; then
    log "cached (built by another process meanwhile): $BIN"
    echo "$BIN"
    exit 0
fi

export GOTOOLCHAIN=local GOFLAGS="${GOFLAGS:-} -buildvcs=false" CGO_ENABLED=0
# Where the upstream go.mod asks for a newer Go than the local toolchain (`go list -m` reads it under
# GOTOOLCHAIN=local; `go mod download` would refuse), the go command runs $IX_K8S_GOTOOLCHAIN
# instead, fetched once from the module proxy.
UPSTREAM_GOMOD="$("$GO" list -m -json "k8s.io/kubernetes@$K8S_VERSION" |
    sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')" || die "go list -m k8s.io/kubernetes@$K8S_VERSION failed"
UP_GO="$(awk '$1 == "go" { print $2; exit }' "$UPSTREAM_GOMOD")"
LOCAL_GO="$("$GO" env GOVERSION)"
LOCAL_GO="${LOCAL_GO#go}"
if [[ -n "$UP_GO" && "$(printf '%s\n%s\n' "$UP_GO" "$LOCAL_GO" | sort -V | tail -n 1)" != "$LOCAL_GO" ]]; then
    export GOTOOLCHAIN="${IX_K8S_GOTOOLCHAIN:-go1.27.3}"
    log "k8s.io/kubernetes@$K8S_VERSION needs Go $UP_GO, the local one is $LOCAL_GO: GOTOOLCHAIN=$GOTOOLCHAIN"
fi
log "Go: $("$GO" version); GOMODCACHE=$("$GO" env GOMODCACHE) GOCACHE=$("$GO" env GOCACHE)"
log "Kubernetes $K8S_VERSION (staging modules $STAGING_VERSION), harness hash $HARNESS_HASH"
log "output: $OUT"

START=$SECONDS
mapfile -t TODO < <(missing)
log "to build: ${TODO[*]}"

# The throwaway module (once per cache directory).
prepare_module() {
    rm -rf "$OUT"
    mkdir -p "$OUT/src" "$BIN"
    cp -r "$HARNESS_SRC" "$OUT/src/kubelet-harness"
    rm -f "$OUT/src/kubelet-harness/go.mod" "$OUT/src/kubelet-harness/go.sum"
    cp -r "$FAKE_CRI_SRC" "$OUT/src/fake-cri"
    rm -f "$OUT/src/fake-cri/go.mod" "$OUT/src/fake-cri/go.sum"
    cd "$OUT/src"

    log "reading the upstream go.mod of k8s.io/kubernetes@$K8S_VERSION from the module proxy"
    DL_JSON="$("$GO" mod download -json "k8s.io/kubernetes@$K8S_VERSION")" ||
        die "go mod download k8s.io/kubernetes@$K8S_VERSION failed: $DL_JSON"
    UPSTREAM_GOMOD="$(printf '%s\n' "$DL_JSON" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')"
    [[ -f "$UPSTREAM_GOMOD" ]] || die "no GoMod path in: $DL_JSON"

    # Every "k8s.io/<m> => ./staging/..." replacement (in a replace block or on a single replace line).
    mapfile -t STAGING < <(awk '
        { sub(/^replace[[:space:]]+/, ""); sub(/^[[:space:]]+/, "") }
        $2 == "=>" && $3 ~ /^\.\/staging\// && $1 ~ /^k8s\.io\// { print $1 }
    ' "$UPSTREAM_GOMOD" | LC_ALL=C sort -u)
    ((${#STAGING[@]} > 0)) || die "found no ./staging replacements in $UPSTREAM_GOMOD"
    log "${#STAGING[@]} staging modules: ${STAGING[*]}"

    "$GO" mod init ix-gpu.test/k8s-tier >/dev/null 2>&1 || die "go mod init failed"
    # Keep the upstream language version and GODEBUG defaults, so the binaries behave as released ones.
    UP_GO="$(awk '$1 == "go" { print $2; exit }' "$UPSTREAM_GOMOD")"
    [[ -n "$UP_GO" ]] && "$GO" mod edit -go="$UP_GO"
    while read -r gd; do
        [[ -n "$gd" ]] && "$GO" mod edit -godebug="$gd"
    done < <(awk '$1 == "godebug" && $2 != "(" { print $2 }' "$UPSTREAM_GOMOD")
    EDITS=()
    for m in "${STAGING[@]}"; do EDITS+=("-replace=$m=$m@$STAGING_VERSION"); done
    "$GO" mod edit "${EDITS[@]}"
    printf '%s\n' "$K8S_VERSION" >"$OUT/VERSION"
    touch "$OUT/src/.ready"
}
[[ -f "$OUT/src/.ready" ]] || prepare_module
cd "$OUT/src"

GET=("k8s.io/kubernetes@$K8S_VERSION")
for b in "${TODO[@]}"; do
    case "$b" in
    kubelet-harness) GET+=("k8s.io/kubernetes/pkg/kubelet/cm/devicemanager@$K8S_VERSION") ;;
    fake-cri) GET+=("k8s.io/cri-api/pkg/apis/runtime/v1@$STAGING_VERSION") ;;
    *) GET+=("$(package "$b")@$K8S_VERSION") ;;
    esac
done
log "go get ${GET[*]} (downloads modules on a cold cache)"
T=$SECONDS
$NICE "$GO" get "${GET[@]}" >&2 || die "go get failed (see the Go error above)"
log "go get done in $((SECONDS - T))s"

VERSION_FLAGS=""
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    VERSION_FLAGS+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$K8S_MINOR"
    VERSION_FLAGS+=" -X $p.gitTreeState=clean"
done
LDFLAGS="-s -w$VERSION_FLAGS"

T=$SECONDS
PACKAGES=()
for b in "${TODO[@]}"; do PACKAGES+=("$(package "$b")"); done
NEW="$BIN/.new"
rm -rf "$NEW" && mkdir -p "$NEW"
log "go build ${PACKAGES[*]} -> $NEW/"
# With -o naming a directory, go build writes each main package there under its last path element.
$NICE "$GO" build -mod=mod -trimpath -ldflags "$LDFLAGS" -o "$NEW/" "${PACKAGES[@]}" >&2 ||
    die "go build failed (see the Go error above)"
for b in "${TODO[@]}"; do
    [[ -x "$NEW/$b" ]] || die "go build wrote no $NEW/$b"
    case "$b" in
    kubelet-harness | fake-cri) ;;
    *) "$NEW/$b" --version >&2 || die "the built $b does not run" ;;
    esac
    mv "$NEW/$b" "$BIN/$b"
done
rmdir "$NEW"
log "built ${TODO[*]} in $((SECONDS - T))s"

touch "$OUT"
# Keep the three newest builds of this version (other checkouts may use older harness versions).
ls -1dt "$CACHE_ROOT/k8s-$K8S_VERSION-"????????????/ 2>/dev/null | tail -n +4 | while read -r old; do
    log "removing old build $old"
    rm -rf "$old" "$CACHE_ROOT/.build-$(basename "$old").lock"
done
log "done in $((SECONDS - START))s: $BIN"
echo "$BIN"
