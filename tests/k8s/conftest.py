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

from tests.k8s import host_settings
from tests.k8s.k8s_tier import (
    HERE,
    Etcd,
    K8sBinaries,
    KubeAPI,
    KubeletHarness,
    build_binaries,
    build_oldest_apiserver,
    start_etcd,
    start_kube_apiserver,
)
from tests.k8s.real_nodes import HOST_BRIDGE
from tests.support.processes import tail

# --------------------------------------------------------------------------- selection

REAL_NODES_NOT_RUN = pytest.StashKey[list[str]]()
"""Why the real-node modules were skipped (real_release.skip_real_nodes), for the summary."""


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
    """The current Kubernetes (``k8s_tier.CURRENT_K8S_VERSION``), every binary."""
    try:
        return build_binaries()
    except RuntimeError as err:
        pytest.fail(str(err), pytrace=False)


@pytest.fixture(scope="session")
def oldest_binaries() -> K8sBinaries:
    """The oldest supported minor's kube-apiserver (``k8s_tier.OLDEST_K8S_VERSION``)."""
    try:
        return build_oldest_apiserver()
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
    oldest_binaries: K8sBinaries, etcd: Etcd, k8s_log_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KubeAPI]:
    """A real kube-apiserver of the oldest supported minor, for the suites about the apiserver's
    side (admission, validation): ``.url``, ``.token`` (system:masters), ``.ca_path``,
    ``.kubeconfig``, ``.api_client()`` (a kubernetes.client.ApiClient) and ``.request(method, path,
    body)``. Its etcd prefix is its own, so it shares etcd with ``current_kube_api``."""
    api = start_kube_apiserver(
        oldest_binaries, etcd, tmp_path_factory.mktemp("kube-apiserver"), k8s_log_dir, etcd_prefix="/oldest"
    )
    yield api
    api.stop()


@pytest.fixture(scope="session")
def current_kube_api(
    k8s_binaries: K8sBinaries, etcd: Etcd, k8s_log_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KubeAPI]:
    """A real kube-apiserver of the current Kubernetes, for suites that register kubelets (a
    kubelet may not be newer than its apiserver). A module that uses kubelets overrides ``kube_api``
    with this one."""
    api = start_kube_apiserver(
        k8s_binaries,
        etcd,
        tmp_path_factory.mktemp("kube-apiserver-current"),
        k8s_log_dir,
        etcd_prefix="/current",
        name="kube-apiserver-current",
    )
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


# --------------------------------------------------------------------------- the real-node tier's report


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # The fixtures put the host settings back at their teardown; a run that died between a
    # cluster's start and its teardown left them recorded, and this puts them back, unless a
    # real-node cluster (``cluster up`` by hand) is still using them.
    if not Path(f"/sys/class/net/{HOST_BRIDGE}").exists():
        with contextlib.suppress(RuntimeError):
            restored = host_settings.restore()
            if restored:
                print(f"\nhost settings put back at the session's end: {restored}")
    reasons = session.config.stash.get(REAL_NODES_NOT_RUN, [])
    report = os.environ.get("IX_GPU_TIER_REPORT")
    if report and reasons:
        Path(report).write_text("".join(f"{reason}\n" for reason in reasons))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    reasons = terminalreporter.config.stash.get(REAL_NODES_NOT_RUN, [])
    if reasons:
        terminalreporter.section("the real-node tier did not run", sep="=", yellow=True, bold=True)
        for reason in reasons:
            terminalreporter.line(f"  {reason}")
        terminalreporter.line(
            "  Not proven on this run: the chart on real containers (containerd, runc, CNI, kube-proxy), "
            "device isolation by the device cgroup, CDI through containerd, DRA on real nodes."
        )
