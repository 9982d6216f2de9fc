#!/usr/bin/env bash
# Build one Go command of a module that needs no replace directives, from the Go module proxy:
#
#   bash tests/k8s/build-go-command.sh helm                 # helm.sh/helm/v4/cmd/helm ($IX_HELM_VERSION, v4.3.1)
#   bash tests/k8s/build-go-command.sh training-operator    # kubeflow training-operator v1.8.1 (TFJob controller)
#   bash tests/k8s/build-go-command.sh kwok                 # sigs.k8s.io/kwok v0.8.0 (simulated nodes)
#   bash tests/k8s/build-go-command.sh etcd                 # etcd v3.6.16 (the tier's etcd)
#   bash tests/k8s/build-go-command.sh prometheus           # Prometheus 3.16.0 (module v0.316.0)
#
# Output: ${IX_GPU_CACHE:-~/.cache/ix-gpu}/<name>-<version>-<scripthash>/bin/<name>; nothing is built
# when it is there. Progress goes to stderr; the last stdout line is the bin directory. The two newest
# builds of each command are kept.
#
# A throwaway module requires the command's module at that version and nothing else, so Go selects
# exactly the dependency versions of that module's own build (its go.mod must have no replace
# directives, which a dependent module would not apply; the script warns when it has some). The
# binary is static (CGO_ENABLED=0), so it also runs from a scratch image.
set -euo pipefail

NAME="${1:-}"
TAGS="" # go build -tags, where a command needs some
case "$NAME" in
helm)
    VERSION="${IX_HELM_VERSION:-v4.3.1}"
    MODULE=helm.sh/helm/v4
    PACKAGE=helm.sh/helm/v4/cmd/helm
    # As Helm's Makefile stamps it. Helm v4 reads its default Kubernetes version (`helm template`'s
    # .Capabilities.KubeVersion) from the client-go version in its build info.
    EXTRA_LDFLAGS="-X helm.sh/helm/v4/internal/version.version=$VERSION -X helm.sh/helm/v4/internal/version.gitTreeState=clean"
    SMOKE=(version)
    ;;
training-operator)
    VERSION="${IX_TRAINING_OPERATOR_VERSION:-v1.8.1}"
    MODULE=github.com/kubeflow/training-operator
    PACKAGE=github.com/kubeflow/training-operator/cmd/training-operator.v1
    EXTRA_LDFLAGS=""
    SMOKE=(-h)
    ;;
kwok)
    VERSION="${IX_KWOK_VERSION:-v0.8.0}"
    MODULE=sigs.k8s.io/kwok
    PACKAGE=sigs.k8s.io/kwok/cmd/kwok
    EXTRA_LDFLAGS="-X sigs.k8s.io/kwok/pkg/consts.Version=$VERSION"
    SMOKE=(--help)
    ;;
etcd)
    # The etcd of the Kubernetes versions the tier runs (1.35-1.37 are tested with 3.6). Its
    # server module's replace directives name its sibling modules at the same version, which the
    # proxy serves, so the warning below is expected for it.
    VERSION="${IX_ETCD_VERSION:-v3.6.16}"
    MODULE=go.etcd.io/etcd/server/v3
    PACKAGE=go.etcd.io/etcd/server/v3
    EXTRA_LDFLAGS=""
    SMOKE=(--version)
    ;;
prometheus)
    # The live Prometheus of the real-node tier. Debian's prometheus package is built without
    # Kubernetes service discovery, which the tier's scrape needs. Prometheus' own build tags keep
    # only that discovery (the others pull in every cloud's SDK). Module v0.3XX.Y is Prometheus 3.XX.Y.
    VERSION="${IX_PROMETHEUS_VERSION:-v0.316.0}"
    MODULE=github.com/prometheus/prometheus
    PACKAGE=github.com/prometheus/prometheus/cmd/prometheus
    MINOR="${VERSION#v0.}"
    RELEASE="3.$((10#${MINOR%%.*} - 300)).${MINOR#*.}"
    EXTRA_LDFLAGS="-X github.com/prometheus/common/version.Version=$RELEASE"
    TAGS=remove_all_sd,enable_kubernetes_sd
    SMOKE=(--version)
    ;;
