"""Hot reload under load: certificate rotation and config edits with zero failed requests.

The certificate directory is laid out like a mounted Secret volume — ``tls.crt -> ..data/tls.crt``,
``..data -> ..<timestamp>`` — and rotated the way the kubelet does it: a new timestamped directory,
then an atomic swap of the ``..data`` symlink. No inotify event fires for ``tls.crt`` itself.

Hostile configs (random bytes, 5,000-deep YAML, a 50 MB file, a duplicate ``policy:`` key, alias
bombs...) are interleaved with good ones under load: each is refused and shown, the last good one
keeps deciding, and admissions stay fast while the 50 MB file sits there.
"""

from __future__ import annotations

import json
import os
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from ix_gpu.config.schema_base import parse_yaml
from ix_gpu.config.webhook_config import WebhookConfig, default_config
from ix_gpu.webhook.certs.authority import CA_FILE, CA_KEY_FILE, CERT_FILE, KEY_FILE, issue_serving_cert
from tests.service.conftest import FAST
from tests.support.files import write_atomic
from tests.support.objects import pod, review
from tests.support.waiting import wait_until
from tests.support.webhook_process import WebhookProcess, ca_context

REQUESTS = 2000
BODY = json.dumps(review(pod())).encode()


class SecretVolume:
    """A directory that changes like a Kubernetes Secret volume."""

    def __init__(self, root: Path, files: dict[str, bytes]) -> None:
        self.root = root
        self.generation = 0
        root.mkdir(parents=True, exist_ok=True)
        self.update(files)
        for name in files:
            os.symlink(f"..data/{name}", root / name)

    def update(self, files: dict[str, bytes]) -> None:
        self.generation += 1
        version = self.root / f"..2026_11_30_{self.generation:02d}"
        version.mkdir()
        for name, data in files.items():
            (version / name).write_bytes(data)
        tmp = self.root / "..data_tmp"
        os.symlink(version.name, tmp)
        os.replace(tmp, self.root / "..data")


