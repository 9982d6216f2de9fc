"""Shared pydantic plumbing for ix-gpu's configuration files.

Every config file is YAML in Kubernetes style (camelCase keys) and strict: an unknown key is an
error that names the key, because a silently ignored typo in a cluster-wide webhook config is the
kind of bug that costs an afternoon. Errors are rendered as ``path.to[0].field: message`` so an
operator can find the line. The YAML itself goes through :mod:`ix_gpu.devicemodel.yaml_input`, the
one strict loader: duplicate keys, alias bombs, deep nesting and oversized files are errors there.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.alias_generators import to_camel

from ix_gpu.devicemodel.yaml_input import (
    CONFIG_MAX_BYTES,
    ConfigError,
    YamlInputError,
    load_yaml,
    read_capped,
)

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


def _format_location(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def describe_validation_error(error: ValidationError) -> str:
    lines = []
    for item in error.errors():
        where = _format_location(tuple(item["loc"]))
        if item["type"] == "extra_forbidden":
            lines.append(f"{where}: unknown key")
        else:
            lines.append(f"{where}: {item['msg']}")
    return "; ".join(lines)


M = TypeVar("M", bound=BaseModel)


def parse_document(model: type[M], data: Any, source: str) -> M:
    """Validate already-parsed YAML/JSON against ``model``; errors name ``source`` and the field."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{source}: {describe_validation_error(exc)}") from None


def parse_yaml(model: type[M], content: bytes | str, source: str) -> M:
    """Parse one YAML document (strictly, see :func:`load_yaml`) and validate it against ``model``;
    errors name ``source``. Unreadable YAML is a :class:`YamlInputError`, an invalid config a plain
    :class:`ConfigError`."""
    return parse_document(model, load_yaml(content, source, max_bytes=CONFIG_MAX_BYTES), source)


def load_yaml_file(model: type[M], path: str | Path) -> M:
    """Read (at most :data:`CONFIG_MAX_BYTES`) and validate one YAML config file."""
    return parse_yaml(model, read_capped(path, CONFIG_MAX_BYTES), str(path))


__all__ = [
    "DIGEST_CHARS",
    "ConfigError",
    "StrictModel",
    "YamlInputError",
    "describe_validation_error",
    "load_yaml_file",
    "parse_document",
    "parse_yaml",
]
