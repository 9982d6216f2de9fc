"""Shared pydantic plumbing for ix-gpu's configuration files.

Every config file is YAML in Kubernetes style (camelCase keys) and strict: an unknown key is an
error that names the key, because a silently ignored typo in a cluster-wide webhook config is the
kind of bug that costs an afternoon. Errors are rendered as ``line 7: path.to[0].field: message``
(the line where the config came from text) so an operator can find it. The YAML itself goes
through :mod:`ix_gpu.config.yaml_input`, the one strict loader: duplicate keys, alias bombs,
deep nesting and oversized files are errors there. :func:`parse_yaml` is the one way from YAML
text to a config model, for the webhook's config, the plugin's and the fake devices file alike.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.alias_generators import to_camel

from ix_gpu.config.input_files import CONFIG_MAX_BYTES, ConfigError, read_capped
from ix_gpu.config.yaml_input import load_yaml
from ix_gpu.config.yaml_lines import lines_of

DIGEST_CHARS = 10
"""Hex characters of a config digest: enough to tell configs apart, short enough for an annotation."""


class StrictModel(BaseModel):
    """camelCase aliases, unknown keys forbidden, immutable once loaded."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
    )

    def digest(self) -> str:
        """Stable content hash: equal for equal configs, so a reload that changes nothing does
        nothing, and recorded in the webhook's ``injected`` annotation."""
        # warnings=False: pydantic's serializer warns about a value of a union with a tuple member
        # (the plugin config's ``devices``) that it then writes correctly; the text is what counts.
        canonical = self.model_dump_json(by_alias=True, warnings=False)
        return hashlib.sha256(canonical.encode()).hexdigest()[:DIGEST_CHARS]


def field_path(loc: Sequence[int | str]) -> str:
    """pydantic's error location as the operator writes it: ``profiles[0].env[1].name``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def describe_validation_error(error: ValidationError, content: bytes | str | None = None) -> str:
    """One ``[line N: ]path: problem`` per error, joined by ``; ``. With ``content`` (the text the
    data came from), each error names the line of its field, or of the nearest enclosing field
    that is in the text (a missing key is reported at its parent)."""
    items = error.errors()
    locs = [tuple(item["loc"]) for item in items]
    lines: list[int | None] = lines_of(content, locs) if content is not None else [None] * len(items)
    parts = []
    for item, loc, line in zip(items, locs, lines, strict=True):
        problem = "unknown key" if item["type"] == "extra_forbidden" else item["msg"]
        where = f"line {line}: " if line is not None else ""
        parts.append(f"{where}{field_path(loc)}: {problem}")
    return "; ".join(parts)


M = TypeVar("M", bound=BaseModel)


def parse_document(model: type[M], data: Any, source: str, content: bytes | str | None = None) -> M:
    """Validate already-parsed YAML/JSON against ``model``; errors name ``source``, the field and,
    given the ``content`` that ``data`` was loaded from, the field's line."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{source}: {describe_validation_error(exc, content)}") from None


def parse_yaml(model: type[M], content: bytes | str, source: str) -> M:
    """The one YAML-to-model loader, for every config file: one document, loaded strictly (see
    :func:`load_yaml`), validated against ``model``. Errors name ``source``, the line and the field
    (``line 7: flags.migStrategy: ...``). Unreadable YAML is a :class:`YamlInputError`, an invalid
    config a plain :class:`ConfigError`."""
    data = load_yaml(content, source, max_bytes=CONFIG_MAX_BYTES)
    return parse_document(model, data, source, content)


def load_yaml_file(model: type[M], path: str | Path) -> M:
    """Read (at most :data:`CONFIG_MAX_BYTES`) and validate one YAML config file."""
    return parse_yaml(model, read_capped(path, CONFIG_MAX_BYTES), str(path))


__all__ = [
    "DIGEST_CHARS",
    "StrictModel",
    "describe_validation_error",
    "field_path",
    "load_yaml_file",
    "parse_document",
    "parse_yaml",
]
