"""A real kubelet (build.sh's default version) whose pods really run, on tests/k8s/fake-cri: each
container is a host process in a private mount namespace, each pod has its own loopback address
(see fake-cri/main.go for the model). Started by ``k8s_tier.start_kubelet_node``.

- A pod with a ConfigMap, a Secret, a projected service-account token, a hostPath and an emptyDir,
  env from the spec and the downward API, and one ``iluvatar.com/gpu`` from the real
  ``ix-gpu plugin --backend fake``: its command prints what it sees, and the pod's log, read back
  through the apiserver (apiserver -> kubelet -> the CRI log file), shows the files, the env, the
  pod IP, the hostname and the allocated device nodes. The pod Succeeds with its pod IP reported.
  The CRI log file is in the CRI format; fake-cri recorded the devices and env the plugin's
  Allocate returned; a file the container writes into its emptyDir appears in the kubelet's volume
  directory and a file written there appears in the container; none of the container's mount
  points exist on the host.
- A long-running pod: an exec startup probe passes (ExecSync), then the kubelet's httpGet readiness
  probe reaches the process on the pod IP and marks the pod Ready; the probes' requests are in the
  container's stderr log; deleting the pod stops the process with SIGTERM (exit 143) and the
  kubelet removes the container.
- The image-name rule (an image without a command runs its name's last path component from PATH),
  runAsUser/runAsGroup/supplementalGroups, SIGKILL after the grace period for a process that
  ignores SIGTERM (exit 137), and a StartError for a command that is nowhere on PATH.
"""

from __future__ import annotations

import ipaddress
import json
import re
import secrets
import sys
import time
import urllib.request
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.k8s.k8s_tier import K8sBinaries, KubeAPI, KubeletNode, start_kubelet_node
from tests.k8s.plugin_inputs import RESOURCE, devices_yaml, seed_config
from tests.k8s.pods import get_pod
from tests.support.plugin_process import PluginProcess
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(300)

POD_CIDR = "127.0.77.0/24"
CRI_LOG_LINE = re.compile(r"^(\S+) (stdout|stderr) ([FP]) (.*)$")
SCRIPT = """set -e
echo "configmap: $(cat /etc/greeting/message.txt)"
echo "secret: $(cat /etc/secret-volume/password)"
echo "hostpath: $(cat /host-data/hello.txt)"
echo "env GREETING=$GREETING"
echo "env POD_IP=$POD_IP FAKE_CRI_POD_IP=$FAKE_CRI_POD_IP"
echo "env IX_VISIBLE_DEVICES=$IX_VISIBLE_DEVICES"
echo "token bytes: $(wc -c < /var/run/secrets/kubernetes.io/serviceaccount/token)"
echo "device nodes: $(ls /dev/iluvatar* /dev/itrctl | tr '\\n' ' ')"
echo "hostname: $(cat /proc/sys/kernel/hostname)"
echo "pwd: $(pwd)"
echo "to stderr" >&2
echo written > /scratch-space/out.txt
i=0
while [ ! -e /scratch-space/go ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
echo "emptyDir: $(cat /scratch-space/go)"
"""


@pytest.fixture(scope="module")
def kube_api(current_kube_api: KubeAPI) -> KubeAPI:
    """The current apiserver: a kubelet may not be newer than the apiserver it registers with."""
    return current_kube_api


@pytest.fixture
def node(k8s_binaries: K8sBinaries, kube_api: KubeAPI, k8s_log_dir: Path) -> Iterator[KubeletNode]:
    # The containers' PATH starts with this interpreter's directory, so pods can run it by name.
    path = f"{Path(sys.executable).parent}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    node = start_kubelet_node(k8s_binaries, kube_api, k8s_log_dir, pod_cidr=POD_CIDR, path=path)
    try:
        node.wait_ready()
        yield node
    finally:
        node.close()


def create(api: KubeAPI, path: str, body: dict[str, Any]) -> dict[str, Any]:
    status, reply = api.request("POST", path, body)
    assert status == 201, reply
    assert isinstance(reply, dict)
    return reply


