"""The real ``ix-gpu webhook`` as a subprocess on 127.0.0.1, spoken to over HTTPS trusting only its CA.

Used by the service suite (the webhook on its own, or against a stand-in apiserver) and by the
real-Kubernetes tier (behind a real kube-apiserver). With ``port=0`` (the default) the service picks
a free port and logs the URL it got, so tests never race for a port; a restart keeps that port.
Logs go to ``<workdir>/<name>.log`` as JSON lines that tests read back.
"""

from __future__ import annotations

import json
import ssl
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.support.cli import ix_gpu, ix_gpu_process
from tests.support.processes import Process
from tests.support.waiting import wait_until

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
"""Every sample of /metrics, keyed by (name, sorted labels)."""


def generate_certs(out: Path) -> Path:
    """TLS material from the CLI itself (``ix-gpu certs generate``), as the docs tell users, for
    localhost and 127.0.0.1 (the apiserver dials the webhook by IP); returns ``out``."""
    ix_gpu("certs", "generate", "--out", str(out), "--ip", "127.0.0.1", "--dns", "localhost", check=True)
    return out


def ca_context(ca_file: Path) -> ssl.SSLContext:
    """A client context that trusts exactly one CA (not the system store)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(cafile=str(ca_file))
    return context


def _json_lines(text: str) -> list[dict[str, Any]]:
    entries = []
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            entry = {"msg": line, "unstructured": True}
        if isinstance(entry, dict):
            entries.append(entry)
    return entries


def dialled(url: str) -> str:
    """``url`` with a wildcard host (``[::]``, ``0.0.0.0``: every address) replaced by 127.0.0.1,
    the address the test certificates name, where a client on this machine reaches the listener."""
    for wildcard in ("://[::]:", "://0.0.0.0:"):
        url = url.replace(wildcard, "://127.0.0.1:")
    return url


class WebhookProcess:
    """``ix-gpu webhook --host 127.0.0.1 --port PORT --cert-dir CERT_DIR [--config] [--kubeconfig] EXTRA``.

    ``host`` is where it listens (default 127.0.0.1).
    ``url`` is the base URL (``https://127.0.0.1:PORT``) once started; ``mutate_url`` is what a
    MutatingWebhookConfiguration names."""

    def __init__(
        self,
        workdir: Path,
        cert_dir: Path,
        *,
        name: str = "webhook",
        config: Path | None = None,
        kubeconfig: Path | None = None,
        port: int = 0,
        extra: Sequence[str] = (),
        host: str = "127.0.0.1",
    ) -> None:
        self.workdir = workdir
        self.host = host
        self.cert_dir = cert_dir
        self.name = name
        self.config = config
        self.kubeconfig = kubeconfig
        self.port = port
        self.extra = list(extra)
        self.log_path = workdir / f"{name}.log"
        self.process: Process | None = None
        self.url = ""

    @property
    def args(self) -> list[str]:
        args = ["webhook", "--host", self.host, "--port", str(self.port), "--cert-dir", str(self.cert_dir)]
        if self.config is not None:
            args += ["--config", str(self.config)]
        if self.kubeconfig is not None:
            args += ["--kubeconfig", str(self.kubeconfig)]
        if not any(arg.startswith("--shutdown-delay") for arg in self.extra):
            # Tests stop hundreds of webhooks; the drain on SIGTERM has its own tests
            # (tests/service/test_service_shutdown.py).
            args += ["--shutdown-delay", "0"]
        return args + self.extra

    @property
    def mutate_url(self) -> str:
        return self.url + "/mutate"

    @property
    def probe_url(self) -> str:
        """``http://HOST:PORT`` of ``--probe-port`` (plain-HTTP /healthz and /readyz), from the log."""
        serving = next(e for e in self.logs() if e.get("msg") == "serving AdmissionReview v1")
        assert serving.get("probes"), "started without --probe-port"
        return dialled(str(serving["probes"]))

    @property
    def ca_bundle(self) -> bytes:
        return (self.cert_dir / "ca.crt").read_bytes()

    def start(self, timeout: float = 60.0, *, ready: bool = False) -> WebhookProcess:
        """Start the process and wait until it serves: its log names its URL and /healthz answers 200;
        with ``ready``, until /readyz is 200 too (config loaded, namespace cache synced).

        Fails with ``ProcessExited`` (a ``RuntimeError``) when the process exits first; stops the
        process when it fails."""
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        process = self.process = ix_gpu_process(self.name, *self.args, log_dir=self.workdir, cwd=self.workdir)
        try:
            self._wait_serving(process, offset, timeout, ready)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_serving(self, process: Process, offset: int, timeout: float, ready: bool) -> None:
        def serving() -> str | None:
            for entry in self._entries(offset):
                if entry.get("msg") == "serving AdmissionReview v1":
                    return dialled(str(entry["url"]).removesuffix("/mutate"))
            return None

        self.url = wait_until(serving, f"{self.name} to serve", timeout, interval=0.05, process=process)
        self.port = urllib.parse.urlsplit(self.url).port or self.port  # a restart keeps the port
        wait_until(lambda: self._status("/healthz") == 200, f"{self.name} /healthz", timeout, process=process)
        if ready:
            wait_until(
                lambda: self._status("/readyz") == 200, f"{self.name} /readyz", timeout, process=process
            )

    def _status(self, path: str) -> int | None:
        try:
            return self.get(path, timeout=2)[0]
        except httpx.TransportError:
            return None

    def __enter__(self) -> WebhookProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def alive(self) -> bool:
        return self.process is not None and self.process.alive()

    def stop(self) -> int | None:
        """SIGTERM (SIGKILL after 15 s); returns the exit status."""
        return None if self.process is None else self.process.stop(15)

    # ------------------------------------------------------------------ HTTPS

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(
            base_url=self.url,
            verify=ca_context(self.cert_dir / "ca.crt"),
            timeout=kwargs.pop("timeout", 15.0),
            **kwargs,
        )

    def get(self, path: str, timeout: float = 5) -> tuple[int, bytes]:
        with self.client(timeout=timeout) as client:
            response = client.get(path)
        return response.status_code, response.content

    def post_review(self, review: dict[str, Any], timeout: float = 10) -> dict[str, Any]:
        with self.client(timeout=timeout) as client:
            response = client.post("/mutate", json=review)
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result

    # ------------------------------------------------------------------ logs

    def _entries(self, offset: int = 0) -> list[dict[str, Any]]:
        try:
            with open(self.log_path, "rb") as log:
                log.seek(offset)
                return _json_lines(log.read().decode(errors="replace"))
        except FileNotFoundError:
            return []

    def logs(self) -> list[dict[str, Any]]:
        """The log's JSON lines (a line that is not JSON comes as ``{"msg": line, "unstructured": True}``)."""
        return self._entries()

    def log_tail(self, lines: int = 40) -> str:
        return self.process.tail(lines) if self.process is not None else "(no log)"

    # ------------------------------------------------------------------ metrics

    def metrics(self, client: httpx.Client | None = None) -> Samples:
        """Every sample of /metrics, keyed by (name, sorted labels)."""
        own = client is None
        client = client or self.client()
        try:
            response = client.get("/metrics")
        finally:
            if own:
                client.close()
        assert response.status_code == 200, response.text
        text = response.text
        samples: Samples = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        return samples

    def metric(self, name: str, client: httpx.Client | None = None, /, **labels: str) -> float:
        """The sum of the samples of ``name`` whose labels include ``labels`` (0 when there are none)."""
        wanted = set(labels.items())
        return float(sum(v for (n, ls), v in self.metrics(client).items() if n == name and wanted <= set(ls)))

    def admissions(self, **labels: str) -> float:
        return self.metric("ix_gpu_admission_requests_total", **labels)

    def wait_for_metric(self, name: str, at_least: float, timeout: float = 20, **labels: str) -> None:
        """Poll /metrics until ``metric(name, **labels)`` reaches ``at_least``."""
        wait_until(
            lambda: self.metric(name, **labels) >= at_least,
            f"{name}{labels} to reach {at_least}",
            timeout,
            interval=0.05,
            details=lambda: f"it is {self.metric(name, **labels)}",
        )
