#!/usr/bin/env bash
# Build the real-Kubernetes test tier's Go binaries from the Go module proxy:
#   kube-apiserver   k8s.io/kubernetes/cmd/kube-apiserver at $IX_K8S_VERSION
#   kubelet-harness  tests/k8s/kubelet-harness (the kubelet's real device manager behind a JSON-lines CLI)
#   kubelet          k8s.io/kubernetes/cmd/kubelet at $IX_K8S_VERSION
#   fake-cri         tests/k8s/fake-cri (k8s.io/cri-client/pkg/fake on a unix socket, for the kubelet)
#
# Output: ${IX_GPU_CACHE:-~/.cache/ix-gpu}/k8s-<version>-<harnesshash>/bin/. When all binaries are
# already there, nothing is built. The cache key covers this script and the harness sources, so editing
# either gives a fresh directory (Go's own build cache keeps such rebuilds short).
#
# Progress goes to stderr; the last line on stdout is the bin directory.
#
# The throwaway Go module lives in <cache dir>/src: it requires k8s.io/kubernetes and replaces every
# staging module that the upstream go.mod maps to ./staging/src/... with the published v0.Y.Z module.
set -euo pipefail

K8S_VERSION="${IX_K8S_VERSION:-v1.35.4}"
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

[[ "$K8S_VERSION" =~ ^v1\.([0-9]+)\.([0-9]+)$ ]] || die "IX_K8S_VERSION must look like v1.35.4, got '$K8S_VERSION'"
K8S_MINOR="${BASH_REMATCH[1]}"
STAGING_VERSION="v0.${BASH_REMATCH[1]}.${BASH_REMATCH[2]}"
[[ -x "$GO" ]] || die "no Go toolchain at '$GO' (set GO=/path/to/go)"

# Cache key: this script plus every harness and fake-cri source file (names and contents).
HARNESS_HASH="$(
    cd "$HERE"
    { echo build.sh; find kubelet-harness fake-cri -type f ! -name go.sum ! -name go.mod | LC_ALL=C sort; } |
        while read -r f; do printf '%s\n' "$f"; sha256sum <"$f"; done | sha256sum | cut -c1-12
)"
OUT="$CACHE_ROOT/k8s-$K8S_VERSION-$HARNESS_HASH"
BIN="$OUT/bin"
BINARIES=(kube-apiserver kubelet-harness kubelet fake-cri)

complete() {
    local b
    [[ -f "$OUT/.complete" ]] || return 1
    for b in "${BINARIES[@]}"; do [[ -x "$BIN/$b" ]] || return 1; done
}

mkdir -p "$CACHE_ROOT"
if complete; then
    log "cached: $BIN"
    echo "$BIN"
    exit 0
fi

# One build at a time per cache root (two pytest sessions may start together).
exec 9>"$CACHE_ROOT/.build.lock"
log "waiting for the build lock $CACHE_ROOT/.build.lock"
flock 9
if complete; then
    log "cached (built by another process meanwhile): $BIN"
    echo "$BIN"
    exit 0
fi

export GOTOOLCHAIN=local GOFLAGS="${GOFLAGS:-} -buildvcs=false" CGO_ENABLED=0
log "Go: $("$GO" version); GOMODCACHE=$("$GO" env GOMODCACHE) GOCACHE=$("$GO" env GOCACHE)"
log "Kubernetes $K8S_VERSION (staging modules $STAGING_VERSION), harness hash $HARNESS_HASH"
log "output: $OUT"

START=$SECONDS
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

log "go get k8s.io/kubernetes@$K8S_VERSION (downloads modules on a cold cache)"
T=$SECONDS
$NICE "$GO" get "k8s.io/kubernetes@$K8S_VERSION" \
    "k8s.io/kubernetes/cmd/kube-apiserver@$K8S_VERSION" \
    "k8s.io/kubernetes/pkg/kubelet/cm/devicemanager@$K8S_VERSION" \
    "k8s.io/kubernetes/cmd/kubelet@$K8S_VERSION" \
    "k8s.io/cri-client/pkg/fake@$STAGING_VERSION" >&2 ||
    die "go get failed (see the Go error above)"
log "go get done in $((SECONDS - T))s"

VERSION_FLAGS=""
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    VERSION_FLAGS+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$K8S_MINOR"
    VERSION_FLAGS+=" -X $p.gitTreeState=clean"
done
LDFLAGS="-s -w$VERSION_FLAGS"

build() { # build <output name> <package>
    local t=$SECONDS
    log "go build $2 -> $BIN/$1"
    $NICE "$GO" build -mod=mod -trimpath -ldflags "$LDFLAGS" -o "$BIN/$1.tmp" "$2" >&2 ||
        die "go build $2 failed (see the Go error above)"
    mv "$BIN/$1.tmp" "$BIN/$1"
    log "built $1 in $((SECONDS - t))s"
}
build kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver
build kubelet-harness ./kubelet-harness
build kubelet k8s.io/kubernetes/cmd/kubelet
build fake-cri ./fake-cri

"$BIN/kube-apiserver" --version >&2 || die "the built kube-apiserver does not run"
"$BIN/kubelet" --version >&2 || die "the built kubelet does not run"
printf '%s\n' "$K8S_VERSION" >"$OUT/VERSION"
touch "$OUT/.complete"
# Keep the three newest builds (other checkouts may use older harness versions); drop the rest.
ls -1dt "$CACHE_ROOT"/k8s-v*/ 2>/dev/null | tail -n +4 | while read -r old; do
    log "removing old build $old"
    rm -rf "$old"
done
log "done in $((SECONDS - START))s: $BIN"
echo "$BIN"
