"""The node agents' common start-up: the flags both take, declared once, and what they start
alike: the ix-config (one file, or the named config the node's label picks), its sharing plan, the
discovery backend and cluster access.

``ix-gpu plugin`` (and its one-shot commands ``devices`` and ``cdi generate``) and ``ix-gpu dra``
read the same ix-config (one ConfigMap serves both on a node) from the same devices, so the flags
that say where they are mean the same in both and are spelled, defaulted and explained here;
:func:`start_node` starts them the same way, and :class:`AgentKind` says the little that differs.
Each agent then adds only what is its own (the plugin's kubelet registration and config reload,
DRA's slices and claims). Light on purpose: registering the CLI must not import a backend,
pydantic or grpclib, so everything heavy is imported inside the functions.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from ix_gpu.node.backends import BACKENDS  # light: no backend module is imported here
from ix_gpu.process.usage import UsageError, set_env_name

if TYPE_CHECKING:
    from ix_gpu.config.plugin_runtime import RuntimeConfig
    from ix_gpu.kube.apiserver import ApiServer
    from ix_gpu.node.backends.base import Backend
    from ix_gpu.node.devices.sharing import SharingPlan
    from ix_gpu.node.node_config import NodeLabelReader

DEFAULT_CONFIG = "/ixconfig/ix-config"  # = ix_gpu.config.plugin_config.DEFAULT_PATH, without pydantic
"""Where the chart (and the Iluvatar device plugin's DaemonSet) mounts the ix-config."""
PLUGIN_CONFIG_ENV = "IX_GPU_PLUGIN_CONFIG"
"""``--config`` of the node agents; IX_GPU_CONFIG is the webhook's config (``webhook``, ``mutate``)."""


def add_device_flags(parser: argparse.ArgumentParser, config_applies: str = "", picked: str = "") -> None:
    """``--config``, ``--default-config``, ``--backend``, ``--fake-devices`` and ``--root``.
    ``config_applies``: what of the ix-config the command reads, when not all of it; ``picked``:
    when the label's choice takes effect, when that differs (both said in ``--config``'s help)."""
    config = parser.add_argument(
        "--config",
        metavar="PATH",
        help=f"the ix-config file{config_applies} (default {DEFAULT_CONFIG} when it exists, else "
        "built-in defaults), or a directory of named configs (a mounted ConfigMap) from which the node "
        f"label ix-gpu.io/device-plugin.config picks one{picked}",
    )
    set_env_name(config, PLUGIN_CONFIG_ENV)
    parser.add_argument(
        "--default-config",
        metavar="NAME",
        help="with a config directory: the config for nodes without the label (default: the one named "
        "'default', else the only one)",
    )
    _add_vendor_flags(parser)
    parser.add_argument("--backend", choices=BACKENDS, default="auto", help="device discovery (default auto)")
    parser.add_argument("--fake-devices", metavar="FILE", help="YAML device description for --backend fake")
    parser.add_argument(
        "--root", metavar="DIR", default="/", help="host root for /dev and /sys (devfs/ixml/nvml), default /"
    )


VENDOR_FLAGS = {"splitboard": "SPLIT_BOARD", "usevolcano": "USE_VOLCANO", "reset_gpu": "RESET_GPU"}
# = ix_gpu.config.plugin_flags.VENDOR_FLAGS, without pydantic
_VENDOR_FLAG_HELP = {
    "splitboard": "every chip a device (true) or one device per board",
    "usevolcano": "bind the chips Volcano's scheduler chose (iluvatar.com/DevVolcano)",
    "reset_gpu": "reset an allocation's chips before the pod gets them",
}
_GO_TRUE = ("1", "t", "T", "TRUE", "true", "True")
_GO_FALSE = ("", "0", "f", "F", "FALSE", "false", "False")


def vendor_bool(text: str) -> bool:
    """A boolean as the Iluvatar plugin parses its flags and variables (Go's ``strconv.ParseBool``,
    where an empty variable means false)."""
    if text in _GO_TRUE:
        return True
    if text in _GO_FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _add_vendor_flags(parser: argparse.ArgumentParser) -> None:
    """The Iluvatar plugin's ``flags`` as flags and variables of their own (its spelling, its
    variables: a DaemonSet migrated from it keeps them); they win over the ix-config's."""
    for key, variable in VENDOR_FLAGS.items():
        action = parser.add_argument(
            f"--{key}",
            dest=key,
            type=vendor_bool,
            nargs="?",
            const=True,
            default=None,
            metavar="BOOL",
            help=f"flags.{key} of the ix-config, overriding it: {_VENDOR_FLAG_HELP[key]} "
            "(default: the ix-config's)",
        )
        set_env_name(action, variable)


def vendor_overrides(args: argparse.Namespace) -> dict[str, bool]:
    """The Iluvatar flags given on the command line or in the environment."""
    return {key: getattr(args, key) for key in VENDOR_FLAGS if getattr(args, key, None) is not None}


def add_kubeconfig_flag(parser: argparse.ArgumentParser, needed_for: str) -> None:
    """``--kubeconfig``: how an agent outside a Pod reaches the API server (``needed_for``: what for)."""
    parser.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help=f"{needed_for}: a kubeconfig whose user has a token, a tokenFile or a client certificate "
        "(default: in-cluster)",
    )


