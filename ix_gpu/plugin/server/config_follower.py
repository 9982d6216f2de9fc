"""Which ix-config the running plugin should be on, and whether its content changed.

Two things move it: the node's config label (``ix-gpu.io/device-plugin.config``) may come to pick
another named config of ``--config DIR``, and the file in use may be edited (a ConfigMap update
arrives as a symlink swap, which sends no useful file event, so the file is re-read each health
interval and compared by content). A bad choice or a bad edit keeps the config in use and says so
once, in the log and in ``ix_gpu_plugin_config_reloads_total{result="error"}``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

from ix_gpu.config.plugin_runtime import RuntimeConfig
from ix_gpu.node.config_loader import load_runtime_config
from ix_gpu.node.node_config import Choice, NodeLabelReader, choose, named_configs
from ix_gpu.process.outcomes import ERROR
from ix_gpu.process.reload import LastGoodFiles

log = logging.getLogger("ix_gpu.plugin.server.app")


class ConfigFollower:
    """The config file in use (``path``), followed through the node's label and its content."""

    def __init__(
        self,
        path: Path | None,
        loaded_content: bytes | None,
        *,
        directory: Path | None,
        reader: NodeLabelReader | None,
        default: str | None,
        record: Callable[[str], None],
        overrides: dict[str, bool] | None = None,
    ) -> None:
        """``loaded_content``: the bytes the config in use came from, when the caller read them
        (then the first poll changes nothing); ``record`` counts each reload's result."""
        self.path = path
        """The config file in use (one of ``directory``'s when the node label picks)."""
        self._directory = directory
        self._reader = reader
        self._default = default
        self._record = record
        self._overrides = overrides or {}
        self._file = self._watch(path, loaded_content) if path is not None else None
        self._choice_problem: str | None = None

    def _watch(self, path: Path, loaded_content: bytes | None) -> LastGoodFiles[RuntimeConfig]:
        return LastGoodFiles(
            "config",
            [path],
            lambda contents: load_runtime_config(contents[0], str(path), self._overrides),
            loaded=[loaded_content] if loaded_content is not None else None,
            record=self._record,
            logger=log,
        )

    async def poll(self) -> RuntimeConfig | None:
        """A newly chosen or newly edited config, validated; None when nothing changed (or the
        change is bad: the one in use stays)."""
        await self._follow_node_label()
        if self._file is None:
            return None
        return await asyncio.to_thread(self._file.poll)

    async def _follow_node_label(self) -> None:
        """Switch to the named config the node's label (or the default) picks, when it changed;
        a choice that names no config keeps the one in use and says so once."""
        if self._directory is None:
            return
        label = await asyncio.to_thread(self._reader.value) if self._reader is not None else None
        try:
            names = await asyncio.to_thread(named_configs, self._directory)
        except OSError as exc:
            names = {}
            choice = Choice(None, f"cannot list {self._directory}: {exc}")
        else:
            choice = choose(names, label, self._default)
        if choice.name is None:
            if choice.reason != self._choice_problem:
                log.error("%s; keeping config %s", choice.reason, self.path or "(built-in defaults)")
                self._record(ERROR)
            self._choice_problem = choice.reason
            return
        self._choice_problem = None
        path = names[choice.name]
        if path != self.path:
            log.info("using config %s: %s", path, choice.reason)
            self.path = path
            self._file = self._watch(path, None)  # read and applied by the poll that follows
