#!/usr/bin/env bash
# The containerd of the real-node tier; prints the directory holding containerd, its runc shim and
# ctr. The nodes' runc is the same in both lanes: build-runtime.sh runc (v1.5.3).
#
#   bash tests/k8s/containerd.sh                        # containerd 2.3 (the default lane)
#   IX_GPU_CONTAINERD=1.7 bash tests/k8s/containerd.sh  # containerd 1.7 (the second lane)
#
# 2.3, the LTS line clusters move to (Kubernetes 1.35 is the last release to support 1.x), is built
# from the Go module proxy by build-runtime.sh, pinned and cached as the Kubernetes builds are.
# 1.7 is kept as a lane of its own because it costs one download: the oldest line that resolves CDI
# device IDs (the kubelet names a DRA claim's devices by CDI ID; containerd 1.6, bookworm's package,
# ignores them). Debian trixie's build, whose binaries need only glibc >= 2.34, is fetched from the
# Debian archive once, checked against the pinned SHA-256 and unpacked into the cache; nothing is
# installed on the host.
set -euo pipefail

LANE="${IX_GPU_CONTAINERD:-2.3}"
case "$LANE" in
2.3) exec bash "$(dirname "${BASH_SOURCE[0]}")/build-runtime.sh" containerd ;;
1.7) ;;
*) echo "containerd.sh: IX_GPU_CONTAINERD must be 2.3 or 1.7, got '$LANE'" >&2; exit 2 ;;
esac

VERSION="1.7.24~ds1-6+deb13u1"
SHA256="ed708deb96fe476a3bce4efa5c0538dfbcf717ab9a7c7944ba7260342c25899c"
MIRROR="${IX_GPU_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
URL="$MIRROR/pool/main/c/containerd/containerd_${VERSION}_amd64.deb"
CACHE_ROOT="${IX_GPU_CACHE:-$HOME/.cache/ix-gpu}"
DEST="$CACHE_ROOT/containerd-${VERSION//\~/-}"

die() { echo "containerd.sh: $*" >&2; exit 1; }

if [[ ! -x $DEST/bin/containerd ]]; then
    [[ $(dpkg --print-architecture 2>/dev/null) == amd64 ]] || die "only amd64 is pinned here"
    work="$(mktemp -d)"
    trap 'rm -rf "$work"' EXIT
    echo "containerd.sh: fetching $URL" >&2
    curl -fsS --retry 3 -o "$work/containerd.deb" "$URL" || die "cannot fetch $URL"
    echo "$SHA256  $work/containerd.deb" | sha256sum -c --quiet - >&2 || die "SHA-256 mismatch for $URL"
    dpkg-deb -x "$work/containerd.deb" "$work/root"
    mkdir -p "$work/bin"
    for tool in containerd containerd-shim-runc-v2 ctr; do
        install -m 0755 "$work/root/usr/bin/$tool" "$work/bin/$tool"
    done
    "$work/bin/containerd" --version >&2 || die "the unpacked containerd does not run on this machine"
    rm -rf "$DEST.tmp" && mkdir -p "$CACHE_ROOT" && mv "$work/bin" "$DEST.tmp"
    rm -rf "$DEST" && mkdir -p "$DEST" && mv "$DEST.tmp" "$DEST/bin"
fi
echo "$DEST/bin"