def wait_phase(
    api: KubeAPI, node: KubeletNode, namespace: str, name: str, phases: set[str]
) -> dict[str, Any]:
    def reached() -> dict[str, Any] | None:
        pod = get_pod(api, namespace, name)
        return pod if pod is not None and pod.get("status", {}).get("phase") in phases else None

    result: dict[str, Any] = wait_until(
        reached,
        f"pod {namespace}/{name} in {sorted(phases)}",
        90,
        interval=0.25,
        process=node.kubelet,
        details=lambda: f"pod: {json.dumps(get_pod(api, namespace, name), indent=1)[-3000:]}",
    )
    return result


def records_of(node: KubeletNode, namespace: str, pod: str) -> list[dict[str, Any]]:
    return [
        r for r in node.container_records() if (r["pod"]["namespace"], r["pod"]["name"]) == (namespace, pod)
    ]


def only_record(node: KubeletNode, namespace: str, pod: str) -> dict[str, Any]:
    """The one container fake-cri ran for ``pod`` (a second means the kubelet restarted it)."""
    records = records_of(node, namespace, pod)
    assert len(records) == 1, json.dumps(records, indent=1)[-4000:]
    return records[0]


def check_cri_log(path: Path) -> list[tuple[str, str]]:
    """Every line of a CRI log file parses; returns (stream, text) pairs."""
    lines = path.read_text().splitlines()
    assert lines, f"{path} is empty"
    out = []
    for line in lines:
        match = CRI_LOG_LINE.match(line)
        assert match, f"not a CRI log line: {line!r}"
        datetime.fromisoformat(match[1])  # RFC 3339 with nanoseconds
        assert match[3] == "F", line
        out.append((match[2], match[4]))
    return out


