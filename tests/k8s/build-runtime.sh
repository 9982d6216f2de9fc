#!/usr/bin/env bash
# The real-node tier's container runtime, built from the Go module proxy at pinned versions:
#
#   bash tests/k8s/build-runtime.sh containerd   # containerd v2.3.7 (the 2.3 LTS line): containerd,
#                                                # containerd-shim-runc-v2 and ctr ($IX_CONTAINERD_VERSION)
#   bash tests/k8s/build-runtime.sh runc         # runc v1.5.3 ($IX_RUNC_VERSION), with seccomp
#
# Output: ${IX_GPU_CACHE:-~/.cache/ix-gpu}/<name>-<version>-<scripthash>/bin/; nothing is built when
# it is there. Progress goes to stderr; the last stdout line is the bin directory. The two newest
# builds of each are kept.
#
# Why runc 1.5.3: containerd v2.3.7 is tested upstream with runc v1.5.2 (its
# script/setup/runc-version); v1.5.3 is that line's newest patch. runc needs cgo (its nsexec is C,
# and seccomp goes through libseccomp), so it is built with gcc against Debian's libseccomp-dev
# (node-packages.sh installs it) with runc's own default tags but `libpathrs`: that Rust library
# has no Debian package, and without the tag runc uses its Go implementation of the same safe
# path handling (what runc 1.4 used). containerd needs no cgo (only its btrfs snapshotter would,
# which the tier disables), so its binaries are static like the other Go builds here.
#
# As build-go-command.sh does, a throwaway module requires the command's module at that version
# and nothing else, so Go selects exactly the dependency versions of that module's own build
# (neither go.mod has replace directives; the script warns if one ever does).
set -euo pipefail

NAME="${1:-}"
case "$NAME" in
containerd)
    VERSION="${IX_CONTAINERD_VERSION:-v2.3.7}"
    MODULE=github.com/containerd/containerd/v2
    COMMANDS=(containerd containerd-shim-runc-v2 ctr)
    PACKAGES=("$MODULE/cmd/containerd" "$MODULE/cmd/containerd-shim-runc-v2" "$MODULE/cmd/ctr")
    # As containerd's Makefile stamps them (its default build tags).
    LDFLAGS="-s -w -X $MODULE/version.Version=$VERSION -X $MODULE/version.Package=github.com/containerd/containerd"
    TAGS=urfave_cli_no_docs
    CGO=0
    ;;
runc)
    VERSION="${IX_RUNC_VERSION:-v1.5.3}"
    MODULE=github.com/opencontainers/runc
    COMMANDS=(runc)
    PACKAGES=("$MODULE")
    # runc embeds its VERSION file; its Makefile adds only the git commit, which a module lacks.
    LDFLAGS="-s -w"
    TAGS="seccomp urfave_cli_no_docs"
    CGO=1
    ;;
*)
    echo "usage: build-runtime.sh containerd|runc" >&2
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

