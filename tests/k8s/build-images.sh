#!/usr/bin/env bash
# Build the container images the real-node tier runs, with no registry and no image download:
#
#   base    docker.io/library/python:3.11-slim-bookworm, the Dockerfile's default PYTHON_IMAGE,
#           stood in for by Debian bookworm made with mmdebstrap (python3 3.11, venv, Python's
#           headers as the official image has them, `python` on PATH, ca-certificates, apt's sources),
#           so the project's Dockerfile builds unchanged with --pull=never;
#   pause   registry.k8s.io/pause:3.10, the pod sandbox image, from tests/k8s/images/pause.c (static);
#   ix-gpu  localhost/ix-gpu:<content hash>, built from the project's Dockerfile with buildah;
#   ix-gpu-next  localhost/ix-gpu:<content hash>-next: that image labelled as the next version
#           (org.opencontainers.image.version), for upgrading a release to another image;
#   training-operator  localhost/training-operator:<version>-<hash>: a scratch image holding the
#           Kubeflow training operator's static binary (build-go-command.sh training-operator), the
#           TFJob controller that runs the TFJob example for real;
#   library-check  localhost/library-check:<hash>: an application image that sets ENV
#           LD_LIBRARY_PATH for a library of its own (tests/k8s/images/library-check.c), a few MiB;
#   hostile-root  localhost/hostile-root:<case>-<hash>: that image made hostile, one per case of
#           tests/support/hostile_roots.py, for the CDI hook on a real node.
#
#   bash tests/k8s/build-images.sh            # prints the images directory (last stdout line)
#
# Needs root and the host packages of tests/k8s/node-packages.sh. buildah keeps its own storage under
# ${IX_GPU_CACHE:-~/.cache/ix-gpu}/buildah; each image is also written as a docker archive to
# <cache>/images/<name>-<key>.tar, which the tier imports into each node's containerd under its exact
# name. Each image is keyed by the hash of what it is made from (the recipe below, pause.c, the
# Dockerfile and the files it copies, the base it starts from), so nothing is rebuilt until that
# changes; the project image is rebuilt when the project's files change. <cache>/images/images.json
# names the archives and references.
#
# pip inside the build reaches the package index only with the host's CA bundle mounted into the
# build and the host's network (--network host), as an image build in CI would have.
set -euo pipefail

CACHE_ROOT="${IX_GPU_CACHE:-$HOME/.cache/ix-gpu}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
OUT="$CACHE_ROOT/images"
STORAGE="$CACHE_ROOT/buildah"
RUNROOT="/run/ix-gpu-buildah"
CA_BUNDLE="${IX_GPU_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"
MIRROR="${IX_GPU_DEBIAN_MIRROR:-}"

BASE_REF="docker.io/library/python:3.11-slim-bookworm"
BASE_RECIPE="bookworm minbase python3,python3-venv,python3-dev,python-is-python3,ca-certificates nodoc"
PAUSE_REF="registry.k8s.io/pause:3.10"
PROJECT_REPO="localhost/ix-gpu"

