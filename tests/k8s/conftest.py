"""Fixtures of the real-Kubernetes test tier: etcd, a real kube-apiserver and the kubelet device-manager
harness, all on loopback (see k8s_tier.py).

The binaries come from ``tests/k8s/build.sh`` (Go module proxy; a no-op when cached). Set
``IX_GPU_K8S_BIN`` to use an existing bin directory instead.

The first build takes a while, so these tests only run when asked for: ``-m k8s``, only tests/k8s
paths on the command line, or ``IX_GPU_K8S=1``. Otherwise they are skipped with a hint.
Component logs are written to the pytest temp directory (``k8s-logs*``); a failing test reports the
path and the last lines of each log.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.k8s.k8s_tier import (
    HERE,
    Etcd,
    K8sBinaries,
    KubeAPI,
    KubeletHarness,
    build_binaries,
    start_etcd,
    start_kube_apiserver,
)
from tests.support.processes import tail

# --------------------------------------------------------------------------- selection


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Every test under tests/k8s carries the k8s marker, even if a module forgets its pytestmark.
    for item in items:
        if HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.k8s)


def _tier_requested(config: pytest.Config) -> bool:
    if os.environ.get("IX_GPU_K8S", "").lower() in ("1", "true", "yes"):
        return True
    markexpr = config.getoption("markexpr", "") or ""
    if re.search(r"(?<!not )\bk8s\b", markexpr):
        return True
    args = [a.split("::", 1)[0] for a in config.args]
    if not args:
        return False
    for arg in args:
        path = (Path(config.invocation_params.dir) / arg).resolve()
        if path != HERE and HERE not in path.parents:
            return False
    return True


@pytest.fixture(autouse=True)
def _k8s_tier_gate(request: pytest.FixtureRequest) -> None:
    if not _tier_requested(request.config):
        pytest.skip("real-Kubernetes tier: run with -m k8s (or IX_GPU_K8S=1); builds with tests/k8s/build.sh")


# --------------------------------------------------------------------------- components


@pytest.fixture(scope="session")
def k8s_binaries() -> K8sBinaries:
    try:
        return build_binaries()
    except RuntimeError as err:
        pytest.fail(str(err), pytrace=False)


@pytest.fixture(scope="session")
def k8s_log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("k8s-logs")


@pytest.fixture(scope="session")
def etcd(k8s_binaries: K8sBinaries, k8s_log_dir: Path) -> Iterator[Etcd]:
    server = start_etcd(k8s_binaries, k8s_log_dir)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def kube_api(
    k8s_binaries: K8sBinaries, etcd: Etcd, k8s_log_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KubeAPI]:
    """A real kube-apiserver: ``.url``, ``.token`` (system:masters), ``.ca_path``, ``.kubeconfig``,
    ``.api_client()`` (a kubernetes.client.ApiClient) and ``.request(method, path, body)``."""
    api = start_kube_apiserver(k8s_binaries, etcd, tmp_path_factory.mktemp("kube-apiserver"), k8s_log_dir)
    yield api
    api.stop()


@pytest.fixture
def namespace(kube_api: KubeAPI, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace per test (no controller-manager runs: deleted ones stay Terminating)."""
    from kubernetes import client

    base = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].strip("-") or "t"
    name = f"{base}-{secrets.token_hex(3)}"
    with kube_api.api_client() as api_client:
        client.CoreV1Api(api_client).create_namespace(
            client.V1Namespace(metadata=client.V1ObjectMeta(name=name))
        )
    yield name
    with kube_api.api_client() as api_client, contextlib.suppress(Exception):
        client.CoreV1Api(api_client).delete_namespace(name)


@pytest.fixture
def kubelet_harness(
    k8s_binaries: K8sBinaries, k8s_log_dir: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., KubeletHarness]]:
    """Factory: ``kubelet_harness()`` starts the kubelet's device manager on a fresh device-plugin
    directory (``.dir``); pass ``plugin_dir=`` to choose it."""
    started: list[KubeletHarness] = []
    owned: list[Path] = []
    test = re.sub(r"[^A-Za-z0-9_.-]+", "-", request.node.name)[:60]

    def start(plugin_dir: Path | None = None, extra_args: list[str] | None = None) -> KubeletHarness:
        if plugin_dir is None:
            # Short path: a unix socket path is limited to 107 bytes.
            plugin_dir = Path(tempfile.mkdtemp(prefix="ix-dp-"))
            owned.append(plugin_dir)
        log = k8s_log_dir / f"kubelet-harness-{test}-{len(started)}.log"
        h = KubeletHarness(k8s_binaries.kubelet_harness, plugin_dir, log, extra_args)
        started.append(h)
        return h

    yield start
    for h in started:
        h.close()
    for d in owned:
        shutil.rmtree(d, ignore_errors=True)


# --------------------------------------------------------------------------- failure reports


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if not report.failed:
        return
    log_dir = getattr(item, "funcargs", {}).get("k8s_log_dir")
    if log_dir is None:
        return
    sections = [f"component logs: {log_dir}"]
    for log in sorted(Path(log_dir).glob("*.log")):
        sections.append(f"--- {log.name} (last 15 lines)\n{tail(log, 15)}")
    report.sections.append(("k8s logs", "\n".join(sections)))
