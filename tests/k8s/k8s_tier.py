"""The real-Kubernetes test tier's components on loopback: etcd, kube-apiserver, the kubelet
device-manager harness, and a real kubelet whose pods run as host processes (``start_kubelet_node``).
Used by tests/k8s/conftest.py; also usable by hand, e.g.

    .venv/bin/python -c "from tests.k8s import k8s_tier as t; ..."'

Every process writes its output to ``<log_dir>/<name>.log`` (``tests.support.processes``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import ipaddress
import json
import os
import re
import secrets
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from ix_gpu.webhook.certs.authority import generate_bundle, write_bundle
from tests.support.net import free_port
from tests.support.processes import Process, start_process, tail
from tests.support.waiting import wait_until

HERE = Path(__file__).resolve().parent
BUILD_SCRIPT = HERE / "build.sh"
HELM_BUILD_SCRIPT = HERE / "build-helm.sh"
CURRENT_K8S_VERSION = "v1.37.2"
"""The Kubernetes every suite runs (build.sh's default): the newest the Go module proxy serves."""
OLDEST_K8S_VERSION = "v1.35.4"
"""The oldest supported minor, built for its kube-apiserver alone: the suites whose subject is the
apiserver's side (admission, the chart's objects) run against it too (``kube_api``). A kubelet may
not be newer than its apiserver, so the kubelet suites run the current pair (``current_kube_api``)."""
HELM_VERSION = "v4.3.1"
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
    def kubelet(self) -> Path:
        return self.bin_dir / "kubelet"

    @property
    def fake_cri(self) -> Path:
        return self.bin_dir / "fake-cri"

    @property
    def kube_controller_manager(self) -> Path:
        return self.bin_dir / "kube-controller-manager"

    @property
    def kube_scheduler(self) -> Path:
        return self.bin_dir / "kube-scheduler"

    @property
    def kube_proxy(self) -> Path:
        return self.bin_dir / "kube-proxy"

    @property
    def etcd(self) -> Path:
        return build_etcd()


def _run_build_script(script: Path, args: Sequence[str], env: dict[str, str] | None = None) -> Path:
    """Run a build script; its last stdout line is the bin directory."""
    result = subprocess.run(
        ["bash", str(script), *args],
        capture_output=True,
        text=True,
        check=False,
        env=None if env is None else {**os.environ, **env},
    )
    if result.returncode != 0:
        name = f"tests/k8s/{script.name} {' '.join(args)}".strip()
        raise RuntimeError(f"{name} failed ({result.returncode}):\n{result.stderr[-6000:]}")
    return Path(result.stdout.strip().splitlines()[-1])


ETCD_VERSION = "v3.6.16"


GO_COMMAND_SCRIPT = HERE / "build-go-command.sh"


def build_go_command(name: str, version: str, override: str) -> Path:
    """The binary ``name`` at ``version``, built by ``build-go-command.sh`` (cached there); the
    environment variable ``override`` may name a directory that holds one instead."""
    directory = os.environ.get(override)
    if directory:
        return Path(directory) / name
    version_variable = f"IX_{name.upper().replace('-', '_')}_VERSION"
    return _run_build_script(GO_COMMAND_SCRIPT, [name], {version_variable: version}) / name


@functools.cache
def build_etcd() -> Path:
    """etcd ``ETCD_VERSION`` from the module proxy (cold: a minute or two); ``IX_GPU_ETCD_BIN``
    names a directory with one instead.

    Why not an older etcd from a wheel: etcd before 3.5.13 lacks the progress notifications the
    apiserver needs to serve watches from its cache consistently, so it refuses client-go's
    streaming lists; kwok's informers then re-listed every few seconds and its pods reached
    Running in batches seconds apart."""
    return build_go_command("etcd", ETCD_VERSION, "IX_GPU_ETCD_BIN")


def build_binaries(version: str = CURRENT_K8S_VERSION, targets: Sequence[str] = ("all",)) -> K8sBinaries:
    """Run build.sh for ``targets`` ("all" or binary names) of ``version`` (a no-op when they are
    cached; cold: tens of minutes). ``IX_GPU_K8S_BIN`` overrides the current version's build with an
    existing bin directory."""
    override = os.environ.get("IX_GPU_K8S_BIN")
    if override and version == CURRENT_K8S_VERSION:
        return K8sBinaries(Path(override))
    return K8sBinaries(_run_build_script(BUILD_SCRIPT, list(targets), {"IX_K8S_VERSION": version}))


def build_oldest_apiserver() -> K8sBinaries:
    """The kube-apiserver of ``OLDEST_K8S_VERSION`` (and etcd); ``IX_GPU_K8S_OLDEST_BIN`` overrides
    with an existing bin directory."""
    override = os.environ.get("IX_GPU_K8S_OLDEST_BIN")
    if override:
        return K8sBinaries(Path(override))
    return build_binaries(OLDEST_K8S_VERSION, ("kube-apiserver",))


def build_helm(version: str = HELM_VERSION) -> Path:
    """The helm v4 CLI built by build-helm.sh (cached); ``IX_GPU_HELM`` overrides with a helm binary."""
    override = os.environ.get("IX_GPU_HELM")
    if override:
        return Path(override)
    return _run_build_script(HELM_BUILD_SCRIPT, [], {"IX_HELM_VERSION": version}) / "helm"


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
    etcd_prefix: str | None = None
    """Where its objects are in etcd (None: the apiserver's default, /registry)."""

    def ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_path))

    def ready(self) -> bool:
        try:
            status, _ = self.request("GET", "/readyz", timeout=5)
        except OSError:
            return False
        return status == 200

    def start_again(self) -> None:
        """Start the stopped apiserver again with the same arguments (port, certificates, etcd and
        its prefix) and wait for /readyz: to every client, the same apiserver restarted."""
        argv = [str(a) for a in self.process.popen.args]  # type: ignore[union-attr]
        self.process = start_process(self.process.name, argv, self.log_dir)
        _wait_started(self.ready, "kube-apiserver /readyz after a restart", self.process, self.process.stop)

    def restart(self, down_s: float) -> None:
        """Stop the apiserver, keep it down ``down_s`` seconds, and start it again (an apiserver
        restart or upgrade, as every client sees it)."""
        self.process.stop()
        time.sleep(down_s)
        self.start_again()

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        timeout: float = 30,
        token: str | None = None,
        content_type: str = "application/json",
    ) -> tuple[int, Any]:
        """A raw API call; returns (HTTP status, decoded JSON or text). For PATCH pass e.g.
        ``content_type="application/merge-patch+json"``."""
        status, reply, _ = self.request_with_warnings(method, path, body, timeout, token, content_type)
        return status, reply

    def request_with_warnings(
        self,
        method: str,
        path: str,
        body: Any = None,
        timeout: float = 30,
        token: str | None = None,
        content_type: str = "application/json",
    ) -> tuple[int, Any, list[str]]:
        """``request``, plus the texts of the response's ``Warning`` headers (what kubectl prints,
        e.g. an admission webhook's warnings)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.url + path,
            data=data,
            method=method,
            headers={
                "Authorization": f"Bearer {self.token if token is None else token}",
                "Content-Type": content_type,
            },
        )
        try:
            with urllib.request.urlopen(req, context=self.ssl_context(), timeout=timeout) as resp:
                status, raw, headers = resp.status, resp.read(), resp.headers
        except urllib.error.HTTPError as err:
            status, raw, headers = err.code, err.read(), err.headers
        # RFC 7234: 299 - "quoted text", backslash escapes inside
        warnings = [
            re.sub(r"\\(.)", r"\1", w.split(" ", 2)[-1].removeprefix('"').removesuffix('"'))
            for w in headers.get_all("Warning") or []
        ]
        try:
            return status, json.loads(raw), warnings
        except ValueError:
            return status, raw.decode(errors="replace"), warnings

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


def https_ok(url: str) -> bool:
    """``url`` answers 200 (a component's /healthz; its self-signed serving cert is not checked)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, context=context, timeout=3) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def start_kube_scheduler(
    binaries: K8sBinaries,
    kubeconfig: Path,
    work_dir: Path,
    log_dir: Path,
    extra: Sequence[str] = (),
    port: int | None = None,
) -> Process:
    """The real kube-scheduler against the apiserver of ``kubeconfig``, once its /healthz answers;
    it serves /healthz and /metrics on 127.0.0.1:``port`` (default: a free one)."""
    port = port or free_port()
    proc = start_process(
        "kube-scheduler",
        [
            str(binaries.kube_scheduler),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={work_dir / 'kube-scheduler'}",
            "--leader-elect=false",
            *extra,
            "--v=1",
        ],
        log_dir,
    )
    wait_until(
        lambda: https_ok(f"https://127.0.0.1:{port}/healthz"),
        "kube-scheduler /healthz",
        120,
        interval=0.25,
        process=proc,
    )
    return proc