log() { printf '[runtime-build %s %(%H:%M:%S)T] %s\n' "$NAME" -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[[ "$VERSION" =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "version must look like v1.2.3, got '$VERSION'"
[[ -x "$GO" ]] || die "no Go toolchain at '$GO' (set GO=/path/to/go)"

HASH="$(sha256sum <"$HERE/build-runtime.sh" | cut -c1-12)"
OUT="$CACHE_ROOT/$NAME-$VERSION-$HASH"
BIN="$OUT/bin"
built() { local c; for c in "${COMMANDS[@]}"; do [[ -x "$BIN/$c" ]] || return 1; done; }

mkdir -p "$CACHE_ROOT"
if built; then
    touch "$OUT"
    log "cached: $BIN"
    echo "$BIN"
    exit 0
fi

# One build of this directory at a time (scripts/test.sh and a test's fixture may ask together).
LOCK="$CACHE_ROOT/.build-$NAME-$VERSION-$HASH.lock"
exec 9>"$LOCK"
log "waiting for the build lock $LOCK"
flock 9
if built; then
    log "cached (built by another process meanwhile): $BIN"
    echo "$BIN"
    exit 0
fi

if ((CGO)); then
    command -v gcc >/dev/null || die "runc needs cgo: no gcc"
    pkg-config --exists libseccomp 2>/dev/null ||
        die "runc's seccomp support needs libseccomp's headers (bash tests/k8s/node-packages.sh installs libseccomp-dev)"
fi

export GOTOOLCHAIN=local GOFLAGS="${GOFLAGS:-} -buildvcs=false" CGO_ENABLED=$CGO
START=$SECONDS
log "Go: $("$GO" version); $MODULE $VERSION -> $OUT"
rm -rf "$OUT"
mkdir -p "$OUT/src" "$BIN"
cd "$OUT/src"
"$GO" mod init "ix-gpu.test/$NAME" >/dev/null 2>&1 || die "go mod init failed"

# Where the module's go.mod asks for a newer Go than the local one, the go command fetches that
# toolchain from the module proxy (as build.sh does for Kubernetes).
MODFILE="$("$GO" mod download -json "$MODULE@$VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')" ||
    die "go mod download $MODULE@$VERSION failed"
UP_GO="$(awk '$1 == "go" { print $2; exit }' "$MODFILE")"
LOCAL_GO="$("$GO" env GOVERSION)"
LOCAL_GO="${LOCAL_GO#go}"
if [[ -n "$UP_GO" && "$(printf '%s\n%s\n' "$UP_GO" "$LOCAL_GO" | sort -V | tail -n 1)" != "$LOCAL_GO" ]]; then
    export GOTOOLCHAIN="go$UP_GO"
    log "$MODULE@$VERSION needs Go $UP_GO, the local one is $LOCAL_GO: GOTOOLCHAIN=$GOTOOLCHAIN"
fi
grep -q '^replace' "$MODFILE" && log "WARNING: $MODULE's go.mod has replace directives, which this module does not apply"

log "go get ${PACKAGES[*]} @$VERSION (downloads modules on a cold cache)"
T=$SECONDS
GET=()
for p in "${PACKAGES[@]}"; do GET+=("$p@$VERSION"); done
$NICE "$GO" get "${GET[@]}" >&2 || die "go get failed (see the Go error above)"
log "go get done in $((SECONDS - T))s"

T=$SECONDS
NEW="$BIN/.new"
rm -rf "$NEW" && mkdir -p "$NEW"
log "go build (CGO_ENABLED=$CGO, tags: $TAGS) -> $NEW/"
# With -o naming a directory, go build writes each main package there under its last path element.
$NICE "$GO" build -mod=mod -trimpath -tags "$TAGS" -ldflags "$LDFLAGS" -o "$NEW/" "${PACKAGES[@]}" >&2 ||
    die "go build failed (see the Go error above)"
for c in "${COMMANDS[@]}"; do
    [[ -x "$NEW/$c" ]] || die "go build wrote no $NEW/$c"
done
for c in "${COMMANDS[@]}"; do
    flag=--version
    [[ $c == containerd-shim-runc-v2 ]] && flag=-v
    "$NEW/$c" "$flag" >&2 || die "the built $c does not run ($c $flag)"
done
if [[ $NAME == runc && "$("$NEW/runc" --version)" != *"libseccomp: "* ]]; then
    die "the built runc has no seccomp support"
fi
for c in "${COMMANDS[@]}"; do mv "$NEW/$c" "$BIN/$c"; done
rmdir "$NEW"
log "built ${COMMANDS[*]} in $((SECONDS - T))s"

touch "$OUT"
ls -1dt "$CACHE_ROOT/$NAME-v"*-????????????/ 2>/dev/null | tail -n +3 | while read -r old; do
    log "removing old build $old"
    rm -rf "$old" "$CACHE_ROOT/.build-$(basename "$old").lock"
done
log "done in $((SECONDS - START))s: $BIN"
echo "$BIN"
