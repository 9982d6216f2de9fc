#!/usr/bin/env bash
# Install the Debian packages the real-node tier runs on (a no-op when they are there):
#   libseccomp-dev, pkg-config       to build runc with seccomp (build-runtime.sh builds the nodes'
#                                    containerd and runc; Debian's runc 1.1.5 is not used)
#   containernetworking-plugins      CNI bridge, host-local, loopback and portmap (/usr/lib/cni)
#   iptables, conntrack              kube-proxy's iptables mode
#   buildah, mmdebstrap              the images: the project's Dockerfile, a local Debian base
# A policy-rc.d that refuses service starts is in place for the install only, so no package starts a
# system daemon beside the tier's own.
set -euo pipefail
PACKAGES=(libseccomp-dev pkg-config containernetworking-plugins iptables conntrack buildah mmdebstrap)
missing=()
for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
((${#missing[@]} == 0)) && exit 0
((EUID == 0)) || { echo "node-packages.sh: installing ${missing[*]} needs root" >&2; exit 1; }
echo "node-packages.sh: apt-get install ${missing[*]}" >&2
policy=/usr/sbin/policy-rc.d
own_policy=0
if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod +x "$policy"
    own_policy=1
fi
trap '((own_policy)) && rm -f "$policy"' EXIT
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2
apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
