"""Hot reload of the serving certificate and the webhook config, without a restart.

Files are polled by content digest rather than watched with inotify: Kubernetes updates Secret
and ConfigMap volumes by swapping a ``..data`` symlink, which sends no event for the file path
we hold, and ``subPath`` mounts never change at all. Re-reading two small files every few seconds
is cheap and catches every way a file can change.

A bad new file never replaces a good live one: the last good certificate keeps being served and
the last good config keeps deciding, the error is logged once per distinct content (field named),
counted in ``ix_gpu_*_reloads_total{result="error"}`` and shown on ``/readyz``.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import ssl
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from devicemodel.schema_base import ConfigError
from devicemodel.webhook_config import load_config
from webhook.compiled_config import CompiledConfig
from webhook.metrics import ServiceMetrics
from webhook.tls_context import check_pair, load_pem_pair

log = logging.getLogger("ix_gpu.reload")

DEFAULT_SOURCE = "built-in default"


def _digest(*parts: bytes) -> str:
    hasher = hashlib.sha256()
    for part in parts:
        hasher.update(len(part).to_bytes(8, "big"))
        hasher.update(part)
    return hasher.hexdigest()


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


class LiveConfig:
    """The config requests are decided with; replaced whole, so a request sees one config."""

    def __init__(self, config: CompiledConfig, path: Path | None) -> None:
        self.current = config
        self.path = path
        self.last_error: str | None = None
        self.loaded_at = time.time()

    @property
    def source(self) -> str:
        return str(self.path) if self.path is not None else DEFAULT_SOURCE

    def status(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "digest": self.current.digest,
            "lastError": self.last_error,
        }


class ConfigReloader:
    def __init__(self, live: LiveConfig, metrics: ServiceMetrics, initial_content: bytes) -> None:
        if live.path is None:
            raise ValueError("the built-in default config has no file to reload")
        self._live = live
        self._path = live.path
        self._metrics = metrics
        self._seen = _digest(initial_content)
        self._loaded = self._seen

    async def poll(self) -> None:
        try:
            content = await asyncio.to_thread(self._path.read_bytes)
        except OSError as exc:
            # A ConfigMap mid-swap can briefly lack the file; the next poll sees the new one.
            message = f"{self._path}: cannot read: {exc.strerror or exc}"
            if message != self._live.last_error:  # once per outage, not once per poll
                self._fail(message)
            self._seen = ""
            return
        digest = _digest(content)
        if digest == self._seen:
            return
        self._seen = digest
        if digest == self._loaded:
            # Back to the content being served (e.g. a bad edit reverted): nothing to load.
            self._live.last_error = None
            return
        if not content.strip():
            # An empty file would parse as "all defaults": far more likely a truncated write.
            self._fail(f"{self._path}: file is empty")
            return
        try:
            config = await asyncio.to_thread(lambda: CompiledConfig(load_config(self._path)))
        except ConfigError as exc:
            self._fail(str(exc))
            return
        old = self._live.current.digest
        self._live.current = config
        self._live.last_error = None
        self._live.loaded_at = time.time()
        self._loaded = digest
        self._metrics.config_reloads.labels("success").inc()
        self._metrics.set_config_digest(old, config.digest)
        log.info("config reloaded", extra={"fields": {"source": str(self._path), "digest": config.digest}})

    def _fail(self, message: str) -> None:
        self._live.last_error = message
        self._metrics.config_reloads.labels("error").inc()
        log.error(
            "config reload failed; keeping the last good config",
            extra={"fields": {"error": message, "digest": self._live.current.digest}},
        )


class CertReloader:
    """Re-reads tls.crt/tls.key and loads a new, valid pair into the live server context.

    Connections already open keep their session; new handshakes get the new certificate.
    """

    def __init__(
        self, context: ssl.SSLContext, cert_path: Path, key_path: Path, metrics: ServiceMetrics, initial: str
    ) -> None:
        self._context = context
        self._cert_path = cert_path
        self._key_path = key_path
        self._metrics = metrics
        self._seen = initial
        self.loaded_digest = initial
        self.last_error: str | None = None

    def status(self) -> dict[str, Any]:
        return {"cert": str(self._cert_path), "lastError": self.last_error}

    def _read_pair(self) -> tuple[bytes, bytes]:
        return self._cert_path.read_bytes(), self._key_path.read_bytes()

    async def poll(self) -> None:
        try:
            cert, key = await asyncio.to_thread(self._read_pair)
        except OSError as exc:
            message = f"cannot read {exc.filename}: {exc.strerror or exc}"
            if message != self.last_error:  # once per outage, not once per poll
                self._fail(message)
            self._seen = ""
            return
        digest = _digest(cert, key)
        if digest == self._seen:
            return
        self._seen = digest
        if digest == self.loaded_digest:
            self.last_error = None
            return
        try:
            # Validate on a scratch context first: a failed load must not touch the live one.
            check_pair(cert, key)
            load_pem_pair(self._context, cert, key)
        except (ssl.SSLError, ValueError, OSError) as exc:
            # A writer that replaces the two files one at a time shows a mismatched pair for a
            # moment; the next poll sees the completed pair as new content and retries.
            self._fail(f"{self._cert_path}: {_one_line(exc)}")
            return
        self.loaded_digest = digest
        self.last_error = None
        self._metrics.cert_reloads.labels("success").inc()
        log.info("serving certificate reloaded", extra={"fields": {"cert": str(self._cert_path)}})

    def _fail(self, message: str) -> None:
        self.last_error = message
        self._metrics.cert_reloads.labels("error").inc()
        log.error(
            "certificate reload failed; still serving the previous certificate",
            extra={"fields": {"error": message}},
        )


def file_digest(*paths: Path) -> str:
    return _digest(*(p.read_bytes() for p in paths))


async def poll_forever(interval: float, pollers: list[Callable[[], Any]]) -> None:
    """Run each poller every ``interval`` seconds until cancelled; a poller bug is logged, not fatal."""
    while True:
        await asyncio.sleep(interval)
        for poll in pollers:
            try:
                await poll()
            except Exception:
                log.exception("reload poll failed")