def check_device_args(args: argparse.Namespace) -> Path | None:
    """The usage errors of :func:`add_device_flags`' flags (exit 2 with one line), before anything
    starts; the config directory, when ``--config`` names one."""
    if args.backend == "fake" and not args.fake_devices:
        raise UsageError("--backend fake needs --fake-devices FILE")
    if args.fake_devices and args.backend != "fake":
        raise UsageError("--fake-devices only applies to --backend fake")
    if args.fake_devices and not Path(args.fake_devices).is_file():
        raise UsageError(f"--fake-devices {args.fake_devices}: no such file")
    config_dir = Path(args.config) if args.config and Path(args.config).is_dir() else None
    if args.default_config and config_dir is None:
        raise UsageError("--default-config needs --config DIR (a directory of named configs)")
    return config_dir


def start_backend(args: argparse.Namespace) -> Backend:
    """The backend ``--backend`` names; :class:`~ix_gpu.node.backends.base.BackendError` when the
    environment (not the command line) is wrong, e.g. no management library."""
    if args.backend == "fake":
        from ix_gpu.node.fake_devices_file import fake_backend

        return fake_backend(Path(args.fake_devices))
    from ix_gpu.node.backends import make_backend

    return make_backend(args.backend, root=Path(args.root))


class LoadedConfig(NamedTuple):
    config: RuntimeConfig
    path: Path | None
    """None: the built-in defaults."""
    content: bytes | None
    """What ``config`` was parsed from, so a reload starts only when the file changes."""


def chosen_config(directory: Path, label: str | None, default: str | None) -> Path:
    """The named config of ``directory`` that ``label`` (the node's config label; None: none) or
    the default picks."""
    from ix_gpu.node.node_config import choose, named_configs

    try:
        names = named_configs(directory)
    except OSError as exc:
        raise UsageError(f"--config {directory}: {exc.strerror or exc}") from None
    choice = choose(names, label, default)
    if choice.name is None:
        raise UsageError(f"--config {directory}: {choice.reason}")
    return names[choice.name]


def load_config(path: Path | None, overrides: dict[str, bool] | None = None) -> LoadedConfig:
    """The ix-config's runtime form, validated in a child (:mod:`ix_gpu.node.config_loader`), with
    the vendor flags ``overrides`` applied. ``path`` None: :data:`DEFAULT_CONFIG` when it exists,
    else the built-in defaults."""
    from ix_gpu.config.input_files import CONFIG_MAX_BYTES, ConfigError, read_capped
    from ix_gpu.node.config_loader import DEFAULTS_SOURCE, load_runtime_config

    try:
        if path is None and not Path(DEFAULT_CONFIG).exists():
            return LoadedConfig(load_runtime_config(None, DEFAULTS_SOURCE, overrides), None, None)
        path = path or Path(DEFAULT_CONFIG)
        content = read_capped(path, CONFIG_MAX_BYTES)
        return LoadedConfig(load_runtime_config(content, str(path), overrides), path, content)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


def connect(kubeconfig: str | None) -> ApiServer | None:
    """``kubeconfig``'s apiserver, else the in-cluster one, else None. Imported only when needed:
    urllib.request and ssl cost an agent memory."""
    from ix_gpu.kube.apiserver import ApiServer
    from ix_gpu.kube.kubeconfig import read_kubeconfig

    if kubeconfig is not None:
        try:
            return read_kubeconfig(kubeconfig)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    return ApiServer.in_cluster()


NOT_IN_CLUSTER = "not in a cluster (no KUBERNETES_SERVICE_HOST or token); give --kubeconfig"


