"""The plugin's ix-config, validated in a short-lived child (:func:`ix_gpu.process.isolated.call_isolated`)
and held as :class:`RuntimeConfig`: the schema is pydantic, and the long-running plugin process
never imports it (about 12 MiB it could not give back)."""

from __future__ import annotations

from ix_gpu.config.input_files import ConfigError
from ix_gpu.config.plugin_runtime import RuntimeConfig
from ix_gpu.process.isolated import IsolatedCallError, call_isolated

DEFAULTS_SOURCE = "(built-in defaults)"


def load_runtime_config(
    content: bytes | str | None, source: str, overrides: dict[str, bool] | None = None
) -> RuntimeConfig:
    """Validate ``content`` (ours or NVIDIA's format; ``None``: the built-in defaults) with the
    vendor flags of the command line or environment (``overrides``) applied. Raises
    :class:`ConfigError` naming ``source``, the field and its line, as the schema words it."""
    try:
        return call_isolated(_compile, content, source, overrides or {}, inline_if_loaded="pydantic")
    except IsolatedCallError as exc:
        raise ConfigError(f"{source}: cannot validate: {exc}") from None


def _compile(  # runs in the child
    content: bytes | str | None, source: str, overrides: dict[str, bool]
) -> RuntimeConfig:
    from ix_gpu.config.plugin_config import PluginConfig, parse_plugin_yaml, with_vendor_flags

    config = PluginConfig() if content is None else parse_plugin_yaml(content, source)
    return with_vendor_flags(config, overrides, source).runtime()
