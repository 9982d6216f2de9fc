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

Why it is confined: the root is the image's, and the image is the tenant's. Every file in it, and
every volume of the pod mounted in it, is hostile input to a process that starts as the host's root.
So (see ``docs/design.md``, "The linker-cache hook"):

- **Nothing of the image is ever executed.** Only the host's own ``ldconfig`` runs, and only a
  static ELF program (no ``PT_INTERP``, no ``#!``): the kernel would take a script's interpreter or a
  dynamic program's loader from the image once the root is switched, and run it as root.
  ``ldconfig.real`` comes first, since on Ubuntu ``ldconfig`` is a ``#!/bin/sh`` script around it.
  The program is copied into a private tmpfs and the copy is checked and run, so the file that is
  checked is the file that runs. A host without such a program (musl, a script, a dynamic build)
  gets a log line and no cache.
- **ldconfig holds no privilege but the files' owner.** It runs in a user namespace of its own as
  that namespace's uid 1, which is the host's uid 0 (so it may write the image's root-owned
  ``/etc``, as the owner) and root of nothing: no capability in any namespace, ``no_new_privs``, so
  no file it could execute gains any. It is chrooted into the root by ``unshare --root`` before it
  is executed; without ``CAP_SYS_CHROOT`` no ``..`` and no second chroot lead out, and the mount
  namespace it sits in belongs to the host's user namespace, so it can mount and unmount nothing.
- **It sees nothing of the node.** In a private mount namespace (``unshare``), the root's ``/proc``,
  ``/sys`` and ``/dev`` are covered by empty tmpfs: no magic link, kernel tunable or device node is
  reachable by path. ``-X`` changes no symlink in the image, only the cache; ``-f``/``-C`` name the
  image's own configuration and cache; ``-i`` never reads an auxiliary cache the image planted.
- **It is bounded.** A FIFO where ldconfig opens a file blocks it for ever. It runs in a pid
  namespace of its own under ``timeout``: after :data:`LDCONFIG_BOUND_S` the namespace's first
  process is killed (``unshare --kill-child``), and with it every process in the namespace. None of
  them holds the runtime's stdout or stderr (runc waits for both to close, whatever its own hook
  timeout says): their output goes through a pipe to this script, which passes on its last lines.

It never fails the container: a host without a static ``ldconfig`` or the util-linux tools, an image
without ``/etc`` or a read-only root, ldconfig killed at its bound, or a runtime whose state it cannot
read leaves the cache as the image had it. Each such case writes a line on stderr, which the runtime
may log. A user's own ``ldconfig`` run inside the container later rebuilds the cache from the image's
configuration and drops the directory again.
"""

from __future__ import annotations

from typing import Any

HOOK_NAME = "ix-gpu-ldcache"
HOOK_TIMEOUT_S = 30
"""The runtime's bound on the whole hook; it never comes into play, the hook's own bound is shorter."""
LDCONFIG_BOUND_S = 10
"""How long ldconfig may run before it and everything it started are killed. ldconfig over a large
image takes well under a second (0.5 s over 1,100 libraries on a cold cache); this bounds a hostile
root that blocks it (a FIFO where it reads)."""
HOOK_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
"""OCI hooks start with only the environment the spec gives them."""

# The state is one JSON object whose "bundle" precedes "annotations" (the only place a user's key
# could read "bundle"); config.json's first "root":{"path": is the real one, since any string a
# user controls is JSON-escaped and cannot hold `"root":{`. Splitting at commas keeps sed simple.
# The root is the runtime's (containerd's rootfs mount), so it is trusted; what is in it is not.
# The confined part's output comes back through a pipe (never the runtime's own stdout and stderr,
# which a process left behind would hold open) with its exit status as the last line. timeout kills
# only unshare (--foreground: not its own process group, so no shell reports it "Killed"); unshare's
# --kill-child then kills the pid namespace's first process, and the kernel every other one in it.
SCRIPT = r"""set -u
say() { printf '%s: %s\n' "$0" "$*" >&2; }
confined=$1 bound=$2
shift 2
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
for tool in timeout tail unshare mount setpriv od; do
  if ! command -v "$tool" >/dev/null; then
    say "no $tool on this host (coreutils, util-linux); linker cache left as it was"; exit 0
  fi
