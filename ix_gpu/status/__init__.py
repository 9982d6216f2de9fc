"""``ix-gpu status``: the cluster's GPUs as an operator asks about them (nodes, chips, health, who
holds each, what is free), read with the user's kubeconfig. It reads the API and the device
plugins' /metrics; it imports no node agent and no webhook code (the import rules in
tests/test_layout.py)."""
