"""The running service: config, certificates, namespace facts, uvicorn over TLS, reload loops.

Everything that can be wrong with the operator's input (config, certificate files, kubeconfig,
address) is checked in :func:`prepare`, before a socket accepts anything, and reported as one
:class:`StartupError` naming the file or field — a webhook that starts half-configured would fail
every Pod create in the cluster instead of failing one rollout.

The listening socket is bound here rather than by uvicorn so an address in use is a one-line
startup error, and so ``--port 0`` can report the port it got (the tests rely on that).

With ``--probe-port``, ``/healthz`` and ``/readyz`` are also served over plain HTTP on a port of
their own (:mod:`ix_gpu.serving.guarded_http`), for the kubelet's probes: they then never wait
behind the HTTPS port's connection cap or a TLS handshake, and the probe port's own cap makes room
for each new connection by closing the oldest, so a client holding connections cannot fail them.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from ix_gpu.config.input_files import CONFIG_MAX_BYTES, ConfigError, read_capped
from ix_gpu.config.schema_base import parse_yaml
from ix_gpu.config.text import one_line
from ix_gpu.config.webhook_config import WebhookConfig, default_config
from ix_gpu.kube.apiserver import in_cluster
from ix_gpu.serving.guarded_http import (
    Answer,
    HttpLimits,
    Route,
    address_text,
    listen_socket,
    start_guarded_http,
)
from ix_gpu.webhook.certs.authority import CA_FILE, CERT_FILE, KEY_FILE, generate_bundle, write_bundle
from ix_gpu.webhook.certs.tls_context import server_context
from ix_gpu.webhook.core.claims import UNKNOWN_CLAIMS, ClaimFacts
from ix_gpu.webhook.core.compiled_config import CompiledConfig
from ix_gpu.webhook.service.admission_handler import AdmissionHandler
from ix_gpu.webhook.service.admission_review import MAX_BODY_BYTES
from ix_gpu.webhook.service.app import HEALTHZ_BODY, JSON, Readiness, readyz_answer
from ix_gpu.webhook.service.claim_cache import ClaimCache, claim_cache
from ix_gpu.webhook.service.draining import Drain, DrainingServer
from ix_gpu.webhook.service.hot_reload import (
    CertReloader,
    ConfigReloader,
    LiveConfig,
    poll_forever,
)
from ix_gpu.webhook.service.http_protocol import guarded_protocol
from ix_gpu.webhook.service.limits import (
    FREED_MEMORY,
    ByteBudget,
    Limits,
    fix_malloc_mmap_threshold,
    freeze_startup_heap,
)
from ix_gpu.webhook.service.metrics import ServiceMetrics
from ix_gpu.webhook.service.mutate_exchange import MutateLane
from ix_gpu.webhook.service.namespace_cache import (
    NamespaceCache,
    NamespaceListWatch,
    NamespaceSource,
    UnknownNamespaces,
    api_server,
)

log = logging.getLogger("ix_gpu.webhook")

DEV_DNS_NAMES = ["localhost"]
DEV_IP_ADDRESSES = ["127.0.0.1"]


class StartupError(Exception):
    """The service cannot start as asked; ``str()`` is one line naming the culprit."""


@dataclass(frozen=True)
class ServiceOptions:
    config_path: str | None = None
    cert_dir: str = "certs"
    host: str = "127.0.0.1"
    port: int = 8443
    kubeconfig: str | None = None
    reload_interval: float = 5.0
    request_timeout: float = 10.0
    namespace_lookup_timeout: float = 2.0
    namespace_lookup_budget: float = 3.0
    """How long a missed namespace's GET is tried again (below the registration's timeoutSeconds)."""
    cache_max_staleness: float | None = 300.0
    """The namespace cache turns not-ready (and so /readyz) when staler than this; None: never."""
    log_level: str = "info"
    limits: Limits = field(default_factory=Limits)
    shutdown_delay: float = 5.0
    probe_port: int | None = None


@dataclass
class Service:
    options: ServiceOptions
    app: Any
    """The ASGI app: ``/healthz``, ``/readyz``, ``/metrics`` and 404s."""
    lane: MutateLane
    """``/mutate``, served by the connections' protocol."""
    ssl_context: ssl.SSLContext
    sock: socket.socket
    live_config: LiveConfig
    namespaces: NamespaceSource
    claims: ClaimCache | None
    """DRA claims' device classes (None without cluster access: every claim unknown)."""
    metrics: ServiceMetrics
    drain: Drain
    readiness: Readiness
    pollers: list[Any] = field(default_factory=list)
    probe_sock: socket.socket | None = None

    @property
    def url(self) -> str:
        return _url("https", self.sock)

    @property
    def probe_url(self) -> str | None:
        return None if self.probe_sock is None else _url("http", self.probe_sock)