def start_kube_apiserver(
    binaries: K8sBinaries,
    etcd: Etcd,
    work_dir: Path,
    log_dir: Path,
    *,
    service_account_admission: bool = False,
    extra_args: Sequence[str] = (),
    advertise_address: str | None = None,
    service_cidr: str = "10.0.0.0/24",
    etcd_prefix: str | None = None,
    name: str = "kube-apiserver",
) -> KubeAPI:
    """kube-apiserver on a free 127.0.0.1 port: token auth (system:masters), RBAC, no controllers.
    The service-account signing key is ``work_dir/pki/sa.key``. ``service_account_admission``: keep
    the ServiceAccount admission plugin (it needs the controller-manager's serviceaccount controller:
    pods are refused until their namespace has its ``default`` ServiceAccount).

    ``advertise_address``: an address of this machine that pods can reach. The apiserver then listens
    on every address, publishes itself as the ``kubernetes`` Service's endpoint there (lease
    reconciler), and its certificate also names that address and the Service's ClusterIP (the first
    address of ``service_cidr``), as in-cluster clients dial one or the other. Without it, the
    ``kubernetes`` Service has no endpoints and nothing routes ``service_cidr``.

    ``etcd_prefix`` keeps this apiserver's objects apart from another's on the same etcd; ``name``
    names its log (``<log_dir>/<name>.log``)."""
    pki = work_dir / "pki"
    addresses = ["127.0.0.1"]
    if advertise_address is not None:
        addresses += [advertise_address, str(next(ipaddress.ip_network(service_cidr).hosts()))]
    certs = write_bundle(
        generate_bundle(
            ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"], addresses
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
        name,
        [
            str(binaries.kube_apiserver),
            f"--etcd-servers={etcd.url}",
            *([f"--etcd-prefix={etcd_prefix}"] if etcd_prefix else []),
            *(
                [
                    "--bind-address=127.0.0.1",
                    "--advertise-address=127.0.0.1",
                    "--endpoint-reconciler-type=none",
                ]
                if advertise_address is None
                else ["--bind-address=0.0.0.0", f"--advertise-address={advertise_address}"]
            ),
            f"--secure-port={port}",
            f"--cert-dir={work_dir / 'cert-dir'}",
            f"--tls-cert-file={certs['tls.crt']}",
            f"--tls-private-key-file={certs['tls.key']}",
            f"--token-auth-file={token_file}",
            "--authorization-mode=RBAC",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={sa_pub}",
            f"--service-account-signing-key-file={sa_key}",
            f"--service-cluster-ip-range={service_cidr}",
            *([] if service_account_admission else ["--disable-admission-plugins=ServiceAccount"]),
            "--allow-privileged=true",
            "--profiling=false",
            # Nodes name themselves with unresolvable names; reach kubelets (logs, exec) on their
            # InternalIP (127.0.0.1 for the tier's kubelets).
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            *extra_args,
        ],
        log_dir,
    )
    kubeconfig = work_dir / "kubeconfig"
    write_kubeconfig(kubeconfig, url, certs["ca.crt"], token)
    api = KubeAPI(
        url=url,
        token=token,
        ca_path=certs["ca.crt"],
        kubeconfig=kubeconfig,
        process=proc,
        log_dir=log_dir,
        etcd_prefix=etcd_prefix,
    )
    _wait_started(api.ready, "kube-apiserver /readyz", proc, proc.stop)
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


# --------------------------------------------------------------------------- a kubelet whose pods run


DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
LEGACY_CONTAINER_LOGS = "/var/log/containers"
KUBELET_SYSCTLS = {
    # /proc/sys path -> the value the kubelet's setupKernelTunables wants (component-helpers sysctl)
    "vm/overcommit_memory": 1,
    "vm/panic_on_oom": 0,
    "kernel/panic": 10,
    "kernel/panic_on_oops": 1,
    "kernel/keys/root_maxkeys": 1000000,
    "kernel/keys/root_maxbytes": 25000000,
}
# Run as `unshare --mount --propagation private -- sh -c NODE_LAUNCHER launcher ROOT CMD...`: the
# node's private mount namespace, in which fake-cri (CMD) runs and the kubelet joins it (nsenter).
NODE_LAUNCHER = f"""set -eu
root=$1
shift
mount --bind "$root/device-plugins" {DEVICE_PLUGIN_DIR}
mount --bind "$root/container-logs" {LEGACY_CONTAINER_LOGS}
for f in "$root"/sysctl/*; do
    mount --bind "$f" "/proc/sys/$(basename "$f" | tr . /)"
done
exec "$@"
"""


def unix_socket_ready(path: Path) -> bool:
    """Whether something accepts connections on the unix socket ``path``."""
    if not path.exists():
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(str(path))
        except OSError:
            return False
    return True


@dataclasses.dataclass
class KubeletNode:
    """A real kubelet registered as Node ``name``, whose pods run as host processes (fake-cri).

    Both run in one private mount namespace (the node's), created when fake-cri starts; the kubelet
    joins it. So what the kubelet mounts for volumes (tmpfs for Secrets and projected tokens) is
    what fake-cri binds into containers, and nothing of it shows on the host. In that namespace
    ``plugin_dir`` is bind-mounted over /var/lib/kubelet/device-plugins (a device plugin under test
    serves into ``plugin_dir`` from the host), a scratch directory over /var/log/containers (the
    kubelet's legacy log symlinks), and the six sysctls the kubelet would rewrite are files that
    already hold its values.

    ``cri_state`` holds fake-cri's records: ``containers/<id>/container.json`` (see
    ``container_records``) and ``sandboxes/<id>.json``.
    """

    name: str
    api: KubeAPI
    root: Path
    plugin_dir: Path
    cri_socket: Path
    cri_state: Path
    pod_cidr: str
    fake_cri: Process
    kubelet: Process | None = None
    node_ip: str = "127.0.0.1"

    def node(self) -> dict[str, Any] | None:
        status, body = self.api.request("GET", f"/api/v1/nodes/{self.name}")
        return body if status == 200 and isinstance(body, dict) else None

    def ready(self) -> bool:
        node = self.node()
        conditions = (node or {}).get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        """Wait for the Node's Ready condition and the kubelet's device-plugin registration socket;
        give the Node its addresses (see ``set_addresses``)."""
        assert self.kubelet is not None
        wait_until(
            lambda: self.node() is not None,
            f"Node {self.name}",
            timeout_s,
            interval=0.25,
            process=self.kubelet,
        )
        if ipaddress.ip_address(self.node_ip).is_loopback:
            self.set_addresses()  # a routable --node-ip the kubelet reports itself
        wait_until(self.ready, f"Node {self.name} Ready", timeout_s, interval=0.25, process=self.kubelet)
        wait_until(
            lambda: unix_socket_ready(self.plugin_dir / "kubelet.sock"),
            f"the device-plugin registration socket of {self.name}",
            30,
            interval=0.25,
            process=self.kubelet,
        )

    def set_addresses(self) -> None:
        """Write the Node's addresses: InternalIP 127.0.0.1 and Hostname ``name``. The kubelet refuses
        to report a loopback --node-ip ("nodeIP can't be loopback address") and then leaves
        ``status.addresses`` alone, so these stay. The apiserver reaches the kubelet (pod logs) on
        this InternalIP, and hostNetwork pods get it as their pod IP."""
        addresses = [
            {"type": "InternalIP", "address": "127.0.0.1"},
            {"type": "Hostname", "address": self.name},
        ]
        status, reply = self.api.request(
            "PATCH",
            f"/api/v1/nodes/{self.name}/status",
            {"status": {"addresses": addresses}},
            content_type="application/merge-patch+json",
        )
        if status != 200:
            raise RuntimeError(f"setting the addresses of Node {self.name}: {status} {reply}")

    def container_records(self) -> list[dict[str, Any]]:
        """fake-cri's record of every container it created (removed ones too), oldest first: pod
        (name, namespace, uid), name, image, argv, env ("K=V" list), mounts, devices, pod_ip,
        log_path, state, pid, exit_code, ..."""
        records = []
        for path in (self.cri_state / "containers").glob("*/container.json"):
            with contextlib.suppress(OSError, ValueError):
                records.append(json.loads(path.read_text()))
        return sorted(records, key=lambda r: str(r.get("created_at", "")))

    def close(self) -> None:
        if self.kubelet is not None:
            self.kubelet.stop()
        self.fake_cri.stop()  # kills the containers
        with contextlib.suppress(Exception):
            self.api.request("DELETE", f"/api/v1/nodes/{self.name}")
        shutil.rmtree(self.root, ignore_errors=True)


def kubelet_node_config(port: int, healthz_port: int, cri_socket: Path, root: Path) -> dict[str, Any]:
    """KubeletConfiguration for this VM (cgroup v1, swap, no systemd), only on 127.0.0.1. Anonymous
    requests are allowed so that the apiserver (which has no kubelet client certificate) can proxy
    logs from it."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": "127.0.0.1",
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
        "authorization": {"mode": "AlwaysAllow"},
        "containerRuntimeEndpoint": f"unix://{cri_socket}",
        "failSwapOn": False,
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        # In the host's network namespace: no KUBE-FIREWALL, canary or hint chains on the host.
        "makeIPTablesUtilChains": False,
        "cgroupsPerQOS": False,
        "enforceNodeAllocatable": [],
        "podLogsDir": str(root / "pod-logs"),
        "nodeStatusUpdateFrequency": "2s",
        "registerNode": True,
    }


def start_kubelet_node(
    binaries: K8sBinaries,
    api: KubeAPI,
    log_dir: Path,
    *,
    name: str | None = None,
    pod_cidr: str = "127.0.1.0/24",
    path: str | None = None,
    images: dict[str, str] | None = None,
    image_dirs: Sequence[Path] = (),
    ignore_run_as_user: bool = False,
    labels: dict[str, str] | None = None,
    kubelet_config: dict[str, Any] | None = None,
    kubelet_args: Sequence[str] = (),
    node_ip: str = "127.0.0.1",
) -> KubeletNode:
    """fake-cri + a real kubelet (``binaries``' version) as Node ``name``; returns once both run
    (``wait_ready`` waits for the Node). Needs root.

    ``pod_cidr``: the loopback range of this node's pod IPs (give each node its own). ``path``: the
    containers' PATH, where image commands are found (default: this process's PATH). ``images``:
    image (repository or its last path component) -> the command it runs when a pod gives none.
    ``image_dirs``: host directories that are part of every image (the installation the containers
    run), kept visible under a pod volume mounted over an ancestor: the chart's webhook mounts an
    emptyDir at /tmp, which would hide a checkout under /tmp.
    ``kubelet_config``: keys that replace those of ``kubelet_node_config``. ``node_ip``: where the
    kubelet listens and the Node's InternalIP (and hostNetwork pods' IP). The kubelet refuses to
    report a loopback one, so ``wait_ready`` writes the addresses then; a routable one (this machine's
    address) it reports itself, and then hostNetwork pods can be Service endpoints (EndpointSlice
    validation refuses loopback addresses). The kubelet allows anonymous requests: on a routable
    address anyone who reaches it can run commands in its pods.
    """
    name = name or f"ix-node-{secrets.token_hex(3)}"
    root = Path(tempfile.mkdtemp(prefix="ix-kn-"))  # short: unix socket paths are limited to 107 bytes
    try:
        plugin_dir = root / "device-plugins"
        (root / "container-logs").mkdir()
        plugin_dir.mkdir()
        sysctls = root / "sysctl"
        sysctls.mkdir()
        for key, value in KUBELET_SYSCTLS.items():
            (sysctls / key.replace("/", ".")).write_text(f"{value}\n")
        for mount_point in (DEVICE_PLUGIN_DIR, LEGACY_CONTAINER_LOGS):
            Path(mount_point).mkdir(parents=True, exist_ok=True)
        cri_socket, cri_state = root / "cri.sock", root / "cri-state"
        cri_argv = [
            str(binaries.fake_cri),
            f"--endpoint=unix://{cri_socket}",
            f"--state-dir={cri_state}",
            f"--pod-cidr={pod_cidr}",
            f"--path={path or os.environ.get('PATH', '/usr/local/bin:/usr/bin:/bin')}",
        ]
        cri_argv += [f"--image={image}={command}" for image, command in (images or {}).items()]
        cri_argv += [f"--image-dir={directory.resolve()}" for directory in image_dirs]
        if ignore_run_as_user:
            cri_argv.append("--ignore-run-as-user")
        launcher = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", NODE_LAUNCHER]
        cri = start_process(f"fake-cri-{name}", [*launcher, "launcher", str(root), *cri_argv], log_dir)
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    node = KubeletNode(
        name=name,
        api=api,
        root=root,
        plugin_dir=plugin_dir,
        cri_socket=cri_socket,
        cri_state=cri_state,
        pod_cidr=pod_cidr,
        fake_cri=cri,
        node_ip=node_ip,
    )
    try:
        wait_until(
            lambda: unix_socket_ready(cri_socket), f"fake-cri of {name}", 30, interval=0.1, process=cri
        )
        config = {
            **kubelet_node_config(free_port(), free_port(), cri_socket, root),
            "address": node_ip,
            **(kubelet_config or {}),
        }
        config_path = root / "kubelet-config.yaml"
        config_path.write_text(yaml.safe_dump(config))
        argv = [
            "nsenter", f"--mount=/proc/{cri.pid}/ns/mnt", "--",
            str(binaries.kubelet),
            f"--config={config_path}",
            f"--kubeconfig={api.kubeconfig}",
            f"--root-dir={root / 'kubelet'}",
            f"--cert-dir={root / 'pki'}",
            f"--hostname-override={name}",
            f"--node-ip={node_ip}",
            "--v=2",
        ]  # fmt: skip
        if labels:
            argv.append("--node-labels=" + ",".join(f"{k}={v}" for k, v in sorted(labels.items())))
        argv += list(kubelet_args)
        node.kubelet = start_process(f"kubelet-{name}", argv, log_dir)
    except BaseException:
        node.close()
        raise
    return node