log() { printf '[images %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

((EUID == 0)) || die "needs root (buildah, mmdebstrap)"
for tool in buildah mmdebstrap gcc sha256sum; do
    command -v "$tool" >/dev/null || die "$tool is missing: run tests/k8s/node-packages.sh"
done

BR=(buildah --root "$STORAGE" --runroot "$RUNROOT" --storage-driver overlay)
mkdir -p "$OUT" "$STORAGE"
exec 9>"$CACHE_ROOT/.images.lock"
flock 9

key_of() { sha256sum | cut -c1-16; }
label_of() { # label_of REF: the recipe key an image in buildah's storage was built from, or ""
    "${BR[@]}" inspect --type image --format '{{index .ImageAnnotations "io.ix-gpu.test.key"}}' "$1" 2>/dev/null || true
}
archive() { # archive REF KEY NAME: write the docker archive for REF once per key
    local file="$OUT/$3-$2.tar"
    if [[ ! -s "$file" ]]; then
        log "writing $file"
        rm -f "$file.tmp"
        "${BR[@]}" push -q "$1" "docker-archive:$file.tmp:$1" >/dev/null
        mv "$file.tmp" "$file"
    fi
    # Older archives of the same image are not needed again.
    find "$OUT" -maxdepth 1 -name "$3-*.tar" ! -name "$3-$2.tar" -delete
    echo "$file"
}

# ---------------------------------------------------------------- base
BASE_KEY="$(printf '%s\n' "$BASE_RECIPE" | key_of)"
if [[ "$(label_of "$BASE_REF")" != "$BASE_KEY" ]]; then
    log "base: mmdebstrap $BASE_RECIPE (about a minute)"
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    # Debian's mirror from the host's apt sources unless one is given.
    mmdebstrap --quiet --variant=minbase --include=python3,python3-venv,python3-dev,python-is-python3,ca-certificates \
        --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/locale/*' \
        bookworm "$tmp/base.tar" ${MIRROR:+"$MIRROR"} >&2 || die "mmdebstrap failed"
    ctr="$("${BR[@]}" from scratch)"
    "${BR[@]}" add "$ctr" "$tmp/base.tar" / >/dev/null
    "${BR[@]}" config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        --env LANG=C.UTF-8 --cmd python3 --annotation "io.ix-gpu.test.key=$BASE_KEY" "$ctr"
    "${BR[@]}" commit -q "$ctr" "$BASE_REF" >/dev/null
    "${BR[@]}" rm "$ctr" >/dev/null
    rm -rf "$tmp"
    trap - EXIT
    log "base: built $BASE_REF"
fi

# ---------------------------------------------------------------- pause
PAUSE_KEY="$( { printf '%s\n' "$PAUSE_REF"; cat "$HERE/images/pause.c"; } | key_of)"
if [[ "$(label_of "$PAUSE_REF")" != "$PAUSE_KEY" ]]; then
    log "pause: gcc -static $HERE/images/pause.c"
    tmp="$(mktemp -d)"
    gcc -static -O2 -s -o "$tmp/pause" "$HERE/images/pause.c"
    ctr="$("${BR[@]}" from scratch)"
    "${BR[@]}" copy --chmod 0755 "$ctr" "$tmp/pause" /pause >/dev/null
    "${BR[@]}" config --entrypoint '["/pause"]' --cmd '' --user 65535:65535 \
        --annotation "io.ix-gpu.test.key=$PAUSE_KEY" "$ctr"
    "${BR[@]}" commit -q "$ctr" "$PAUSE_REF" >/dev/null
    "${BR[@]}" rm "$ctr" >/dev/null
    rm -rf "$tmp"
fi
PAUSE_ARCHIVE="$(archive "$PAUSE_REF" "$PAUSE_KEY" pause)"

# ---------------------------------------------------------------- the project image
# What the Dockerfile copies (.dockerignore's allow-list), as they are in the work tree, and the base.
PROJECT_KEY="$(
    cd "$ROOT"
    {
        echo "$BASE_KEY"
        find Dockerfile .dockerignore pyproject.toml setup.py README.md constraints.txt ix_gpu -type f \
            ! -name '*.pyc' ! -path '*/__pycache__/*' | LC_ALL=C sort |
            while read -r f; do printf '%s\n' "$f"; sha256sum <"$f"; done
    } | key_of
)"
PROJECT_REF="$PROJECT_REPO:$PROJECT_KEY"
if [[ "$(label_of "$PROJECT_REF")" != "$PROJECT_KEY" ]]; then
    log "ix-gpu: buildah bud $ROOT/Dockerfile -> $PROJECT_REF"
    t=$SECONDS
    "${BR[@]}" bud --quiet --pull=never --network host --layers=false \
        -v "$CA_BUNDLE:/etc/ssl/certs/ca-certificates.crt:ro" \
        --annotation "io.ix-gpu.test.key=$PROJECT_KEY" \
        -t "$PROJECT_REF" -f "$ROOT/Dockerfile" "$ROOT" >&2 || die "buildah bud failed"
    log "ix-gpu: built in $((SECONDS - t))s"
    # Keep only this build of the project image in buildah's storage.
    { "${BR[@]}" images --format '{{.Name}}:{{.Tag}}' 2>/dev/null || true; } |
        while read -r old; do
            [[ "$old" == "$PROJECT_REPO:"* && "$old" != "$PROJECT_REF" ]] || continue
            "${BR[@]}" rmi -f "$old" >/dev/null 2>&1 || true
        done
fi
PROJECT_ARCHIVE="$(archive "$PROJECT_REF" "$PROJECT_KEY" ix-gpu)"

# ---------------------------------------------------------------- the project's next version
# A second image of the same build, for an upgrade to another image and back: the project image
# with another org.opencontainers.image.version, as a release pipeline labels a new version built
# from unchanged sources. Not a second `bud`: buildah 1.28's layer cache misses on every step of a
# build whose only change is its --label (measured: the whole build again, over two minutes),
# while re-labelling the image it built takes a second and shares all of its layers.
PROJECT_VERSION="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$ROOT/pyproject.toml")"
NEXT_VERSION="$PROJECT_VERSION-next"
NEXT_TAG="$PROJECT_KEY-next"
NEXT_REF="$PROJECT_REPO:$NEXT_TAG"
if [[ "$(label_of "$NEXT_REF")" != "$PROJECT_KEY" ]]; then
    log "ix-gpu next: $PROJECT_REF labelled version $NEXT_VERSION -> $NEXT_REF"
    ctr="$("${BR[@]}" from --pull=never "$PROJECT_REF")"
    "${BR[@]}" config --label "org.opencontainers.image.version=$NEXT_VERSION" \
        --annotation "io.ix-gpu.test.key=$PROJECT_KEY" "$ctr"
    "${BR[@]}" commit -q "$ctr" "$NEXT_REF" >/dev/null
    "${BR[@]}" rm "$ctr" >/dev/null
fi
NEXT_ARCHIVE="$(archive "$NEXT_REF" "$PROJECT_KEY" ix-next)"

# ---------------------------------------------------------------- the training operator
TO_BIN="$(bash "$HERE/build-go-command.sh" training-operator | tail -1)/training-operator"
TO_KEY="$(sha256sum <"$TO_BIN" | key_of)"
TO_REF="localhost/training-operator:$(basename "$(dirname "$(dirname "$TO_BIN")")" | cut -d- -f3)-$TO_KEY"
if [[ "$(label_of "$TO_REF")" != "$TO_KEY" ]]; then
    log "training-operator: scratch image with $TO_BIN"
    ctr="$("${BR[@]}" from scratch)"
    "${BR[@]}" copy --chmod 0755 "$ctr" "$TO_BIN" /training-operator >/dev/null
    "${BR[@]}" config --entrypoint '["/training-operator"]' --cmd '' --user 65532:65532 \
        --annotation "io.ix-gpu.test.key=$TO_KEY" "$ctr"
    "${BR[@]}" commit -q "$ctr" "$TO_REF" >/dev/null
    "${BR[@]}" rm "$ctr" >/dev/null
fi
TO_ARCHIVE="$(archive "$TO_REF" "$TO_KEY" training-operator)"

# ---------------------------------------------------------------- the library-check image
# An application image as CUDA-like images are: ENV LD_LIBRARY_PATH=/opt/imglib, where a library
# of its own is. From scratch, with this host's glibc (its loader and libc), an ld.so.conf and the
# cache ldconfig makes of them, and /check (images/library-check.c) as its entrypoint: a few MiB,
# where a layer on the project image would archive all of it again.
LIBC="$(readlink -f /lib/x86_64-linux-gnu/libc.so.6)"
LOADER="$(readlink -f /lib64/ld-linux-x86-64.so.2)"
LC_KEY="$( { cat "$HERE/images/library-check.c" "$HERE/images/image-library.c"; sha256sum <"$LIBC"; } | key_of)"
LC_REF="localhost/library-check:$LC_KEY"
LC_ROOT="$CACHE_ROOT/library-check-root-$LC_KEY"  # kept: the hostile images below start from it
if [[ ! -x "$LC_ROOT/check" ]]; then
    rm -rf "$CACHE_ROOT"/library-check-root-* "$LC_ROOT.tmp"
    root="$LC_ROOT.tmp"
    mkdir -p "$root/lib/x86_64-linux-gnu" "$root/lib64" "$root/etc/ld.so.conf.d" "$root/opt/imglib" \
        "$root/proc" "$root/sys" "$root/dev" "$root/tmp"
    cp "$LIBC" "$root/lib/x86_64-linux-gnu/libc.so.6"
    cp "$LOADER" "$root/lib64/ld-linux-x86-64.so.2"
    echo 'include /etc/ld.so.conf.d/*.conf' >"$root/etc/ld.so.conf"
    gcc -O2 -o "$root/check" "$HERE/images/library-check.c"
    gcc -O2 -shared -fPIC -Wl,-soname,libimg.so -o "$root/opt/imglib/libimg.so" "$HERE/images/image-library.c"
    ldconfig -r "$root"
    mv "$root" "$LC_ROOT"
fi
scratch_image() { # scratch_image ROOT REF KEY [config args...]: an image of ROOT's files, /check its entrypoint
    local root=$1 ref=$2 key=$3 ctr
    shift 3
    ctr="$("${BR[@]}" from scratch)"
    "${BR[@]}" copy "$ctr" "$root" / >/dev/null
    "${BR[@]}" config --entrypoint '["/check"]' --cmd '' --annotation "io.ix-gpu.test.key=$key" "$@" "$ctr"
    "${BR[@]}" commit -q "$ctr" "$ref" >/dev/null
    "${BR[@]}" rm "$ctr" >/dev/null
}
if [[ "$(label_of "$LC_REF")" != "$LC_KEY" ]]; then
    log "library-check: scratch image with this host's glibc"
    scratch_image "$LC_ROOT" "$LC_REF" "$LC_KEY" --env LD_LIBRARY_PATH=/opt/imglib
fi
LC_ARCHIVE="$(archive "$LC_REF" "$LC_KEY" library-check)"

# ---------------------------------------------------------------- hostile roots
# The library-check root made hostile, one image per case of tests/support/hostile_roots.py (links
# into /proc/1/root/var/lib/ix-gpu-tier/hook-target, FIFOs, loops, ...): a tenant's image as the
# CDI hook meets it on a real node. A few MiB each.
PY="$ROOT/.venv/bin/python"
[[ -x "$PY" ]] || PY=python3
HR_KEY="$( { echo "$LC_KEY"; cat "$ROOT/tests/support/hostile_roots.py"; } | key_of)"
HOSTILE_JSON=""
for case in $(cd "$ROOT" && "$PY" -m tests.support.hostile_roots /); do
    ref="localhost/hostile-root:$case-$HR_KEY"
    if [[ "$(label_of "$ref")" != "$HR_KEY" ]]; then
        tmp="$(mktemp -d)"
        cp -a "$LC_ROOT/." "$tmp/"
        (cd "$ROOT" && "$PY" -m tests.support.hostile_roots "$tmp" "$case") || die "hostile root $case"
        scratch_image "$tmp" "$ref" "$HR_KEY"
        rm -rf "$tmp"
    fi
    archive_file="$(archive "$ref" "$HR_KEY" "hostile-$case")"
    HOSTILE_JSON+="${HOSTILE_JSON:+, }\"$case\": {\"ref\": \"$ref\", \"archive\": \"$archive_file\"}"
done

cat >"$OUT/images.json" <<JSON
{
  "base": {"ref": "$BASE_REF", "key": "$BASE_KEY"},
  "pause": {"ref": "$PAUSE_REF", "archive": "$PAUSE_ARCHIVE"},
  "ix-gpu": {"ref": "$PROJECT_REF", "repository": "$PROJECT_REPO", "tag": "$PROJECT_KEY", "archive": "$PROJECT_ARCHIVE"},
  "ix-gpu-next": {"ref": "$NEXT_REF", "repository": "$PROJECT_REPO", "tag": "$NEXT_TAG", "version": "$NEXT_VERSION", "archive": "$NEXT_ARCHIVE"},
  "training-operator": {"ref": "$TO_REF", "archive": "$TO_ARCHIVE"},
  "library-check": {"ref": "$LC_REF", "archive": "$LC_ARCHIVE"},
  "hostile-roots": {$HOSTILE_JSON}
}
JSON
log "done: $OUT/images.json"
echo "$OUT"