def _url(scheme: str, sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"{scheme}://{shown}:{port}"


def probe_routes(readiness: Readiness) -> dict[str, Route]:
    """The probe port's endpoints: the same answers as the HTTPS port's."""

    def healthz() -> Answer:
        return 200, JSON, HEALTHZ_BODY

    def readyz() -> Answer:
        status, body = readyz_answer(readiness)
        return status, JSON, body

    return {"/healthz": healthz, "/readyz": readyz}


def ensure_certificates(cert_dir: Path) -> tuple[Path, Path]:
    """The serving cert and key in ``cert_dir``; development ones are generated when both are absent."""
    cert, key = cert_dir / CERT_FILE, cert_dir / KEY_FILE
    has_cert, has_key = cert.exists(), key.exists()
    if has_cert and has_key:
        return cert, key
    if has_cert != has_key:
        present, missing = (cert, key) if has_cert else (key, cert)
        raise StartupError(f"{present} exists but {missing} does not: provide both, or neither (generated)")
    try:
        write_bundle(generate_bundle(DEV_DNS_NAMES, DEV_IP_ADDRESSES), cert_dir)
    except OSError as exc:
        reason = exc.strerror or exc
        raise StartupError(f"cannot write development certificates to {cert_dir}: {reason}") from None
    log.warning(
        "no tls.crt/tls.key: generated development certificates for localhost and 127.0.0.1 (trust ca.crt)",
        extra={"fields": {"certDir": str(cert_dir), "ca": str(cert_dir / CA_FILE)}},
    )
    return cert, key


def _load_config(path: str | None) -> tuple[LiveConfig, bytes | None]:
    """The config to start with and the bytes it came from (read once: the reloader compares
    later content with exactly these)."""
    if path is None:
        return LiveConfig(CompiledConfig(default_config()), None), None
    try:
        content = read_capped(path, CONFIG_MAX_BYTES)
    except ConfigError as exc:
        raise StartupError(str(exc)) from None
    try:
        compiled = CompiledConfig(parse_yaml(WebhookConfig, content, path))
    except ConfigError as exc:
        raise StartupError(f"invalid config: {exc}") from None
    return LiveConfig(compiled, Path(path)), content


def _cluster_sources(
    options: ServiceOptions, metrics: ServiceMetrics
) -> tuple[NamespaceSource, ClaimCache | None]:
    """Namespace facts and DRA claim facts: watch-backed caches, or unknown without a cluster."""
    kubeconfig = options.kubeconfig
    if kubeconfig is None and not in_cluster():
        log.warning(
            "no --kubeconfig and not running in a cluster: namespace facts are unknown, so namespace "
            "opt-outs (ix-gpu.io/inject=disabled on a Namespace) and Pod Security levels are not seen; "
            "DRA claims are unknown (policy.claimLookupFailure)",
        )
        return UnknownNamespaces(), None
    try:
        api = api_server(kubeconfig)
    except (OSError, ValueError) as exc:  # unreadable, not a kubeconfig, a form it cannot use
        where = kubeconfig if kubeconfig is not None else "in-cluster service account"
        reason = one_line(exc)
        raise StartupError(f"cannot use {where} to reach the API server: {reason}") from None
    log.info(
        "namespace facts and DRA claims from watch-backed caches",
        extra={"fields": {"kubeconfig": kubeconfig or "in-cluster"}},
    )
    namespaces = NamespaceCache(
        NamespaceListWatch(api),
        metrics=metrics,
        lookup_timeout=options.namespace_lookup_timeout,
        lookup_budget=options.namespace_lookup_budget,
        max_staleness=options.cache_max_staleness,
    )
    claims = claim_cache(api)
    claims.export_sizes(metrics)
    return namespaces, claims


def _bind(host: str, port: int) -> socket.socket:
    """The shared :func:`listen_socket` (``::``: both IP families), its failure a StartupError."""
    try:
        return listen_socket(host, port, backlog=2048)
    except OSError as exc:
        raise StartupError(f"cannot listen on {address_text(host, port)}: {exc.strerror or exc}") from None


def prepare(options: ServiceOptions) -> Service:
    """Load and check everything, bind the socket; nothing is served yet."""
    from ix_gpu.webhook.service.app import create_app

    metrics = ServiceMetrics()
    live, config_content = _load_config(options.config_path)
    metrics.set_config_digest(None, live.current.digest)

    cert_dir = Path(options.cert_dir)
    cert_path, key_path = ensure_certificates(cert_dir)
    try:
        pair = cert_path.read_bytes(), key_path.read_bytes()
        context = server_context(*pair)
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise StartupError(f"cannot load {cert_path} / {key_path}: {one_line(exc)}") from None
    cert_reloader = CertReloader(context, cert_path, key_path, metrics, pair)
    pollers: list[Any] = [cert_reloader.poll]
    if config_content is not None:
        pollers.append(ConfigReloader(live, metrics, config_content).poll)

    namespaces, claims = _cluster_sources(options, metrics)
    claim_facts: ClaimFacts = claims if claims is not None else UNKNOWN_CLAIMS
    handler = AdmissionHandler(live, namespaces, metrics, options.limits, claim_facts)
    drain = Drain(options.shutdown_delay)

    def readiness() -> tuple[bool, dict[str, Any]]:
        details = {
            "config": live.status(),
            "certs": cert_reloader.status(),
            "namespaces": namespaces.status(),
            # Not a condition of readiness: a cluster without DRA never syncs these.
            "claims": claims.status() if claims is not None else {"mode": "unknown"},
            "draining": drain.active,
        }
        return namespaces.ready() and not drain.active, details

    app = create_app(metrics, readiness)
    lane = MutateLane(
        handler,
        request_timeout=options.request_timeout,
        max_body_bytes=MAX_BODY_BYTES,
        inflight=ByteBudget(options.limits.max_inflight_body_bytes),
        closing=lambda: drain.active,
    )
    sock = _bind(options.host, options.port)
    probe_sock = None if options.probe_port is None else _bind(options.host, options.probe_port)
    return Service(
        options,
        app,
        lane,
        context,
        sock,
        live,
        namespaces,
        claims,
        metrics,
        drain,
        readiness,
        pollers,
        probe_sock,
    )


async def serve(service: Service) -> None:
    import uvicorn

    fix_malloc_mmap_threshold()
    refused = service.metrics.connections_refused

    def on_refused(reason: str) -> None:
        refused.labels(reason).inc()

    config = uvicorn.Config(
        service.app,
        # A factory where uvicorn's type says class: uvicorn only calls it, as it would a class.
        http=cast(
            "type[asyncio.Protocol]",
            guarded_protocol(
                service.options.limits, service.lane, on_refused, service.metrics.connections_evicted.inc
            ),
        ),
        lifespan="off",
        log_config=None,
        access_log=False,
        server_header=False,
        # Nothing here reads the client's address from the scope (the connection cap takes it from
        # the socket), so uvicorn's X-Forwarded-For middleware would only cost a layer per request.
        proxy_headers=False,
        # Longer than the apiserver's own idle timeout (Limits.idle_timeout says why).
        timeout_keep_alive=max(1, round(service.options.limits.idle_timeout)),
        # At shutdown, a review still in flight gets its body's timeout and a margin for the work;
        # the kubelet's SIGKILL comes later (the chart's terminationGracePeriodSeconds).
        timeout_graceful_shutdown=int(service.options.request_timeout) + 5,
        ssl_context_factory=lambda _config, _default: service.ssl_context,
    )
    config.load()  # imports the protocol classes now, so that they are frozen with the rest
    server = DrainingServer(config, service.drain)
    probes = None
    if service.probe_sock is not None:
        probes = await start_guarded_http(
            probe_routes(service.readiness),
            service.probe_sock,
            limits=HttpLimits(header_timeout=service.options.limits.header_timeout),
            on_refused=on_refused,
        )
    frozen = freeze_startup_heap()
    service.namespaces.start()
    if service.claims is not None:
        service.claims.start()
    reloads = asyncio.create_task(poll_forever(service.options.reload_interval, service.pollers))
    trims = asyncio.create_task(FREED_MEMORY.run())
    log.info(
        "serving AdmissionReview v1",
        extra={
            "fields": {
                "url": service.url + "/mutate",
                "probes": service.probe_url,
                "config": service.live_config.source,
                "digest": service.live_config.current.digest,
                "namespaces": service.namespaces.mode,
                "frozenObjects": frozen,
            }
        },
    )
    try:
        await server.serve(sockets=[service.sock])
    finally:
        reloads.cancel()
        trims.cancel()
        service.namespaces.stop()
        if service.claims is not None:
            service.claims.stop()
        if probes is not None:
            probes.close()


def run_service(options: ServiceOptions) -> int:
    """Prepare (raising :class:`StartupError`) and serve until SIGINT/SIGTERM."""
    import uvloop

    from ix_gpu.process import json_logging

    json_logging.configure(options.log_level)
    service = prepare(options)
    uvloop.run(serve(service))
    return 0