class LoadLoop:
    """Posts reviews from a thread until stopped and at least ``minimum`` were sent.

    Every third request carries ``Connection: close``, so the next one makes a new TLS handshake:
    rotation must work for new connections, not just for the ones already open.
    """

    def __init__(
        self, webhook: WebhookProcess, check: Callable[[dict[str, Any]], str | None], minimum: int
    ) -> None:
        self.webhook = webhook
        self.check = check
        self.minimum = minimum
        self.sent = 0
        self.failures: list[str] = []
        self.latencies: list[tuple[float, float]] = []
        """(monotonic start, seconds) of every request, for percentiles over a window."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> LoadLoop:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(120)

    def wait_for(self, count: int, timeout: float = 120) -> None:
        wait_until(
            lambda: self.sent >= count or not self._thread.is_alive(),
            f"{count} requests",
            timeout,
            interval=0.01,
            details=lambda: f"only {self.sent} sent",
        )

    def p99_between(self, start: float, end: float) -> tuple[float, int]:
        """(p99 latency, request count) of the requests started in [start, end] (monotonic)."""
        window = sorted(seconds for began, seconds in list(self.latencies) if start <= began <= end)
        if not window:
            return 0.0, 0
        return window[min(len(window) - 1, int(len(window) * 0.99))], len(window)

    def finish(self) -> None:
        self.wait_for(self.minimum)
        self._stop.set()
        self._thread.join(120)

    def _run(self) -> None:
        with self.webhook.client() as client:
            while not (self._stop.is_set() and self.sent >= self.minimum):
                headers = {"content-type": "application/json"}
                if self.sent % 3 == 2:
                    headers["connection"] = "close"
                started = time.monotonic()
                try:
                    response = client.post("/mutate", content=BODY, headers=headers)
                    self.latencies.append((started, time.monotonic() - started))
                    if response.status_code != 200:
                        self.failures.append(f"HTTP {response.status_code}: {response.text[:200]}")
                    else:
                        problem = self.check(response.json()["response"])
                        if problem:
                            self.failures.append(problem)
                except httpx.HTTPError as exc:
                    self.failures.append(f"{type(exc).__name__}: {exc}")
                self.sent += 1


def _served_certificate(webhook: WebhookProcess, ca_file: Path) -> bytes:
    host, port = webhook.url.removeprefix("https://").rsplit(":", 1)
    with (
        socket.create_connection((host, int(port)), timeout=5) as raw,
        ca_context(ca_file).wrap_socket(raw, server_hostname=host) as sock,
    ):
        der = sock.getpeercert(binary_form=True)
    assert der is not None
    return der


def _der(pem: bytes) -> bytes:
    return x509.load_pem_x509_certificate(pem).public_bytes(Encoding.DER)


@pytest.fixture
def secret_volume(tmp_path: Path, cert_dir: Path) -> SecretVolume:
    files = {name: (cert_dir / name).read_bytes() for name in (CA_FILE, CERT_FILE, KEY_FILE)}
    return SecretVolume(tmp_path / "secret", files)


@pytest.fixture
def rotating_webhook(tmp_path: Path, secret_volume: SecretVolume) -> Iterator[WebhookProcess]:
    with WebhookProcess(tmp_path, secret_volume.root, extra=FAST).start() as proc:
        yield proc


def _not_after(pem: bytes) -> float:
    return x509.load_pem_x509_certificate(pem).not_valid_after_utc.timestamp()


def _mutated(response: dict[str, Any]) -> str | None:
    decision = response.get("auditAnnotations", {}).get("decision")
    return None if decision == "mutated" else f"unexpected decision {decision}"


def test_certificate_rotation_under_load(
    rotating_webhook: WebhookProcess, secret_volume: SecretVolume, cert_dir: Path
) -> None:
    ca_cert, ca_key = (cert_dir / CA_FILE).read_bytes(), (cert_dir / CA_KEY_FILE).read_bytes()
    old_cert = (cert_dir / CERT_FILE).read_bytes()
    new_cert, new_key = issue_serving_cert(ca_cert, ca_key, ["localhost"], ["127.0.0.1"], days=30)
    assert _served_certificate(rotating_webhook, secret_volume.root / CA_FILE) == _der(old_cert)
    expiry = "ix_gpu_serving_certificate_expiry_timestamp_seconds"
    assert rotating_webhook.metric(expiry) == _not_after(old_cert)

    with LoadLoop(rotating_webhook, _mutated, REQUESTS) as load:
        load.wait_for(REQUESTS // 4)
        secret_volume.update({CA_FILE: ca_cert, CERT_FILE: new_cert, KEY_FILE: new_key})
        rotating_webhook.wait_for_metric("ix_gpu_cert_reloads_total", 1, result="success")
        at_reload = load.sent
        load.wait_for(at_reload + REQUESTS // 4)
        load.finish()

    assert load.failures == [], load.failures[:5]
    assert load.sent >= REQUESTS
    assert _served_certificate(rotating_webhook, secret_volume.root / CA_FILE) == _der(new_cert)
    assert rotating_webhook.metric("ix_gpu_cert_reloads_total", result="error") == 0
    assert any(e.get("msg") == "serving certificate reloaded" for e in rotating_webhook.logs())
    # The alert on expiry follows the certificate in use (30 days from now).
    assert rotating_webhook.metric(expiry) == _not_after(new_cert) != _not_after(old_cert)


def test_broken_certificate_keeps_the_old_one(
    rotating_webhook: WebhookProcess, secret_volume: SecretVolume, cert_dir: Path
) -> None:
    ca_cert, ca_key = (cert_dir / CA_FILE).read_bytes(), (cert_dir / CA_KEY_FILE).read_bytes()
    old_cert = (cert_dir / CERT_FILE).read_bytes()
    other_cert, other_key = issue_serving_cert(ca_cert, ca_key, ["localhost"], ["127.0.0.1"])
    # A certificate with someone else's key: must not be loaded.
    secret_volume.update(
        {CA_FILE: ca_cert, CERT_FILE: other_cert, KEY_FILE: (cert_dir / KEY_FILE).read_bytes()}
    )
    rotating_webhook.wait_for_metric("ix_gpu_cert_reloads_total", 1, result="error")
    assert _served_certificate(rotating_webhook, secret_volume.root / CA_FILE) == _der(old_cert)
    with rotating_webhook.client() as client:
        assert client.get("/readyz").json()["certs"]["lastError"]
        assert (
            client.post("/mutate", content=BODY, headers={"content-type": "application/json"}).status_code
            == 200
        )

    secret_volume.update({CA_FILE: ca_cert, CERT_FILE: other_cert, KEY_FILE: other_key})
    rotating_webhook.wait_for_metric("ix_gpu_cert_reloads_total", 1, result="success")
    assert _served_certificate(rotating_webhook, secret_volume.root / CA_FILE) == _der(other_cert)
    with rotating_webhook.client() as client:
        assert client.get("/readyz").json()["certs"]["lastError"] is None


# ------------------------------------------------------------------------------ config


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "webhook-config.yaml"
    path.write_text(default_config().to_yaml())
    return path


@pytest.fixture
def config_webhook(tmp_path: Path, cert_dir: Path, config_file: Path) -> Iterator[WebhookProcess]:
    with WebhookProcess(tmp_path, cert_dir, config=config_file, extra=FAST).start() as proc:
        yield proc


def test_config_reload_under_load(config_webhook: WebhookProcess, config_file: Path) -> None:
    old_digest = default_config().digest()
    accepted = {f"injected iluvatar@{old_digest}"}

    def expected(response: dict[str, Any]) -> str | None:
        reason = response.get("auditAnnotations", {}).get("reason", "")
        return None if reason in accepted else f"unexpected reason {reason!r}"

    with LoadLoop(config_webhook, expected, REQUESTS) as load:
        load.wait_for(REQUESTS // 4)
        write_atomic(config_file, "policy:\n  namespaceLookupFailure: maybe\n")
        config_webhook.wait_for_metric("ix_gpu_config_reloads_total", 1, result="error")
        load.wait_for(load.sent + REQUESTS // 4)  # old behaviour kept meanwhile (checked per response)

        with config_webhook.client() as client:
            details = client.get("/readyz").json()["config"]
        assert "policy.namespaceLookupFailure" in details["lastError"]
        assert details["digest"] == old_digest

        new_config = default_config().to_yaml().replace("- kube-node-lease", "- kube-node-lease\n  - team-a")
        assert new_config != default_config().to_yaml()
        accepted.add('namespace "team-a" is excluded by policy.excludedNamespaces')
        write_atomic(config_file, new_config)
        config_webhook.wait_for_metric("ix_gpu_config_reloads_total", 1, result="success")
        at_reload = load.sent
        load.wait_for(at_reload + REQUESTS // 4)
        load.finish()

    assert load.failures == [], load.failures[:5]
    with config_webhook.client() as client:
        response = client.post("/mutate", content=BODY, headers={"content-type": "application/json"}).json()
        assert response["response"]["auditAnnotations"]["reason"].endswith(
            "excluded by policy.excludedNamespaces"
        )
        details = client.get("/readyz").json()["config"]
        assert details["lastError"] is None and details["digest"] != old_digest
    assert config_webhook.metric("ix_gpu_config_reloads_total", result="error") == 1
    errors = [e for e in config_webhook.logs() if e.get("msg", "").startswith("config reload failed")]
    assert len(errors) == 1 and "policy.namespaceLookupFailure" in errors[0]["error"]


def test_invalid_config_at_startup_names_the_field(tmp_path: Path, cert_dir: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("profiles:\n- name: Bad_Name\n  resources: [x.com/gpu]\n")
    proc = WebhookProcess(tmp_path, cert_dir, config=bad)
    with pytest.raises(RuntimeError, match="exited with 2"):
        proc.start(timeout=30)
    last = proc.log_tail(1)
    assert last.startswith("ix-gpu webhook: invalid config:") and "profiles[0].name" in last


def test_empty_config_file_on_reload_keeps_the_old_one(
    config_webhook: WebhookProcess, config_file: Path
) -> None:
    write_atomic(config_file, "")
    config_webhook.wait_for_metric("ix_gpu_config_reloads_total", 1, result="error")
    with config_webhook.client() as client:
        assert "empty" in client.get("/readyz").json()["config"]["lastError"]
        reason = client.post("/mutate", content=BODY, headers={"content-type": "application/json"}).json()
        assert reason["response"]["auditAnnotations"]["decision"] == "mutated"


# ------------------------------------------------------------------------------ hostile configs


def _write_bytes_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _readyz_config(client: httpx.Client, *, digest: str = "", failed: bool = False) -> dict[str, Any] | None:
    """/readyz's config details once they show ``digest`` (or, with ``failed``, a lastError)."""
    details: dict[str, Any] = client.get("/readyz").json()["config"]
    if (failed and details["lastError"]) or (digest and details["digest"] == digest):
        return details
    return None