def test_pod_runs_with_volumes_env_and_a_gpu(
    node: KubeletNode, kube_api: KubeAPI, namespace: str, tmp_path: Path, k8s_log_dir: Path
) -> None:
    plugin = PluginProcess(
        tmp_path / "plugin",
        node.plugin_dir,
        devices_yaml(),
        seed_config(),
        k8s_log_dir,
        name=f"ix-gpu-plugin-{node.name}",
    ).start()
    try:
        wait_until(
            lambda: (node.node() or {}).get("status", {}).get("allocatable", {}).get(RESOURCE) == "2",
            f"{RESOURCE}: 2 on {node.name}",
            60,
            interval=0.25,
            process=node.kubelet,
            details=plugin.log_tail,
        )
        host_data = tmp_path / "host-data"
        host_data.mkdir()
        (host_data / "hello.txt").write_text("hello from the host")
        ns = f"/api/v1/namespaces/{namespace}"
        create(kube_api, f"{ns}/serviceaccounts", {"metadata": {"name": "default"}})
        create(
            kube_api,
            f"{ns}/configmaps",
            {"metadata": {"name": "greeting"}, "data": {"message.txt": "hi, CM"}},
        )
        create(kube_api, f"{ns}/secrets", {"metadata": {"name": "pw"}, "stringData": {"password": "s3cret"}})
        name = f"runs-{secrets.token_hex(3)}"
        pod = {
            "metadata": {"name": name},
            "spec": {
                "nodeName": node.name,
                "restartPolicy": "Never",
                "serviceAccountName": "default",
                "containers": [
                    {
                        "name": "main",
                        "image": "registry.example/tools/busybox:1.36",
                        "command": ["sh", "-c", SCRIPT],
                        "workingDir": "/scratch-space",
                        "env": [
                            {"name": "GREETING", "value": "hello from env"},
                            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                        ],
                        "resources": {"limits": {RESOURCE: "1"}},
                        "volumeMounts": [
                            {"name": "greeting", "mountPath": "/etc/greeting", "readOnly": True},
                            {"name": "pw", "mountPath": "/etc/secret-volume", "readOnly": True},
                            {"name": "host", "mountPath": "/host-data"},
                            {"name": "work", "mountPath": "/scratch-space"},
                            {"name": "token", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"},
                        ],
                    }
                ],
                "volumes": [
                    {"name": "greeting", "configMap": {"name": "greeting"}},
                    {"name": "pw", "secret": {"secretName": "pw"}},
                    {"name": "host", "hostPath": {"path": str(host_data), "type": "Directory"}},
                    {"name": "work", "emptyDir": {}},
                    {
                        "name": "token",
                        "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]},
                    },
                ],
            },
        }
        mount_points = [
            "/etc/greeting",
            "/etc/secret-volume",
            "/host-data",
            "/scratch-space",
            "/dev/iluvatar0",
        ]
        on_host_before = {p: Path(p).exists() for p in mount_points}
        created = create(kube_api, f"{ns}/pods", pod)
        # The emptyDir is the kubelet's volume directory: the container's file shows up there, and
        # the file written there (the container waits for it) shows up in the container.
        uid = created["metadata"]["uid"]
        volume = node.root / "kubelet" / "pods" / uid / "volumes" / "kubernetes.io~empty-dir" / "work"
        wait_until(
            lambda: (volume / "out.txt").exists(),
            "the container's file in the emptyDir",
            90,
            interval=0.1,
            process=node.kubelet,
            details=lambda: json.dumps(get_pod(kube_api, namespace, name), indent=1)[-3000:],
        )
        assert (volume / "out.txt").read_text() == "written\n"
        (volume / "go").write_text("from the host")
        done = wait_phase(kube_api, node, namespace, name, {"Succeeded", "Failed"})
    finally:
        plugin.stop()

    state = done["status"]["containerStatuses"][0]["state"]
    assert done["status"]["phase"] == "Succeeded", json.dumps(done["status"], indent=1)
    assert state["terminated"]["exitCode"] == 0 and state["terminated"]["reason"] == "Completed", state
    pod_ip = done["status"]["podIP"]
    assert ipaddress.ip_address(pod_ip) in ipaddress.ip_network(POD_CIDR), pod_ip
    assert done["status"]["podIPs"] == [{"ip": pod_ip}]

    # The log as `kubectl logs` gets it: apiserver -> kubelet -> the CRI log file.
    status, log = kube_api.request("GET", f"{ns}/pods/{name}/log")
    assert status == 200, log
    print(f"kubectl logs {name}:\n{log}")
    assert isinstance(log, str)
    lines = log.splitlines()
    assert "configmap: hi, CM" in lines
    assert "secret: s3cret" in lines
    assert "hostpath: hello from the host" in lines
    assert "env GREETING=hello from env" in lines
    assert f"env POD_IP={pod_ip} FAKE_CRI_POD_IP={pod_ip}" in lines
    assert f"hostname: {name}" in lines
    assert "pwd: /scratch-space" in lines
    assert "to stderr" in lines
    assert "emptyDir: from the host" in lines
    token_bytes = next(line for line in lines if line.startswith("token bytes: "))
    assert int(token_bytes.split(": ")[1]) > 100, token_bytes

    # What fake-cri recorded: the devices and env of the plugin's Allocate.
    record = only_record(node, namespace, name)
    assert record["pod"]["uid"] == created["metadata"]["uid"]
    assert record["state"] == "CONTAINER_EXITED" and record["exit_code"] == 0
    env = dict(kv.split("=", 1) for kv in record["env"])
    visible = env["IX_VISIBLE_DEVICES"]
    assert visible and f"env IX_VISIBLE_DEVICES={visible}" in lines
    paths = sorted(d["container_path"] for d in record["devices"])
    assert "/dev/itrctl" in paths and any(p.startswith("/dev/iluvatar") for p in paths), record["devices"]
    assert all(d["host_path"] == d["container_path"] and d["permissions"] == "rw" for d in record["devices"])
    assert json.loads(env["FAKE_CRI_DEVICES"]) == record["devices"]
    assert f"device nodes: {' '.join(paths)} " in lines

    # The CRI log file itself, where the kubelet asked for it.
    log_path = Path(record["log_path"])
    assert log_path.is_relative_to(node.root / "pod-logs"), log_path
    entries = check_cri_log(log_path)
    assert ("stdout", "configmap: hi, CM") in entries
    assert ("stderr", "to stderr") in entries

    # No mount point was created on the host.
    assert {p: Path(p).exists() for p in mount_points} == on_host_before


def test_probe_reaches_the_pod_ip_and_delete_stops_the_process(
    node: KubeletNode, kube_api: KubeAPI, namespace: str
) -> None:
    name = f"serve-{secrets.token_hex(3)}"
    pod = {
        "metadata": {"name": name},
        "spec": {
            "nodeName": node.name,
            "terminationGracePeriodSeconds": 10,
            "containers": [
                {
                    "name": "http",
                    "image": "python:3.11",
                    # $(POD_IP) is expanded by the kubelet; python is found on the containers' PATH.
                    "command": [
                        Path(sys.executable).name,
                        "-u",
                        "-m",
                        "http.server",
                        "8080",
                        "--bind",
                        "$(POD_IP)",
                    ],
                    "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
                    # ExecSync: runs in the container's mount and UTS namespaces, with its env.
                    "startupProbe": {
                        "exec": {
                            "command": ["sh", "-c", 'test "$(cat /proc/sys/kernel/hostname)" = "$HOSTNAME"']
                        },
                        "periodSeconds": 1,
                        # Generous: on a loaded 2-core machine an exec probe (nsenter + sh) has
                        # taken over the default 1 s, and three failures restart the container
                        # (a second record, seen once in a full run).
                        "timeoutSeconds": 10,
                        "failureThreshold": 30,
                    },
                    "readinessProbe": {
                        "httpGet": {"path": "/", "port": 8080},
                        "periodSeconds": 1,
                        "timeoutSeconds": 5,
                    },
                }
            ],
        },
    }
    create(kube_api, f"/api/v1/namespaces/{namespace}/pods", pod)

    def ready() -> dict[str, Any] | None:
        current = get_pod(kube_api, namespace, name)
        conditions = (current or {}).get("status", {}).get("conditions", [])
        return current if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions) else None

    start = time.monotonic()
    running: dict[str, Any] = wait_until(
        ready,
        f"pod {name} Ready",
        90,
        interval=0.25,
        process=node.kubelet,
        details=lambda: json.dumps(get_pod(kube_api, namespace, name), indent=1)[-3000:],
    )
    print(f"pod Ready {time.monotonic() - start:.1f}s after creation")
    assert running["status"]["phase"] == "Running"
    pod_ip = running["status"]["podIP"]
    assert ipaddress.ip_address(pod_ip) in ipaddress.ip_network(POD_CIDR), pod_ip
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with direct.open(f"http://{pod_ip}:8080/", timeout=10) as resp:
        assert resp.status == 200
    record = only_record(node, namespace, name)
    assert record["state"] == "CONTAINER_RUNNING" and record["pid"] > 0
    assert Path(f"/proc/{record['pid']}").exists()

    # The process logs each request on stderr: the kubelet's probes and ours. (The kubelet deletes
    # the log file with the container, so read it now.)
    def requests_logged() -> list[str] | None:
        entries = check_cri_log(Path(record["log_path"]))
        hits = [text for stream, text in entries if stream == "stderr" and '"GET / HTTP/1.1" 200' in text]
        return hits if len(hits) >= 2 else None

    wait_until(requests_logged, "two requests in the container's log", 30, interval=0.25)

    status, reply = kube_api.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}")
    assert status == 200, reply
    wait_until(
        lambda: get_pod(kube_api, namespace, name) is None,
        f"pod {name} deleted by the kubelet",
        60,
        interval=0.25,
        process=node.kubelet,
    )
    record = only_record(node, namespace, name)
    assert record["state"] == "CONTAINER_EXITED"
    assert record["exit_code"] == 128 + 15, record  # SIGTERM, python's default handler
    assert not Path(f"/proc/{record['pid']}").exists()
    assert record["removed"], record


