"""The CDI hook that puts the driver's libraries in a container's linker cache, run confined to the
container's own root.

Why a hook and not an ``env`` edit: a CDI ``env`` edit *sets* a variable. ``LD_LIBRARY_PATH=<driver
lib>`` in a spec replaced the image's own value (every CUDA-like image has one), the pod's, and the
path list the webhook had merged, because the runtime applies CDI edits last. The linker cache
adds a directory without touching any variable: the container's ``/etc/ld.so.cache`` is rebuilt
with the driver's library directory in it, and a library there loads by name whatever
``LD_LIBRARY_PATH`` says. This is how NVIDIA's CDI specs do it (their ``update-ldcache`` hook).

How it runs: a ``createContainer`` hook, which the OCI runtime (runc, crun) runs as root after the
container's mounts are in place (the driver root and procfs among them) and before it switches
to the container's root. Its path must exist on the host, so it is ``/bin/sh`` with the scripts
inline: there is nothing to install on the node, and the spec stays self-contained. The script
reads the bundle from the container state on stdin and the root from the bundle's
``config.json``.

Why it is confined: the root is the image's, and the image is the tenant's. ``ldconfig -r``
alone chroots into it, but follows the image's symlinks there, and ``/proc/1/root`` (procfs is
mounted in the root) leads back to the host: an image whose ``/etc`` or ``/var/cache/ldconfig``
was a link into ``/proc/1/root/<host dir>`` had the cache written there as host root. So ldconfig
runs where no path leads out (see ``docs/design.md``, "The linker-cache hook"):

- in a private mount namespace of its own (``unshare``), so nothing it mounts reaches the
  container or the host, and in a new pid namespace, so no process of the container's is visible;
- with the root's ``/proc``, ``/sys`` and ``/dev`` covered by empty tmpfs: no magic link, no
  kernel tunable and no device node is reachable by path;
- with the container's root moved over ``/`` and then chrooted into (``mount --move``, as runc
  does without pivot_root): the host's tree is under that mount, and no ``..`` reaches it;
- as the **host's** ``ldconfig`` (never the image's: a binary from the image, run as root, is what
  CVE-2025-23266 was), a static binary copied into the tmpfs over ``/proc`` before the move;
- with every capability dropped but ``CAP_SYS_CHROOT`` and ``no_new_privs`` set
  (``setpriv``): even an ldconfig subverted by a crafted library could not mount, unmount,
  open by handle, or trace its way out;
- ``-X``, so it changes no symlink in the image, only the cache; ``-f``/``-C`` name the image's
  own configuration and cache, since the host's ldconfig may default to others; ``-i`` so it never
  reads an auxiliary cache that the image planted (a FIFO there would hang it).

It never fails the container: a host without ``ldconfig`` (musl) or the util-linux tools, an image
without ``/etc`` or a read-only root, or a runtime whose state it cannot read leaves the cache as
the image had it. Each such case writes one line on stderr, which the runtime may log. A user's own
``ldconfig`` run inside the container later rebuilds the cache from the image's configuration and
drops the directory again.
"""

from __future__ import annotations

from typing import Any

HOOK_NAME = "ix-gpu-ldcache"
HOOK_TIMEOUT_S = 30
"""ldconfig over a large image takes well under a second; this only bounds a wedged host."""
HOOK_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
"""OCI hooks start with only the environment the spec gives them."""

# The state is one JSON object whose "bundle" precedes "annotations" (the only place a user's key
# could read "bundle"); config.json's first "root":{"path": is the real one, since any string a
# user controls is JSON-escaped and cannot hold `"root":{`. Splitting at commas keeps sed simple.
# The root is the runtime's (containerd's rootfs mount), so it is trusted; what is in it is not.
SCRIPT = r"""set -u
say() { printf '%s: %s\n' "$0" "$*" >&2; }
confined=$1
shift
bundle=$(tr ',' '\n' | sed -n 's/^[{ ]*"bundle" *: *"\([^"]*\)".*/\1/p' | head -n 1)
if [ -z "$bundle" ] || [ ! -f "$bundle/config.json" ]; then
  say "no bundle in the container state; linker cache left as it was"; exit 0
fi
pattern='s/.*"root" *: *{ *"path" *: *"\([^"]*\)".*/\1/p'
root=$(tr ',' '\n' < "$bundle/config.json" | sed -n "$pattern" | head -n 1)
case $root in
  '') say "no root in $bundle/config.json; linker cache left as it was"; exit 0 ;;
  /*) ;;
  *) root=$bundle/$root ;;
esac
for ldconfig in /sbin/ldconfig /usr/sbin/ldconfig ''; do
  [ -x "$ldconfig" ] && break
done
if [ -z "$ldconfig" ]; then
  say "no ldconfig on this host; linker cache left as it was"; exit 0
fi
for tool in unshare mount setpriv chroot; do
  if ! command -v "$tool" >/dev/null; then
    say "no $tool on this host (util-linux, coreutils); linker cache left as it was"; exit 0
  fi
done
if [ ! -d "$root/etc" ] || [ -L "$root/etc" ]; then
  say "/etc in $root is not a directory; linker cache left as it was"; exit 0
fi
unshare --mount --propagation private --pid --fork sh -c "$confined" "$0" "$root" "$ldconfig" "$@" ||
  say "ldconfig in $root failed; linker cache left as it was"
exit 0
"""

CONFINED = r"""set -u
root=$1 ldconfig=$2
shift 2
mount --rbind "$root" "$root" && cd "$root" || exit 1
for dir in proc sys dev; do
  if [ -L "$dir" ]; then
    printf '%s: /%s in %s is a link\n' "$0" "$dir" "$root" >&2; exit 1
  fi
  if [ -d "$dir" ]; then
    mount -t tmpfs -o size=16m,mode=0755,nosuid,nodev ix-gpu-ldcache "$dir" || exit 1
  elif [ "$dir" = proc ]; then
    printf '%s: %s has no /proc\n' "$0" "$root" >&2; exit 1
  fi
done
cat "$ldconfig" > proc/ldconfig && chmod 0555 proc/ldconfig && mount --move . / || exit 1
exec setpriv --no-new-privs --inh-caps=-all --bounding-set=-all,+sys_chroot \
  chroot . /proc/ldconfig -i -X -f /etc/ld.so.conf -C /etc/ld.so.cache "$@"
"""


def ldcache_hook(library_dirs: list[str]) -> dict[str, Any]:
    """The CDI hook adding ``library_dirs`` (paths inside the container) to its linker cache."""
    return {
        "hookName": "createContainer",
        "path": "/bin/sh",
        "args": ["sh", "-c", SCRIPT, HOOK_NAME, CONFINED, *library_dirs],
        "env": [f"PATH={HOOK_PATH}"],
        "timeout": HOOK_TIMEOUT_S,
    }