*)
    echo "usage: build-go-command.sh helm|training-operator|kwok|etcd|prometheus" >&2
    exit 2
    ;;
esac

CACHE_ROOT="${IX_GPU_CACHE:-$HOME/.cache/ix-gpu}"
GO="${GO:-}"
if [[ -z "$GO" ]]; then
    if command -v go >/dev/null 2>&1; then GO="$(command -v go)"; else GO=/usr/local/go/bin/go; fi
fi
NICE="${IX_K8S_NICE:-nice -n 10}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

log() { printf '[go-build %s %(%H:%M:%S)T] %s\n' "$NAME" -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[[ "$VERSION" =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "version must look like v1.2.3, got '$VERSION'"
[[ -x "$GO" ]] || die "no Go toolchain at '$GO' (set GO=/path/to/go)"

HASH="$(sha256sum <"$HERE/build-go-command.sh" | cut -c1-12)"
OUT="$CACHE_ROOT/$NAME-$VERSION-$HASH"
BIN="$OUT/bin"

mkdir -p "$CACHE_ROOT"
if [[ -x "$BIN/$NAME" ]]; then
    touch "$OUT"
    log "cached: $BIN/$NAME"
    echo "$BIN"
    exit 0
fi

# One build of this directory at a time; other builds (build.sh's, another command's) run beside it.
LOCK="$CACHE_ROOT/.build-$NAME-$VERSION-$HASH.lock"
exec 9>"$LOCK"
log "waiting for the build lock $LOCK"
flock 9
if [[ -x "$BIN/$NAME" ]]; then
    log "cached (built by another process meanwhile): $BIN/$NAME"
    echo "$BIN"
    exit 0
fi

export GOTOOLCHAIN=local GOFLAGS="${GOFLAGS:-} -buildvcs=false" CGO_ENABLED=0
START=$SECONDS
log "Go: $("$GO" version); $MODULE $VERSION -> $OUT"
rm -rf "$OUT"
mkdir -p "$OUT/src" "$BIN"
cd "$OUT/src"
"$GO" mod init "ix-gpu.test/$NAME" >/dev/null 2>&1 || die "go mod init failed"

log "go get $PACKAGE@$VERSION (downloads modules on a cold cache)"
T=$SECONDS
$NICE "$GO" get "$PACKAGE@$VERSION" >&2 || die "go get failed (see the Go error above)"
log "go get done in $((SECONDS - T))s"
MODULE_DIR="$("$GO" list -m -f '{{.Dir}}' "$MODULE")"
if grep -q '^replace' "$MODULE_DIR/go.mod"; then
    log "WARNING: $MODULE_DIR/go.mod has replace directives, which this throwaway module does not apply"
fi

T=$SECONDS
log "go build $PACKAGE -> $BIN/$NAME"
$NICE "$GO" build -mod=mod -trimpath -tags "$TAGS" -ldflags "-s -w $EXTRA_LDFLAGS" -o "$BIN/$NAME.tmp" "$PACKAGE" >&2 ||
    die "go build failed (see the Go error above)"
"$BIN/$NAME.tmp" "${SMOKE[@]}" >/dev/null 2>&1 || die "the built $NAME does not run ($NAME ${SMOKE[*]})"
mv "$BIN/$NAME.tmp" "$BIN/$NAME"
log "built $NAME in $((SECONDS - T))s"

touch "$OUT"
ls -1dt "$CACHE_ROOT/$NAME-"*/ 2>/dev/null | tail -n +3 | while read -r old; do
    log "removing old build $old"
    rm -rf "$old" "$CACHE_ROOT/.build-$(basename "$old").lock"
done
log "done in $((SECONDS - START))s: $BIN/$NAME"
echo "$BIN"
