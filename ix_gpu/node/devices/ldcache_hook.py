"""The CDI hook that puts the driver's libraries in a container's linker cache.

Why a hook and not an ``env`` edit: a CDI ``env`` edit *sets* a variable. ``LD_LIBRARY_PATH=<driver
lib>`` in a spec replaced the image's own value (every CUDA-like image has one), the pod's, and the
path list the webhook had merged, because the runtime applies CDI edits last. The linker cache
adds a directory without touching any variable: the container's ``/etc/ld.so.cache`` is rebuilt
with the driver's library directory in it, and a library there loads by name whatever
``LD_LIBRARY_PATH`` says. This is how NVIDIA's CDI specs do it (their ``update-ldcache`` hook).

How it runs: a ``createContainer`` hook, which the OCI runtime (runc, crun) runs after the
container's mounts are in place (the driver root among them) and before it switches to the
container's root. Its path must exist on the host, so it is ``/bin/sh`` with the script inline:
there is nothing to install on the node, and the spec stays self-contained. The script reads the
bundle from the container state on stdin, the root from the bundle's ``config.json``, and runs
the **host's** ``ldconfig -r <root> -X <dir>``: the host's binary, never the image's (a binary
from the image, run as root before the switch to the container's root, could reach the host),
chrooted into the container's root by ldconfig itself, and ``-X`` so it changes no symlink in the
image, only the cache.

It never fails the container: a host without ``ldconfig`` (musl), an image without ``/etc``, or a
runtime whose state it cannot read leaves the cache as the image had it, and the webhook's
``LD_LIBRARY_PATH`` (for pods it injects) still finds the driver. Each such case writes one line
on stderr, which the runtime may log. A user's own ``ldconfig`` run inside the container later
rebuilds the cache from the image's configuration and drops the directory again.
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
SCRIPT = r"""set -u
say() { printf '%s: %s\n' "$0" "$*" >&2; }
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
"$ldconfig" -r "$root" -X "$@" || say "ldconfig -r $root failed; linker cache left as it was"
exit 0
"""


def ldcache_hook(library_dirs: list[str]) -> dict[str, Any]:
    """The CDI hook adding ``library_dirs`` (paths inside the container) to its linker cache."""
    return {
        "hookName": "createContainer",
        "path": "/bin/sh",
        "args": ["sh", "-c", SCRIPT, HOOK_NAME, *library_dirs],
        "env": [f"PATH={HOOK_PATH}"],
        "timeout": HOOK_TIMEOUT_S,
    }