def _bad_configs(good: str) -> list[tuple[str, bytes, str]]:
    """(name, content, a phrase /readyz ``lastError`` must hold) for twenty configs that must each
    be refused while the last good one keeps deciding. The 50 MB one is written by the test."""
    rng = random.Random(12)
    laughs = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{name}: &{name} [{', '.join(['*' + previous] * 9)}]\n"
        for previous, name in zip("abcdefgh", "bcdefghi", strict=True)
    )
    return [
        ("random bytes", rng.randbytes(64 * 1024), "not valid YAML"),
        (
            "5,000-deep flow YAML",
            f"policy:\n  excludedNamespaces: {'[' * 5000}{']' * 5000}\n".encode(),
            "nested",
        ),
        ("5,000-deep mappings", f"policy: {'{a: ' * 5000}x{'}' * 5000}\n".encode(), "nested"),
        ("50 MB file", b"", "larger than"),
        (
            "duplicate policy key",
            f"{good}policy:\n  privilegedNamespaces: ['*']\n".encode(),
            "duplicate key 'policy'",
        ),
        ("billion laughs", laughs.encode(), "alias"),
        ("python tag", b"!!python/object/apply:os.system ['true']\n", "python/object"),
        ("5,001-digit integer", f"policy:\n  excludedNamespaces: [{'9' * 5001}]\n".encode(), "int"),
        ("bad timestamp tag", b"policy: !!timestamp x\n", "timestamp"),
        ("impossible date", b"policy:\n  excludedNamespaces: [2001-99-99]\n", "timestamp"),
        ("recursive alias", b"a: &a [*a]\n", "recursive"),
        ("tab indentation", b"policy:\n\texcludedNamespaces: []\n", "not valid YAML"),
        ("two documents", f"{good}---\n{good}".encode(), "document"),
        ("NUL byte", b"policy: \x00\n", "not valid YAML"),
        ("invalid UTF-8", b"policy:\n  excludedNamespaces: [caf\xe9]\n", "UTF-8"),
        ("top-level list", b"- a\n- b\n", "mapping"),
        ("unknown key", good.replace("resources:", "resourcez:", 1).encode(), "unknown key"),
        ("invalid enum", b"policy:\n  namespaceLookupFailure: maybe\n", "policy.namespaceLookupFailure"),
        ("whitespace only", b"   \n\n", "empty"),
        ("just over 1 MiB", (good + "#" * (1024 * 1024)).encode(), "larger than"),
    ]


