"""Label and annotation keys under ``ix-gpu.io/`` — defined once, used by both processes.

The plugin publishes the node labels; the webhook turns the pod annotation ``ix-gpu.io/gpu-type``
into required node affinity on :data:`GPU_PRODUCT`. Keeping the keys, and the one function that
turns a GPU model name into the product label's value (:func:`gpu_product_value`), here means the
two can never drift apart.
"""

from __future__ import annotations

import re

from ix_gpu.devicemodel.vendors import VENDORS

PREFIX = "ix-gpu.io"

# Node labels published by the device plugin (when labels are enabled).
GPU_PRODUCT = f"{PREFIX}/gpu.product"
"""The bare model name, e.g. ``BI-V150`` (see :func:`gpu_product_value`)."""
GPU_VENDOR = f"{PREFIX}/gpu.vendor"
"""The vendor the product name starts with (``iluvatar``, ``nvidia``), when it names one."""
GPU_COUNT = f"{PREFIX}/gpu.count"
GPU_MEMORY = f"{PREFIX}/gpu.memory"
"""Memory of one advertised device, in MiB."""
GPU_REPLICAS = f"{PREFIX}/gpu.replicas"
PUBLISHED = (GPU_PRODUCT, GPU_VENDOR, GPU_COUNT, GPU_MEMORY, GPU_REPLICAS)
"""Every node label the plugin writes: what ``ix-gpu labels prune`` removes (nothing the operator set)."""
DEVICE_PLUGIN_CONFIG = f"{PREFIX}/device-plugin.config"
"""Set by the operator on a node: the name of the plugin config (a key of the plugin's ConfigMap)
that node's plugin uses, as NVIDIA's ``nvidia.com/device-plugin.config``."""
GPU_ALLOCATION = f"{PREFIX}/gpu.allocation"
"""Set by the operator on a node: which allocator hands out its GPUs, ``device-plugin`` (also when
absent) or ``dra`` (see :mod:`ix_gpu.node.allocator`). Not in :data:`PUBLISHED`: an
operator's choice survives ``ix-gpu labels prune``."""

# Annotations and labels read or written by the webhook.
INJECT = f"{PREFIX}/inject"
"""Opt-out key: the value ``disabled`` on a namespace (annotation or label) or pod skips injection."""
INJECT_DISABLED = "disabled"
INJECTED = f"{PREFIX}/injected"
"""Status annotation ``<profile>[+<profile>]@<config-hash>`` recording what was injected."""
INJECTED_ITEMS = f"{PREFIX}/injected-items"
"""JSON record of what the webhook added to a template (see webhook.core.injection_record)."""
GPU_TYPE = f"{PREFIX}/gpu-type"
"""Pod annotation selecting GPU models (comma-separated) via required node affinity on
:data:`GPU_PRODUCT`; each model goes through :func:`gpu_product_value`."""

# Facts about other components' keys that the webhook must respect.
MIRROR_POD = "kubernetes.io/config.mirror"
PSA_ENFORCE = "pod-security.kubernetes.io/enforce"

_INVALID_LABEL_CHARS = re.compile(r"[^A-Za-z0-9_.-]+")
_VENDOR_PREFIX = re.compile(
    r"^\s*(" + "|".join(re.escape(name) for name in VENDORS) + r")(?:[\s_-]+|$)", re.IGNORECASE
)


def label_value(text: str) -> str:
    """Turn free-form text into a valid label value.

    Label values are at most 63 characters of ``[A-Za-z0-9_.-]`` starting and ending with an
    alphanumeric: each run of other characters becomes one ``-``, then the value is cut to 63 and
    its ends trimmed. ``Iluvatar BI-V150S`` becomes ``Iluvatar-BI-V150S``.
    """
    value = _INVALID_LABEL_CHARS.sub("-", text.strip())[:63]
    return value.strip("-_.")


def split_vendor(product: str) -> tuple[str | None, str]:
    """``("iluvatar", "BI-V150")`` for ``Iluvatar BI-V150``: a leading vendor name (any case) and
    the model after it. ``(None, product)`` when the name starts with no known vendor, or is
    nothing but one."""
    match = _VENDOR_PREFIX.match(product)
    if match is None or not product[match.end() :].strip():
        return None, product
    return match.group(1).lower(), product[match.end() :]


def gpu_product_value(name: str) -> str:
    """The value of :data:`GPU_PRODUCT` for a GPU product or model name: the model without a
    leading vendor name, made a valid label value by :func:`label_value`.

    The one spelling both sides use: the plugin applies it to the name the management library
    reports (libixml's ``Iluvatar BI-V150``), the webhook to each model of the ``gpu-type``
    annotation. So ``BI-V150``, ``Iluvatar BI-V150`` and ``iluvatar-BI-V150`` all select the
    nodes labelled ``BI-V150``. Case is kept: label values compare case-sensitively.
    """
    # A name that is all vendor and punctuation ("Iluvatar ###") keeps the vendor rather than
    # becoming an empty value.
    return label_value(split_vendor(name)[1]) or label_value(name)
