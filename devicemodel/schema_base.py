"""Shared pydantic plumbing for ix-gpu's configuration files.

Every config file is YAML in Kubernetes style (camelCase keys) and strict: an unknown key is an
error that names the key, because a silently ignored typo in a cluster-wide webhook config is the
kind of bug that costs an afternoon. Errors are rendered as ``path.to[0].field: message`` so an
operator can find the line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.alias_generators import to_camel


class StrictModel(BaseModel):
    """camelCase aliases, unknown keys forbidden, immutable once loaded."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
    )


class ConfigError(ValueError):
    """A configuration that cannot be used; ``str()`` is one line per problem, fields named."""


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


def load_yaml_file(model: type[M], path: str | Path) -> M:
    """Read and validate one YAML config file."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from None
    return parse_document(model, data, str(path))