def test_image_rule_user_stop_timeout_and_start_error(
    node: KubeletNode, kube_api: KubeAPI, namespace: str
) -> None:
    ns = f"/api/v1/namespaces/{namespace}"

    def pod(name: str, container: dict[str, Any], **spec: Any) -> dict[str, Any]:
        return {
            "metadata": {"name": name},
            "spec": {"nodeName": node.name, "containers": [{"name": "c", **container}], **spec},
        }

    # No command: the image's last path component is the command, found on the containers' PATH.
    create(
        kube_api,
        f"{ns}/pods",
        pod(
            "image",
            {"image": "registry.example/tools/ix-gpu:0.1.0", "args": ["--version"]},
            restartPolicy="Never",
        ),
    )
    # SIGTERM ignored: SIGKILL after the grace period.
    stubborn = {
        "image": "busybox",
        "command": ["sh", "-c", "trap '' TERM; echo trapped; while true; do sleep 0.2; done"],
    }
    create(kube_api, f"{ns}/pods", pod("stubborn", stubborn, terminationGracePeriodSeconds=2))
    # runAsUser/runAsGroup/supplementalGroups are honoured.
    user = {"image": "busybox", "command": ["sh", "-c", "id -u; id -g; id -G"]}
    sc = {"runAsUser": 1000, "runAsGroup": 3000, "supplementalGroups": [4000]}
    create(kube_api, f"{ns}/pods", pod("user", user, restartPolicy="Never", securityContext=sc))
    # An image whose command is nowhere on PATH: StartContainer fails.
    create(
        kube_api,
        f"{ns}/pods",
        pod("missing", {"image": "registry.example/no-such-tool:1"}, restartPolicy="Never"),
    )

    image = wait_phase(kube_api, node, namespace, "image", {"Succeeded", "Failed"})
    assert image["status"]["phase"] == "Succeeded", image["status"]
    status, log = kube_api.request("GET", f"{ns}/pods/image/log")
    assert status == 200 and isinstance(log, str) and log.startswith("ix-gpu "), log
    (record,) = records_of(node, namespace, "image")
    assert record["argv"] == ["ix-gpu", "--version"], record["argv"]

    wait_phase(kube_api, node, namespace, "user", {"Succeeded"})
    status, log = kube_api.request("GET", f"{ns}/pods/user/log")
    assert status == 200 and isinstance(log, str), log
    uid, gid, groups = log.splitlines()
    assert (uid, gid, set(groups.split())) == ("1000", "3000", {"3000", "4000"}), log

    missing = wait_phase(kube_api, node, namespace, "missing", {"Succeeded", "Failed"})
    terminated = missing["status"]["containerStatuses"][0]["state"]["terminated"]
    assert missing["status"]["phase"] == "Failed", missing["status"]
    assert terminated["reason"] == "StartError" and terminated["exitCode"] == 128, terminated
    assert '"no-such-tool": executable file not found in PATH' in terminated["message"], terminated

    wait_phase(kube_api, node, namespace, "stubborn", {"Running"})
    wait_until(
        lambda: kube_api.request("GET", f"{ns}/pods/stubborn/log")[1] == "trapped\n",
        "the stubborn container's trap",
        30,
        interval=0.25,
    )
    start = time.monotonic()
    status, reply = kube_api.request("DELETE", f"{ns}/pods/stubborn")
    assert status == 200, reply
    wait_until(
        lambda: get_pod(kube_api, namespace, "stubborn") is None, "pod stubborn gone", 60, interval=0.25
    )
    took = time.monotonic() - start
    (record,) = records_of(node, namespace, "stubborn")
    assert record["exit_code"] == 128 + 9, record  # SIGKILL
    assert took >= 2, f"deleted after {took:.1f}s, before the 2s grace period"
    print(f"stubborn pod gone {took:.1f}s after DELETE (grace period 2s)")
