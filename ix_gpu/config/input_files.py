"""Reading config-like files, and the error every config problem is: no yaml, no pydantic.

The device plugin reads its config and devices files here and has them validated elsewhere (in a
short-lived child, :mod:`ix_gpu.process.isolated`), so what it needs to read bytes and report problems is
kept apart from the YAML loader (:mod:`.yaml_input`). This is the one home of :class:`ConfigError`:
every module that raises or catches it imports it from here."""

from __future__ import annotations

from pathlib import Path
from typing import Final

MiB: Final = 1024 * 1024

CONFIG_MAX_BYTES: Final = 1 * MiB
"""Config and fake-devices files: real ones are a few KB, and a ConfigMap cannot exceed 1 MiB."""


class ConfigError(ValueError):
    """A configuration that cannot be used; ``str()`` is one line per problem, fields named.

    Defined here, the bottom of the device model and free of yaml and pydantic, so the loader can
    raise it and the device plugin can catch it without importing either."""


class YamlInputError(ConfigError):
    """The bytes are not a document ix-gpu will read: unreadable file, not text, bad syntax, a
    duplicate key, or over a limit. A :class:`ConfigError` (callers that catch that keep working);
    the CLI tells it apart from a readable document that is not a valid config (exit 2, not 1)."""


def size_text(n: int) -> str:
    return f"{n // MiB} MiB" if n % MiB == 0 else f"{n:,} bytes"


def read_capped(path: str | Path, max_bytes: int) -> bytes:
    """The file's bytes, reading at most ``max_bytes + 1`` (so /dev/zero or a huge file costs
    nothing); unreadable or too large is a :class:`YamlInputError` naming the file."""
    try:
        with open(path, "rb") as handle:
            content = handle.read(max_bytes + 1)
    except OSError as exc:
        raise YamlInputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(content) > max_bytes:
        raise YamlInputError(f"{path}: refused: larger than {size_text(max_bytes)}")
    return content
