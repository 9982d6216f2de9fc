"""The plugin's ix-config, validated in a short-lived child (:func:`ix_gpu.process.isolated.call_isolated`)
and held as :class:`RuntimeConfig`: the schema is pydantic, and the long-running plugin process
never imports it (about 12 MiB it could not give back)."""

from __future__ import annotations

from ix_gpu.config.input_files import ConfigError
from ix_gpu.config.plugin_runtime import RuntimeConfig
from ix_gpu.process.isolated import IsolatedCallError, call_isolated

DEFAULTS_SOURCE = "(built-in defaults)"


def load_runtime_config(content: bytes | str | None, source: str) -> RuntimeConfig:
    """Validate ``content`` (ours or NVIDIA's format; ``None``: the built-in defaults). Raises
    :class:`ConfigError` naming ``source``, the field and its line, as the schema words it."""
    try:
        return call_isolated(_compile, content, source, inline_if_loaded="pydantic")
    except IsolatedCallError as exc:
        raise ConfigError(f"{source}: cannot validate: {exc}") from None


def _compile(content: bytes | str | None, source: str) -> RuntimeConfig:  # runs in the child
    from ix_gpu.config.plugin_config import PluginConfig, parse_plugin_yaml

    config = PluginConfig() if content is None else parse_plugin_yaml(content, source)
    return config.runtime()
