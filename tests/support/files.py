"""Files that a process under test re-reads while it runs (fake devices, configs, certificates)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` in one rename, so a poller never reads half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


@contextlib.contextmanager
def short_tmp_dir(prefix: str) -> Iterator[Path]:
    """A temp dir under /tmp, removed afterwards: unix socket paths are limited to 107 bytes, and
    pytest's tmp_path under a long test name can exceed that."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