def test_hostile_configs_interleaved_with_good_ones_under_load(
    config_webhook: WebhookProcess, config_file: Path, tmp_path: Path
) -> None:
    """Twenty bad configs, each after a good one, while reviews keep coming: no request fails,
    each bad one is refused (``/readyz`` ``lastError``, ``ix_gpu_config_reloads_total{result="error"}``,
    a log line), the last good config keeps deciding, and admissions stay fast while a 50 MB file
    sits where the config was (it is read with a size cap, off the event loop)."""
    good = [default_config().to_yaml()]
    good.append(good[0].replace("value: /usr/local/corex/lib64", "value: /usr/local/corex/lib"))
    digests = [parse_yaml(WebhookConfig, text, "good").digest() for text in good]
    assert digests[0] == default_config().digest() != digests[1]
    # Either good config may be deciding at any moment (the switch is asynchronous to the load);
    # which one exactly is checked after each bad config, below.
    accepted = {f"injected iluvatar@{digest}" for digest in digests}

    def expected(response: dict[str, Any]) -> str | None:
        reason = response.get("auditAnnotations", {}).get("reason", "")
        return None if reason in accepted else f"unexpected reason {reason!r}"

    huge = tmp_path / "huge.yaml"
    huge.write_bytes(good[0].encode() + b"# " + b"x" * (50 * 1024 * 1024) + b"\n")  # staged, not watched
    bad_configs = _bad_configs(good[0])
    assert len(bad_configs) == 20
    loaded = 0  # index into good of the config in use
    window: tuple[float, float] = (0.0, 0.0)

    def reloads(result: str) -> float:
        return config_webhook.metric("ix_gpu_config_reloads_total", result=result)

    with LoadLoop(config_webhook, expected, 200) as load, config_webhook.client() as client:
        load.wait_for(50)
        for name, content, says in bad_configs:
            # A good config first (the other one: the same content as in use would be no reload).
            successes = reloads("success")
            loaded = 1 - loaded
            write_atomic(config_file, good[loaded])
            config_webhook.wait_for_metric("ix_gpu_config_reloads_total", successes + 1, result="success")
            details = wait_until(
                partial(_readyz_config, client, digest=digests[loaded]), "/readyz to show the good config", 5
            )
            assert details["lastError"] is None, details

            errors = reloads("error")
            started = time.monotonic()
            if name == "50 MB file":
                os.replace(huge, config_file)
            else:
                _write_bytes_atomic(config_file, content)
            config_webhook.wait_for_metric("ix_gpu_config_reloads_total", errors + 1, result="error")
            if name == "50 MB file":
                time.sleep(0.5)  # a few more polls of the 50 MB file
                window = (started, time.monotonic())
            # The counter moves in the reload's worker thread, /readyz just after it returns.
            details = wait_until(
                partial(_readyz_config, client, failed=True), f"/readyz to show the error of the {name}", 5
            )
            assert says in details["lastError"], (name, details)
            assert details["digest"] == digests[loaded], (name, details)
            answer = client.post("/mutate", content=BODY, headers={"content-type": "application/json"})
            reason = answer.json()["response"]["auditAnnotations"]["reason"]
            assert reason == f"injected iluvatar@{digests[loaded]}", (name, reason)
        load.finish()

    assert load.failures == [], load.failures[:5]
    assert reloads("error") == len(bad_configs)
    failed_logs = [e for e in config_webhook.logs() if e.get("msg", "").startswith("config reload failed")]
    assert len(failed_logs) == len(bad_configs)
    p99, count = load.p99_between(*window)
    overall, total = load.p99_between(0.0, time.monotonic())
    print(
        f"\nadmissions while the 50 MB file was in place: {count} requests, p99 {p99 * 1000:.1f} ms "
        f"(whole run: {total} requests, p99 {overall * 1000:.1f} ms)"
    )
    assert count >= 5
    assert p99 < 0.1, f"p99 {p99 * 1000:.1f} ms during the 50 MB reload"
