#!/usr/bin/env bash
# Build the helm v4 CLI from the Go module proxy: helm.sh/helm/v4/cmd/helm at $IX_HELM_VERSION
# (default v4.3.1), for the mini cluster's real-Helm tests.
#
# Output: ${IX_GPU_CACHE:-~/.cache/ix-gpu}/helm-<version>-<scripthash>/bin/helm. Helm does not depend
# on the Kubernetes version the tier runs, so it has its own cache directory (the two newest are kept).
# Nothing is built when the binary is there. Progress goes to stderr; the last stdout line is the bin
# directory.
#
# Helm's go.mod has no replace directives, so a throwaway module that requires helm.sh/helm/v4 at that
# version (and nothing else) selects exactly the dependency versions of Helm's own build. The binary is
# stamped with its version as Helm's Makefile does (-X helm.sh/helm/v4/internal/version.version=...).
# Helm v4 reads its default Kubernetes version (`helm template`'s .Capabilities.KubeVersion) from the
# client-go version in its build info: v1.37 for v4.3.1 (client-go v0.37.1).
set -euo pipefail

HELM_VERSION="${IX_HELM_VERSION:-v4.3.1}"
CACHE_ROOT="${IX_GPU_CACHE:-$HOME/.cache/ix-gpu}"
GO="${GO:-}"
if [[ -z "$GO" ]]; then
    if command -v go >/dev/null 2>&1; then GO="$(command -v go)"; else GO=/usr/local/go/bin/go; fi
fi
NICE="${IX_K8S_NICE:-nice -n 10}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

log() { printf '[helm-build %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[[ "$HELM_VERSION" =~ ^v4\.[0-9]+\.[0-9]+$ ]] || die "IX_HELM_VERSION must look like v4.3.1, got '$HELM_VERSION'"
[[ -x "$GO" ]] || die "no Go toolchain at '$GO' (set GO=/path/to/go)"

HASH="$(sha256sum <"$HERE/build-helm.sh" | cut -c1-12)"
OUT="$CACHE_ROOT/helm-$HELM_VERSION-$HASH"
BIN="$OUT/bin"

mkdir -p "$CACHE_ROOT"
if [[ -x "$BIN/helm" ]]; then
    touch "$OUT"
    log "cached: $BIN/helm"
    echo "$BIN"
    exit 0
fi

# One Go build at a time per cache root (shared with build.sh).
exec 9>"$CACHE_ROOT/.build.lock"
log "waiting for the build lock $CACHE_ROOT/.build.lock"
flock 9
if [[ -x "$BIN/helm" ]]; then
    log "cached (built by another process meanwhile): $BIN/helm"
    echo "$BIN"
    exit 0
fi

export GOTOOLCHAIN=local GOFLAGS="${GOFLAGS:-} -buildvcs=false" CGO_ENABLED=0
START=$SECONDS
log "Go: $("$GO" version); helm $HELM_VERSION -> $OUT"
rm -rf "$OUT"
mkdir -p "$OUT/src" "$BIN"
cd "$OUT/src"
"$GO" mod init ix-gpu.test/helm >/dev/null 2>&1 || die "go mod init failed"

log "go get helm.sh/helm/v4/cmd/helm@$HELM_VERSION (downloads modules on a cold cache)"
T=$SECONDS
$NICE "$GO" get "helm.sh/helm/v4/cmd/helm@$HELM_VERSION" >&2 || die "go get failed (see the Go error above)"
log "go get done in $((SECONDS - T))s"
HELM_DIR="$("$GO" list -m -f '{{.Dir}}' helm.sh/helm/v4)"
if grep -q '^replace' "$HELM_DIR/go.mod"; then
    log "WARNING: $HELM_DIR/go.mod has replace directives, which this throwaway module does not apply"
fi

LDFLAGS="-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION"
LDFLAGS+=" -X helm.sh/helm/v4/internal/version.gitTreeState=clean"

T=$SECONDS
log "go build helm.sh/helm/v4/cmd/helm -> $BIN/helm"
$NICE "$GO" build -mod=mod -trimpath -ldflags "$LDFLAGS" -o "$BIN/helm.tmp" helm.sh/helm/v4/cmd/helm >&2 ||
    die "go build failed (see the Go error above)"
"$BIN/helm.tmp" version >&2 || die "the built helm does not run"
mv "$BIN/helm.tmp" "$BIN/helm"
log "built helm in $((SECONDS - T))s"

touch "$OUT"
ls -1dt "$CACHE_ROOT/helm-"*/ 2>/dev/null | tail -n +3 | while read -r old; do
    log "removing old build $old"
    rm -rf "$old"
done
log "done in $((SECONDS - START))s: $BIN/helm"
echo "$BIN"
