"""Run the real ``ix-gpu webhook`` as a subprocess and talk HTTPS to it, trusting only its CA.

The service binds ``--port 0`` and logs the URL it got, so tests never race for a free port. Logs
go to a file (the JSON lines are read back by tests); a pipe could fill up and stall the server.
"""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[2]


def generate_certs(out: Path) -> Path:
    """TLS material from the CLI itself (``ix-gpu certs generate``), as the docs tell users."""
    subprocess.run(
        [sys.executable, "-m", "ix_gpu", "certs", "generate", "--out", str(out)],
        check=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
    )
    return out


def ca_context(ca_file: Path) -> ssl.SSLContext:
    """A client context that trusts exactly one CA (not the system store)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(cafile=str(ca_file))
    return context


class WebhookProcess:
    def __init__(
        self,
        workdir: Path,
        cert_dir: Path,
        *,
        config: Path | None = None,
        kubeconfig: Path | None = None,
        extra: list[str] | None = None,
    ) -> None:
        self.workdir = workdir
        self.cert_dir = cert_dir
        self.log_path = workdir / "webhook.log"
        args = [sys.executable, "-m", "ix_gpu", "webhook", "--port", "0", "--cert-dir", str(cert_dir)]
        if config is not None:
            args += ["--config", str(config)]
        if kubeconfig is not None:
            args += ["--kubeconfig", str(kubeconfig)]
        self.args = args + (extra or [])
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self, timeout: float = 60.0) -> WebhookProcess:
        env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
        # The checkout under test, whether or not it is installed in the venv.
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.args, cwd=self.workdir, stdout=log, stderr=log, env=env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for entry in self.logs():
                if entry.get("msg") == "serving AdmissionReview v1":
                    self.url = str(entry["url"]).removesuffix("/mutate")
                    self._wait_answering(deadline)
                    return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"webhook exited with {self.proc.returncode}:\n{self.log_tail()}")
            time.sleep(0.05)
        raise RuntimeError(f"webhook did not start within {timeout} s:\n{self.log_tail()}")

    def _wait_answering(self, deadline: float) -> None:
        with self.client() as client:
            while True:
                try:
                    client.get("/healthz")
                    return
                except httpx.TransportError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(
            base_url=self.url,
            verify=ca_context(self.cert_dir / "ca.crt"),
            timeout=kwargs.pop("timeout", 15.0),
            **kwargs,
        )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode

    def logs(self) -> list[dict[str, Any]]:
        entries = []
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return []
        for line in text.splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                entry = {"msg": line, "unstructured": True}
            if isinstance(entry, dict):
                entries.append(entry)
        return entries

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"

    def metrics(
        self, client: httpx.Client | None = None
    ) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Every sample of /metrics, keyed by (name, sorted labels)."""
        own = client is None
        client = client or self.client()
        try:
            text = client.get("/metrics").text
        finally:
            if own:
                client.close()
        samples = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        return samples

    def metric(self, name: str, client: httpx.Client | None = None, **labels: str) -> float:
        return self.metrics(client).get((name, tuple(sorted(labels.items()))), 0.0)