done
if [ ! -d "$root/etc" ] || [ -L "$root/etc" ]; then
  say "/etc in $root is not a directory; linker cache left as it was"; exit 0
fi
report=$({
  timeout --foreground -s KILL "$bound" unshare --mount --propagation private --pid --kill-child \
    sh -c "$confined" "$0" "$root" "$@" </dev/null >/dev/null
  echo "$?"
} 2>&1 | tail -n 11)
nl='
'
status=${report##*$nl}
if [ "$status" != "$report" ]; then
  printf '%s\n' "${report%$nl*}" >&2
fi
case $status in
  0) ;;
  137) say "ldconfig in $root did not finish in ${bound}s; it was killed; linker cache left as it was" ;;
  *) say "ldconfig in $root failed; linker cache left as it was" ;;
esac
exit 0
"""

# static_elf: a 64-bit little-endian ELF program (e_type EXEC or DYN) none of whose program headers
# is PT_INTERP (3): the kernel runs it without loading anything else. Bytes 32-39 are e_phoff,
# 54-55 e_phentsize (56 for ELF64), 56-57 e_phnum; each header's first 4-byte word is its type.
CONFINED = r"""set -u
say() { printf '%s: %s\n' "$0" "$*" >&2; }
static_elf() {
  file=$1
  set -- $(od -A n -t u1 -v -N 64 "$file")
  [ "$#" = 64 ] && [ "$1.$2.$3.$4.$5.$6" = 127.69.76.70.2.1 ] || return 1
  case ${17}.${18} in 2.0|3.0) ;; *) return 1 ;; esac
  [ "${55}.${56}.${37}.${38}.${39}.${40}" = 56.0.0.0.0.0 ] || return 1
  phoff=$(( ${33} + ${34} * 256 + ${35} * 65536 + ${36} * 16777216 ))
  phnum=$(( ${57} + ${58} * 256 ))
  set -- $(od -A n -t u4 -v -j "$phoff" -N $(( phnum * 56 )) "$file")
  [ "$phnum" -gt 0 ] && [ "$#" = $(( phnum * 14 )) ] || return 1
  while [ "$#" -gt 0 ]; do
    [ "$1" != 3 ] || return 1
    shift 14
  done
}
root=$1
shift
mount --rbind "$root" "$root" && cd "$root" || exit 1
for dir in proc sys dev; do
  if [ -L "$dir" ]; then
    say "/$dir in $root is a link"; exit 1
  fi
  if [ -d "$dir" ]; then
    mount -t tmpfs -o size=16m,mode=0755,nosuid,nodev ix-gpu-ldcache "$dir" || exit 1
  elif [ "$dir" = proc ]; then
    say "$root has no /proc"; exit 1
  fi
done
for ldconfig in /sbin/ldconfig.real /usr/sbin/ldconfig.real /sbin/ldconfig /usr/sbin/ldconfig ''; do
  [ -f "$ldconfig" ] && break
done
if [ -z "$ldconfig" ]; then
  say "no ldconfig on this host"; exit 1
fi
cat "$ldconfig" > proc/ldconfig && chmod 0555 proc/ldconfig || exit 1
if ! static_elf proc/ldconfig; then
  say "$ldconfig is not a static program (a script, or one that loads its interpreter from the" \
    "root it runs in); it is not run"
  exit 1
fi
exec setpriv --no-new-privs --clear-groups unshare --user --map-user=1 --map-group=1 --root=. \
  /proc/ldconfig -i -X -f /etc/ld.so.conf -C /etc/ld.so.cache "$@"
"""


def ldcache_hook(library_dirs: list[str]) -> dict[str, Any]:
    """The CDI hook adding ``library_dirs`` (paths inside the container) to its linker cache."""
    return {
        "hookName": "createContainer",
        "path": "/bin/sh",
        "args": ["sh", "-c", SCRIPT, HOOK_NAME, CONFINED, str(LDCONFIG_BOUND_S), *library_dirs],
        "env": [f"PATH={HOOK_PATH}"],
        "timeout": HOOK_TIMEOUT_S,
    }
