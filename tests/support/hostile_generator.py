"""A seeded generator of hostile image roots for the linker-cache hook: the named roots of
:mod:`tests.support.hostile_roots` are one attacker's ideas; these are their combinations, drawn at
random, so the hook meets roots nobody wrote down. ``bench/adversarial_node.py`` runs hundreds per host
layout; CI runs a few per layout, a different slice per commit.

Every root starts as the benign bundle's, gets the payload (:mod:`tests.support.host_layouts`) as its
``/bin/sh`` and program loader, so any run of the image's code is seen, and then one to four
features, each drawn by weight from :data:`FEATURES`:

- a **link** from a place ldconfig reads or writes (its cache and temporary file, the aux-cache and
  its directory, ``ld.so.conf`` and an included file, a configured library directory, a library in
  one) to the host directory, by one of the ways out of a root: ``/proc/1/root``,
  ``/proc/self/root``, ``..`` far enough to pass ``/``, with or without procfs, and plain absolute;
- a **special file** where ldconfig reads: a FIFO (it blocks whoever opens it), a socket, or a
  device node (``null``, ``zero``, ``random``);
- a hostile **``ld.so.conf``**: includes of the host directory and of itself, 50,000 lines, a
  100 KB line, directories that do not exist;
- a **huge** library (a sparse 4 GiB file) or a **forged ELF header** (program headers past its end);
- a **deep** tree (120 directories) or **many** files (2,000) in a configured directory;
- **link loops**.

Not ``/dev`` or ``/sys`` as a link: runc handles those before the hook runs, and the named roots
have the cases it refuses. (Drawn at random they found that Debian's runc 1.1.5 follows an image's
``/dev`` that is a link to an absolute path, or through ``/proc/self/root``, and creates its
``/dev/fd``, ``ptmx``, ``stdin``, ``stdout`` and ``stderr`` links in that host directory: runc's
own hole, whatever hook runs. The tier now builds runc 1.5, which writes nothing there:
``tests/node/test_tier_runc.py``.)

A root is reproduced from its seed alone: :func:`generate` is deterministic in ``seed``.
"""

from __future__ import annotations

import os
import random
import stat
from collections.abc import Callable
from pathlib import Path

from tests.support.host_layouts import plant_payload
from tests.support.hostile_roots import build_library, clear, link

CONFIGURED = "opt/lib"
"""The library directory every generated ``ld.so.conf`` lists (the benign one lists only includes)."""
PLACES = (
    "etc/ld.so.cache",
    "etc/ld.so.cache~",
    "var/cache/ldconfig",
    "var/cache/ldconfig/aux-cache",
    "etc/ld.so.conf",
    "etc/ld.so.conf.d/generated.conf",
    CONFIGURED,
    f"{CONFIGURED}/libgen.so.1",
    "usr/lib/libapp.so.1.2",
)
READ_PLACES = ("etc/ld.so.conf", "etc/ld.so.conf.d/generated.conf", f"{CONFIGURED}/libgen.so.1")
"""Where ldconfig opens a file to read it (a FIFO there blocks it until the hook's bound)."""
DEVICES = {"null": (1, 3), "zero": (1, 5), "random": (1, 8)}


def ways_out(host: str) -> list[str]:
    """The paths by which a link in the root can aim at ``host``."""
    up = "../" * 16
    return [
        f"/proc/1/root{host}",
        f"/proc/self/root{host}",
        f"{up}proc/1/root{host}",
        f"{up}{host[1:]}",
        host,
    ]


def unlinked(rootfs: Path, place: str) -> Path | None:
    """``rootfs/place`` when no directory on the way to it is a link (an earlier feature's link out
    of the root would have the generator itself write on the host); None otherwise."""
    path = rootfs / place
    for parent in path.relative_to(rootfs).parents:
        if (rootfs / parent).is_symlink():
            return None
    return path


