"""The flags both node agents take, declared once: where the ix-config is and how devices are found.

``ix-gpu plugin`` (and its one-shot commands ``devices`` and ``cdi generate``) and ``ix-gpu dra``
read the same ix-config (one ConfigMap serves both on a node) from the same devices, so the flags
that say where they are mean the same in both and are spelled, defaulted and explained here.
Light on purpose: registering the CLI must not import a backend, pydantic or grpclib.
"""

from __future__ import annotations

import argparse

from ix_gpu.node.backends import BACKENDS  # light: no backend module is imported here
from ix_gpu.runtime.usage import set_env_name

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
    parser.add_argument("--backend", choices=BACKENDS, default="auto", help="device discovery (default auto)")
    parser.add_argument("--fake-devices", metavar="FILE", help="YAML device description for --backend fake")
    parser.add_argument(
        "--root", metavar="DIR", default="/", help="host root for /dev and /sys (devfs/ixml/nvml), default /"
    )
