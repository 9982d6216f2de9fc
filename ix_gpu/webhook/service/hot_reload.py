"""Hot reload of the serving certificate and the webhook config, without a restart.

The mechanism (poll by content digest, keep the last good value, parse off the event loop) is
:mod:`ix_gpu.process.reload`; this module applies its results to the running service.

A bad new file never replaces a good live one: the last good certificate keeps being served and
the last good config keeps deciding, the error is logged once per distinct content (field named),
counted in ``ix_gpu_*_reloads_total{result="error"}`` and shown on ``/readyz``.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cryptography import x509

from ix_gpu.config.schema_base import parse_yaml
from ix_gpu.config.text import one_line
from ix_gpu.config.webhook_config import WebhookConfig
from ix_gpu.process.reload import LastGoodFiles
from ix_gpu.webhook.certs.tls_context import check_pair, load_pem_pair
from ix_gpu.webhook.core.compiled_config import CompiledConfig
from ix_gpu.webhook.service.metrics import ServiceMetrics

log = logging.getLogger("ix_gpu.reload")

DEFAULT_SOURCE = "built-in default"


class LiveConfig:
    """The config requests are decided with; replaced whole, so a request sees one config."""

    def __init__(self, config: CompiledConfig, path: Path | None) -> None:
        self.current = config
        self.path = path
        self.last_error: str | None = None

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
    """Swaps a new, valid config file into :class:`LiveConfig`; parsing runs off the event loop."""

    def __init__(self, live: LiveConfig, metrics: ServiceMetrics, initial_content: bytes) -> None:
        if live.path is None:
            raise ValueError("the built-in default config has no file to reload")
        self._live = live
        self._metrics = metrics
        source = str(live.path)
        self._files = LastGoodFiles(
            "config",
            [live.path],
            lambda contents: CompiledConfig(parse_yaml(WebhookConfig, contents[0], source)),
            loaded=[initial_content],
            record=lambda result: metrics.config_reloads.labels(result).inc(),
            logger=log,
        )

    async def poll(self) -> None:
        config = await asyncio.to_thread(self._files.poll)
        self._live.last_error = self._files.last_error
        if config is None:
            return
        old = self._live.current.digest
        self._live.current = config
        self._metrics.set_config_digest(old, config.digest)
        log.info("config reloaded", extra={"fields": {"source": self._live.source, "digest": config.digest}})


class CertReloader:
    """Re-reads tls.crt/tls.key and loads a new, valid pair into the live server context.

    Connections already open keep their session; new handshakes get the new certificate. The
    pair is read and checked on a scratch context off the loop; only a good pair touches the live
    context, on the loop, between handshakes.
    """

    def __init__(
        self,
        context: ssl.SSLContext,
        cert_path: Path,
        key_path: Path,
        metrics: ServiceMetrics,
        initial: tuple[bytes, bytes],
    ) -> None:
        self._context = context
        self._cert_path = cert_path
        self._metrics = metrics
        self._record_expiry(initial[0])
        self._files = LastGoodFiles(
            "serving certificate",
            [cert_path, key_path],
            self._check,
            loaded=list(initial),
            record=lambda result: metrics.cert_reloads.labels(result).inc(),
            logger=log,
        )

    def _check(self, contents: list[bytes]) -> tuple[bytes, bytes]:
        cert, key = contents
        try:
            check_pair(cert, key)
        except (ssl.SSLError, ValueError, OSError) as exc:
            # A writer that replaces the two files one at a time shows a mismatched pair for a
            # moment; the next poll sees the completed pair as new content and retries.
            raise ValueError(f"{self._cert_path}: {one_line(exc)}") from None
        return cert, key

    @property
    def last_error(self) -> str | None:
        return self._files.last_error

    def status(self) -> dict[str, Any]:
        return {"cert": str(self._cert_path), "lastError": self.last_error}

    def _record_expiry(self, cert_pem: bytes) -> None:
        """``ix_gpu_serving_certificate_expiry_timestamp_seconds`` for an alert before it lapses."""
        try:
            not_after = x509.load_pem_x509_certificate(cert_pem).not_valid_after_utc
        except ValueError:
            return  # check_pair has refused it already, or will
        self._metrics.certificate_expiry.set(not_after.timestamp())

    async def poll(self) -> None:
        pair = await asyncio.to_thread(self._files.poll)
        if pair is None:
            return
        load_pem_pair(self._context, *pair)
        self._record_expiry(pair[0])
        log.info("serving certificate reloaded", extra={"fields": {"cert": str(self._cert_path)}})


async def poll_forever(interval: float, pollers: list[Callable[[], Any]]) -> None:
    """Run each poller every ``interval`` seconds until cancelled; a poller bug is logged, not fatal."""
    while True:
        await asyncio.sleep(interval)
        for poll in pollers:
            try:
                await poll()
            except Exception:
                log.exception("reload poll failed")