class Generator:
    """Makes roots from one seed; :meth:`root` applies one root's features."""

    def __init__(self, seed: int, host: str, work: Path) -> None:
        self.rng = random.Random(seed)
        self.host = host
        self.work = work

    def root(self, rootfs: Path) -> list[str]:
        """Make ``rootfs`` (a benign root) hostile; the names of the features applied."""
        plant_payload(rootfs, self.work)
        (rootfs / "etc/ld.so.conf").write_text(f"/{CONFIGURED}\ninclude /etc/ld.so.conf.d/*.conf\n")
        build_library(rootfs / CONFIGURED / "libgen.so.1", "libgen.so.1")
        applied = []
        for _ in range(self.rng.randint(1, 4)):
            names, weights = zip(*((name, weight) for name, (weight, _) in FEATURES.items()), strict=True)
            name = self.rng.choices(names, weights)[0]
            applied.append(FEATURES[name][1](self, rootfs) or name)
        return applied

    def _link(self, rootfs: Path) -> str:
        place, target = self.rng.choice(PLACES), self.rng.choice(ways_out(self.host))
        path = unlinked(rootfs, place)
        if path is None:
            return f"(link {place}: behind a link already)"
        link(path, target if place != CONFIGURED else f"{target}/lib")
        return f"link {place} -> {target}"

    def _special(self, rootfs: Path) -> str:
        place = self.rng.choice((*READ_PLACES, "etc/ld.so.cache", "var/cache/ldconfig/aux-cache"))
        kind = self.rng.choices(["fifo", "socket", *DEVICES], [1, 2, 2, 2, 2])[0]
        where = unlinked(rootfs, place)
        if where is None:
            return f"({kind} at {place}: behind a link already)"
        path = clear(where)
        if kind == "fifo":
            os.mkfifo(path)
        elif kind == "socket":
            os.mknod(path, stat.S_IFSOCK | 0o666)
        else:
            os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(*DEVICES[kind]))
        return f"{kind} at {place}"

    def _conf(self, rootfs: Path) -> str:
        out = self.rng.choice(ways_out(self.host))
        lines = [f"include {out}/*.conf", "include /etc/ld.so.conf", f"{out}/lib", "/no/such/dir"]
        lines += [f"/{CONFIGURED}/d{i}" for i in range(self.rng.choice([0, 50_000]))]
        lines.append("/" + "x" * self.rng.choice([10, 100_000]))
        self.rng.shuffle(lines)
        place = self.rng.choice(["etc/ld.so.conf", "etc/ld.so.conf.d/generated.conf"])
        where = unlinked(rootfs, place)
        if where is None:
            return f"(hostile {place}: behind a link already)"
        clear(where).write_text("\n".join(lines) + "\n")
        return f"hostile {place} via {out}"

    def _huge(self, rootfs: Path) -> str:
        where = unlinked(rootfs, f"{CONFIGURED}/libhuge.so.1")
        if where is None:
            return "(huge library: behind a link already)"
        path = clear(where)
        if self.rng.random() < 0.5:
            with path.open("wb") as out:
                out.truncate(4 << 30)
            return "sparse 4 GiB library"
        header = bytearray(64)
        header[:7] = b"\x7fELF\x02\x01\x01"
        header[16:18] = (3).to_bytes(2, "little")  # ET_DYN
        header[32:40] = (1 << 40).to_bytes(8, "little")  # program headers a terabyte away
        header[54:58] = (56).to_bytes(2, "little") + (0xFFFF).to_bytes(2, "little")
        path.write_bytes(bytes(header))
        return "forged ELF header"

    def _tree(self, rootfs: Path) -> str:
        if unlinked(rootfs, f"{CONFIGURED}/x") is None or unlinked(rootfs, "etc/ld.so.conf.d/x") is None:
            return "(tree: behind a link already)"
        base = rootfs / CONFIGURED
        if self.rng.random() < 0.5:
            deep = base.joinpath(*["d"] * 120)
            deep.mkdir(parents=True, exist_ok=True)
            build_library(deep / "libdeep.so.1", "libdeep.so.1")
            conf = rootfs / "etc/ld.so.conf.d/generated.conf"
            clear(conf).write_text("/" + str(deep.relative_to(rootfs)) + "\n")
            return "deep tree"
        many = base / "many"
        many.mkdir(parents=True, exist_ok=True)
        for i in range(2000):
            (many / f"lib{i}.so.1").write_bytes(b"not an ELF file\n")
        clear(rootfs / "etc/ld.so.conf.d/generated.conf").write_text(f"/{CONFIGURED}/many\n")
        return "many files"

    def _loops(self, rootfs: Path) -> str:
        if any(unlinked(rootfs, p) is None for p in (f"{CONFIGURED}/x", "opt/x", "etc/ld.so.conf.d/x")):
            return "(loops: behind a link already)"
        link(rootfs / CONFIGURED / "libloop.so.1", "libloop.so.2")
        link(rootfs / CONFIGURED / "libloop.so.2", "libloop.so.1")
        link(rootfs / CONFIGURED / "self", ".")
        link(rootfs / "opt/a", "/opt/b")
        link(rootfs / "opt/b", "/opt/a")
        clear(rootfs / "etc/ld.so.conf.d/generated.conf").write_text("/opt/a\n/opt/lib/self\n")
        return "link loops"


FEATURES: dict[str, tuple[int, Callable[[Generator, Path], str]]] = {
    "link": (10, Generator._link),
    "special": (3, Generator._special),
    "conf": (3, Generator._conf),
    "huge": (2, Generator._huge),
    "tree": (2, Generator._tree),
    "loops": (2, Generator._loops),
}
"""Each feature's weight and what applies it (returning a description of what it did)."""


def generate(seed: int, host: str, work: Path, rootfs: Path) -> list[str]:
    """Root ``rootfs`` made hostile from ``seed`` alone, aimed at ``host``."""
    return Generator(seed, host, work).root(rootfs)
