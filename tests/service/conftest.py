"""Shared servers for the service tests: the real ``ix-gpu webhook`` over HTTPS.

Starting a server costs a second or two of the machine's two cores, so the read-only tests share
two session servers: one without cluster access (the README's local mode) and one whose
kubeconfig points at the namespace stand-in. Tests that reload files start their own.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.service.fake_apiserver import FakeApiServer
from tests.support.webhook_process import WebhookProcess, generate_certs

# A short body timeout lets the slow-body test finish quickly; production default is 10 s.
FAST = ["--reload-interval", "0.2", "--request-timeout", "1"]


@pytest.fixture(scope="session")
def cert_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="session")
def local_webhook(tmp_path_factory: pytest.TempPathFactory, cert_dir: Path) -> Iterator[WebhookProcess]:
    """No kubeconfig: namespace facts unknown."""
    with WebhookProcess(tmp_path_factory.mktemp("local"), cert_dir, extra=FAST).start() as proc:
        yield proc


@pytest.fixture(scope="session")
def local_client(local_webhook: WebhookProcess) -> Iterator[httpx.Client]:
    with local_webhook.client() as client:
        yield client


@pytest.fixture(scope="session")
def cluster_api() -> Iterator[FakeApiServer]:
    api = FakeApiServer()
    api.put("team-a")
    api.put("optout-ann", annotations={"ix-gpu.io/inject": "disabled"})
    api.put("optout-label", labels={"ix-gpu.io/inject": "disabled"})
    api.put("restricted", labels={"pod-security.kubernetes.io/enforce": "restricted"})
    api.put("kube-system")
    api.start()
    yield api
    api.stop()


@pytest.fixture(scope="session")
def cluster_webhook(
    tmp_path_factory: pytest.TempPathFactory, cert_dir: Path, cluster_api: FakeApiServer
) -> Iterator[WebhookProcess]:
    workdir = tmp_path_factory.mktemp("cluster")
    kubeconfig = cluster_api.write_kubeconfig(workdir / "kubeconfig")
    # Ready means the namespace cache has synced with the stand-in.
    with WebhookProcess(workdir, cert_dir, kubeconfig=kubeconfig, extra=FAST).start(ready=True) as proc:
        yield proc


@pytest.fixture(scope="session")
def cluster_client(cluster_webhook: WebhookProcess) -> Iterator[httpx.Client]:
    with cluster_webhook.client() as client:
        yield client
