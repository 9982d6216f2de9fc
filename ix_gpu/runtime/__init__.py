"""What both processes need that is not pure: the runtime support layer.

Kube API access (in-cluster or kubeconfig, token re-read on every use) and the list + watch caches
built on it, reload-by-content-digest
with last-good, JSON logging, one-line error text, usage errors and argparse types, the
connection-cap policy of both HTTP servers and the small guarded HTTP server for probe endpoints.
It sits below :mod:`ix_gpu.webhook` and :mod:`ix_gpu.plugin` and never imports either; it may
import :mod:`ix_gpu.devicemodel` and :mod:`ix_gpu.config`.
"""