@dataclass(frozen=True)
class AgentKind:
    """What differs between the two agents' start-ups; everything else is :func:`start_node`."""

    name: str
    """``plugin`` or ``dra``: the logger (``ix_gpu.<name>``) and the start-up threads' name."""
    node_name: str | None
    api_required: bool = False
    """The agent cannot run without the API server (DRA: claims and slices live there)."""
    api_early: bool = False
    """Connect before the config is read (the flags already say cluster access is needed)."""
    api_for: Callable[[RuntimeConfig], bool] | None = None
    """Connect after the config is read when this says the config needs it (node labels)."""
    preload: tuple[str, ...] = ()
    """Modules imported without OpenSSL while the child starts (:mod:`ix_gpu.process.openssl_free`)."""


class NodeStart(NamedTuple):
    """What both agents run on, ready: the config and its sharing plan, the backend, the API."""

    loaded: LoadedConfig
    sharing: SharingPlan
    """The config's sharing resolved for this node's vendor, once (every consumer reads this)."""
    backend: Backend
    api: ApiServer | None
    config_dir: Path | None
    node_reader: NodeLabelReader | None
    """Follows the node's config label (``--config DIR``); None otherwise or without access."""
    label: str | None
    """The config label read at start (None: unlabelled, unreadable, or no directory)."""


def start_node(
    args: argparse.Namespace, kind: AgentKind, import_server: Callable[[], object]
) -> NodeStart | None:
    """Config, backend and cluster access made ready side by side; None (after logging why) when
    the backend cannot start, which is the environment's fault: exit 1.

    The config and the fake backend's devices file are validated in one child interpreter
    (:func:`ix_gpu.process.isolated.shared_child`; it imports pydantic once, about 0.4 s), asked
    from two threads, while this thread imports the serving side (``import_server``). A directory
    of configs needs the node's label to pick one, so cluster access comes first then."""
    from concurrent.futures import ThreadPoolExecutor

    from ix_gpu.node.backends.base import BackendError
    from ix_gpu.node.devices.sharing import plan_sharing
    from ix_gpu.node.gpu_reset import SerializedBackend, reset_problem
    from ix_gpu.process.isolated import shared_child
    from ix_gpu.process.openssl_free import import_without_openssl

    log = logging.getLogger(f"ix_gpu.{kind.name}")
    config_dir = check_device_args(args)
    with shared_child():
        if kind.preload:
            import_without_openssl(*kind.preload)
        with ThreadPoolExecutor(2, thread_name_prefix=f"{kind.name}-start") as pool:
            starting = pool.submit(start_backend, args)
            api = _early_api(args, kind, config_dir)
            reader = _node_config_reader(api, kind.node_name, config_dir, log)
            label = reader.value() if reader is not None else None
            path = chosen_config(config_dir, label, args.default_config) if config_dir else None
            given = path or (Path(args.config) if args.config else None)
            loading = pool.submit(load_config, given, vendor_overrides(args))
            import_server()
            loaded = loading.result()
            if api is None and kind.api_for is not None and kind.api_for(loaded.config):
                api = connect(None)
            try:
                backend: Backend = SerializedBackend(starting.result())
            except BackendError as exc:
                log.error("cannot start: backend %s: %s", args.backend, exc)
                return None
    if problem := reset_problem(loaded.config, backend):
        backend.close()
        raise UsageError(problem)
    sharing = plan_sharing(loaded.config, backend.vendor.resource_name)
    for note in sharing.notes:
        log.warning("config %s: %s", loaded.path or "(built-in defaults)", note)
    return NodeStart(loaded, sharing, backend, api, config_dir, reader, label)


def _early_api(args: argparse.Namespace, kind: AgentKind, config_dir: Path | None) -> ApiServer | None:
    if not (kind.api_required or kind.api_early or config_dir is not None):
        return None
    api = connect(args.kubeconfig)
    if api is None and kind.api_required:
        raise UsageError(NOT_IN_CLUSTER)
    return api


def _node_config_reader(
    api: ApiServer | None, node_name: str | None, config_dir: Path | None, log: logging.Logger
) -> NodeLabelReader | None:
    """What follows the node's config label, when ``--config`` is a directory of named configs."""
    if config_dir is None:
        return None
    if api is None or not node_name:
        log.warning(
            "--config %s is a directory of configs, but without NODE_NAME and cluster access the node "
            "label cannot be read: the default config applies",
            config_dir,
        )
        return None
    from ix_gpu.node.node_config import FIRST_ANSWER_WAIT, NodeLabelReader

    return NodeLabelReader(api, node_name).start_and_wait(FIRST_ANSWER_WAIT)
