"""``ix-gpu status``: the cluster's GPUs as an operator asks about them (nodes, chips, health, who
holds each, what is free), read with the user's kubeconfig. It reads the API and the device
plugins' /metrics; it imports no node agent and no webhook code (the import rules in
tests/test_layout.py)."""

DEFAULT_RESOURCE = "iluvatar.com/gpu"
DEFAULT_DRIVER = "gpu.iluvatar.com"
DEFAULT_NAMESPACE = "ix-gpu-system"
"""Where the README's ``helm install`` puts the chart."""
DEFAULT_SELECTOR = "app.kubernetes.io/name=ix-gpu,app.kubernetes.io/component=device-plugin"
"""The labels the chart puts on its device-plugin pods (``ix-gpu.plugin.selectorLabels``), less the
release's name: the README's release and the tests' are named differently, and what makes a pod
the plugin is its namespace, its DaemonSet and the ServiceAccount the release binds
(:mod:`ix_gpu.status.trust`), not its labels."""
