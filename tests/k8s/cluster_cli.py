"""The mini cluster from the command line (``python -m tests.k8s.cluster``, see tests/k8s/README.md):
``up`` starts a detached supervisor (``serve``, its own session) that owns every process and
stops them all on SIGTERM; ``DIR/state.json`` holds the pids, ports and paths; ``down`` signals
the supervisor and, should it be gone, kills the recorded pids; ``status`` and ``chart-values``
read the state.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from tests.k8s import host_settings, real_nodes
from tests.k8s.chart_values import chart_values, real_node_chart_values, write_chart_inputs
from tests.k8s.cluster import (
    CLI_CIDR_OCTET,
    DEFAULT_DIR,
    SEED_004_CONFIG,
    MiniCluster,
    host_address,
    node_specs,
)
from tests.k8s.real_nodes import Images
from tests.support.net import free_port


def _state_path(work_dir: Path) -> Path:
    return work_dir / "state.json"


def _read_state(work_dir: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads(_state_path(work_dir).read_text())
    except (OSError, ValueError):
        return None
    return data


def _write_state(work_dir: Path, state: dict[str, Any]) -> None:
    tmp = _state_path(work_dir).with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=1))
    tmp.replace(_state_path(work_dir))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def serve(
    work_dir: Path,
    plugin_config: str | None,
    webhook: bool = False,
    plugin_mode: str = "process",
    node_ip: str = "127.0.0.1",
    runtime: str = "fake-cri",
    kwok_nodes: int = 0,
) -> int:
    """The supervisor: start the cluster, record it, hold it until SIGTERM/SIGINT, then stop it."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    cluster = MiniCluster(
        work_dir,
        nodes=node_specs(CLI_CIDR_OCTET),
        plugin_config=plugin_config,
        plugin_mode=plugin_mode,
        node_ip=node_ip,
        runtime=runtime,
        kwok_nodes=kwok_nodes,
    )
    state: dict[str, Any] = {"supervisor": os.getpid(), "status": "starting", "runtime": runtime}
    _write_state(work_dir, state)
    try:
        cluster.start()
        if webhook:
            cluster.install_webhook()
    except BaseException as err:  # reported to `up` through the state file
        _write_state(work_dir, {**state, "status": "failed", "error": f"{type(err).__name__}: {err}"})
        return 1
    _write_state(work_dir, {**state, **cluster.state(), "status": "running"})
    try:
        while not stop.wait(2):
            dead = [name for name, p in cluster.processes().items() if not p.alive()]
            if dead:
                _write_state(work_dir, {**state, **cluster.state(), "status": "running", "exited": dead})
    finally:
        _write_state(work_dir, {**state, **cluster.state(), "status": "stopping"})
        cluster.stop()
        _write_state(work_dir, {**state, "status": "stopped"})
    return 0


def up(
    work_dir: Path,
    plugin_config: str | None,
    timeout_s: float,
    webhook: bool = False,
    plugin_mode: str = "process",
    node_ip: str = "127.0.0.1",
    runtime: str = "fake-cri",
    kwok_nodes: int = 0,
) -> int:
    state = _read_state(work_dir)
    if state and state.get("status") in ("starting", "running") and _alive(int(state["supervisor"])):
        print(f"a cluster already runs from {work_dir} (supervisor {state['supervisor']})", file=sys.stderr)
        if state.get("kubeconfig"):
            print(state["kubeconfig"])
        return 1
    work_dir.mkdir(parents=True, exist_ok=True)
    _state_path(work_dir).unlink(missing_ok=True)
    args = [sys.executable, "-m", "tests.k8s.cluster", "serve", "--dir", str(work_dir)]
    config_file = None
    if plugin_config is not None:
        config_file = work_dir / "ix-config"
        config_file.write_text(plugin_config)
        args += ["--plugin-config", str(config_file)]
    else:
        args.append("--no-plugins")
    if webhook:
        args.append("--webhook")
    args += ["--plugin-mode", plugin_mode, "--node-ip", node_ip, "--runtime", runtime]
    args += ["--kwok-nodes", str(kwok_nodes)]
    (work_dir / "logs").mkdir(parents=True, exist_ok=True)
    with open(work_dir / "logs" / "supervisor.log", "ab") as log:
        supervisor = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # detached: survives this command and the terminal's signals
            cwd=Path(__file__).resolve().parents[2],
        )
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        state = _read_state(work_dir) or {}
        if state.get("status") == "running":
            print(
                f"mini cluster {state['version']} up in {time.monotonic() - start:.1f}s: "
                f"apiserver {state['apiserver']}, logs {state['logs']}",
                file=sys.stderr,
            )
            print(f"  export KUBECONFIG={state['kubeconfig']}; kubectl get nodes", file=sys.stderr)
            print(f"  stop: {sys.executable} -m tests.k8s.cluster down --dir {work_dir}", file=sys.stderr)
            print(state["kubeconfig"])
            return 0
        if state.get("status") == "failed" or supervisor.poll() is not None:
            supervisor.wait(60)
            print(
                f"the cluster did not start: {state.get('error')}; logs in {work_dir / 'logs'}",
                file=sys.stderr,
            )
            return 1
        time.sleep(0.25)
    print(f"the cluster did not start within {timeout_s:g}s; logs in {work_dir / 'logs'}", file=sys.stderr)
    down(work_dir)
    return 1


