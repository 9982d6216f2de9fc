"""Label and annotation keys under ``ix-gpu.io/`` — defined once, used by both processes.

The plugin publishes the node labels; the webhook turns the pod annotation ``ix-gpu.io/gpu-type``
into required node affinity on :data:`GPU_PRODUCT`. Keeping the keys here means the two can never
drift apart.
"""

from __future__ import annotations

import re

PREFIX = "ix-gpu.io"

# Node labels published by the device plugin (when labels are enabled).
GPU_PRODUCT = f"{PREFIX}/gpu.product"
GPU_COUNT = f"{PREFIX}/gpu.count"
GPU_MEMORY = f"{PREFIX}/gpu.memory"
"""Memory of one advertised device, in MiB."""
GPU_REPLICAS = f"{PREFIX}/gpu.replicas"

# Annotations and labels read or written by the webhook.
INJECT = f"{PREFIX}/inject"
"""Opt-out key: the value ``disabled`` on a namespace (annotation or label) or pod skips injection."""
INJECT_DISABLED = "disabled"
INJECTED = f"{PREFIX}/injected"
INJECTED_ITEMS = f"{PREFIX}/injected-items"
"""JSON record of what the webhook added to a template (see webhook.core.injection_record)."""
"""Status annotation ``<profile>[+<profile>]@<config-hash>`` recording what was injected."""
GPU_TYPE = f"{PREFIX}/gpu-type"
"""Pod annotation selecting GPU products (comma-separated) via required node affinity."""

# Facts about other components' keys that the webhook must respect.
MIRROR_POD = "kubernetes.io/config.mirror"
PSA_ENFORCE = "pod-security.kubernetes.io/enforce"

_INVALID_LABEL_CHARS = re.compile(r"[^A-Za-z0-9_.-]+")


def label_value(text: str) -> str:
    """Turn a free-form product name into a valid label value.

    Label values are at most 63 characters of ``[A-Za-z0-9_.-]`` starting and ending with an
    alphanumeric. ``Iluvatar BI-V150S`` becomes ``Iluvatar-BI-V150S``. The webhook applies the same
    function to the ``gpu-type`` annotation, so users may write either spelling.
    """
    value = _INVALID_LABEL_CHARS.sub("-", text.strip())[:63]
    return value.strip("-_.")