def down(work_dir: Path) -> int:
    state = _read_state(work_dir)
    if state is None:
        restored = host_settings.restore()  # a run that died before it wrote its state
        print(
            f"no cluster in {work_dir}{f'; host settings put back: {restored}' if restored else ''}",
            file=sys.stderr,
        )
        return 0
    supervisor = int(state.get("supervisor", 0))
    if supervisor and _alive(supervisor):
        os.kill(supervisor, signal.SIGTERM)
        deadline = time.monotonic() + 90
        while _alive(supervisor) and time.monotonic() < deadline:
            time.sleep(0.2)
    # Whatever the supervisor left (it died, or did not finish in time): the recorded processes.
    for pid in state.get("pids", {}).values():
        if _alive(int(pid)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
    for path in [*state.get("node_roots", {}).values(), state.get("etcd_data")]:
        if path:
            shutil.rmtree(path, ignore_errors=True)
    if state.get("runtime") == "containerd":  # namespaces, links, iptables, cgroups, shims
        real_nodes.cleanup(kube_proxy=Path(state["kube_proxy"]) if state.get("kube_proxy") else None)
    shutil.rmtree(work_dir, ignore_errors=True)
    print(f"mini cluster in {work_dir} stopped", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.k8s.cluster", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in (
        ("up", "start the cluster (detached); prints the kubeconfig path"),
        ("down", "stop the cluster and remove DIR"),
        ("status", "print DIR/state.json"),
        ("chart-values", "print values for `helm install` of charts/ix-gpu on this cluster"),
        ("serve", "the supervisor that `up` starts (foreground)"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("--dir", type=Path, default=DEFAULT_DIR, help=f"state, logs (default {DEFAULT_DIR})")
        if name in ("up", "serve"):
            p.add_argument("--plugin-config", type=Path, help="the plugins' ix-config (default: seed 004's)")
            p.add_argument("--no-plugins", action="store_true", help="start no device plugin")
            p.add_argument(
                "--webhook",
                action="store_true",
                help="also run `ix-gpu webhook`, registered through a Service",
            )
            p.add_argument(
                "--plugin-mode",
                choices=("process", "daemonset"),
                default="process",
                help="the plugin as a host process per node, or as DaemonSet pods (run by the kubelets)",
            )
            p.add_argument(
                "--runtime",
                choices=("fake-cri", "containerd"),
                default="fake-cri",
                help="fake-cri: pods are host processes, each node runs the plugin (the fast tier); "
                "containerd: real containers on real nodes with CNI and kube-proxy, no ix-gpu component "
                "(`helm install` with the values `chart-values` prints)",
            )
            p.add_argument(
                "--node-ip",
                default="127.0.0.1",
                help="the kubelets' address and the Nodes' InternalIP; `host`: this machine's first global "
                "IPv4 address, so hostNetwork pods can be Service endpoints (the kubelets then allow "
                "anonymous requests on it)",
            )
            p.add_argument(
                "--kwok-nodes",
                type=int,
                default=0,
                metavar="N",
                help="also N simulated GPU nodes (kwok, built from the module proxy): iluvatar.com/gpu "
                "capacity and the plugin's node labels, products mixed; every 4th a DRA node with its "
                "ResourceSlice. Pods bound there reach Running through kwok's stages",
            )
        if name == "up":
            p.add_argument("--timeout", type=float, default=300, help="seconds to wait for the cluster")
    args = parser.parse_args(argv)
    work_dir: Path = args.dir.resolve()
    if args.command in ("up", "serve"):
        config = (
            None
            if args.no_plugins or args.runtime == "containerd"
            else (args.plugin_config.read_text() if args.plugin_config else SEED_004_CONFIG)
        )
        if args.runtime == "containerd" and (args.webhook or args.plugin_config):
            parser.error("--runtime containerd starts no ix-gpu component: the chart installs them")
        node_ip = args.node_ip
        if node_ip == "host":
            node_ip = host_address()
            if node_ip is None:
                parser.error("--node-ip host: this machine has no global IPv4 address")
        if args.kwok_nodes < 0:
            parser.error("--kwok-nodes must be 0 or more")
        if args.command == "up":
            return up(
                work_dir,
                config,
                args.timeout,
                args.webhook,
                args.plugin_mode,
                node_ip,
                args.runtime,
                args.kwok_nodes,
            )
        return serve(work_dir, config, args.webhook, args.plugin_mode, node_ip, args.runtime, args.kwok_nodes)
    if args.command == "down":
        return down(work_dir)
    state = _read_state(work_dir)
    if args.command == "chart-values":
        if not state or state.get("status") != "running":
            print(f"no running cluster in {work_dir}", file=sys.stderr)
            return 1
        if state.get("runtime") == "containerd":
            images = Images(
                **{k: Path(v) if k.endswith("archive") else v for k, v in state["images"].items()}
            )
            print(yaml.safe_dump(real_node_chart_values(images), sort_keys=False), end="")
            return 0
        devices, driver_root = write_chart_inputs(work_dir, node_specs(CLI_CIDR_OCTET))
        values = chart_values(str(state["apiserver"]), devices, driver_root, free_port())
        print(yaml.safe_dump(values, sort_keys=False), end="")
        return 0
    print(json.dumps(state, indent=1))
    return 0
